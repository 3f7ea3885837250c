"""``install()``: route stock PyTorch CPU entry points to the batch-invariant kernels.

Each kernel becomes a custom op ``{namespace}::<name>`` (so the profiler names it), the aten ops
are re-registered on the CPU dispatch key to call those custom ops, and the composite entry
points of ``bi_props.ops`` are swapped. Like upstream batch-invariant switches it is one-way for
the process: there is no uninstall, so tests install it in a subprocess.

Autograd: ops with an aten derivative formula (mm, addmm, bmm, mv, dot, sum, mean, _softmax,
_log_softmax) keep it, since the override sits below autograd (argmax has none). rms_norm,
layer_norm, embedding and the swapped composites are forward-only once installed (inputs may
require grad; PyTorch warns if one backpropagates; embedding's backward under ``install()`` is
untested).
``KERNEL_PREFIX`` and ``ROUTES`` describe the default namespace; ``routes(ns)`` any other.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import torch

from .route import KernelRoute

NAMESPACE = "bi_props_cpu"
KERNEL_PREFIX = f"{NAMESPACE}::"

_LIBRARIES: list[torch.library.Library] = []  # Library objects unregister when collected
_INSTALLED: list[str] = []
SWAPPED: dict[str, Callable[..., Any]] = {}
"""bi_props.ops attribute name -> the batch-invariant function installed in its place."""


def kernel_routes() -> tuple[KernelRoute, ...]:
    """Every kernel module's ``ROUTES`` (route.py), in module order: a new kernel is a record
    in its module, found here without a table to edit."""
    import importlib
    import pkgutil
    from pathlib import Path

    found: list[KernelRoute] = []
    here = [str(Path(__file__).parent)]
    for info in sorted(pkgutil.iter_modules(here), key=lambda m: m.name):
        if info.name in ("register", "route"):
            continue
        module = importlib.import_module(f"{__package__}.{info.name}")
        found.extend(getattr(module, "ROUTES", ()))
    return tuple(found)


KERNELS = kernel_routes()


def routes(namespace: str = NAMESPACE) -> dict[str, tuple[str, ...]]:
    """Catalogue op -> the ``{namespace}::`` profiler events, one of which must appear."""
    out: dict[str, tuple[str, ...]] = {}
    for route in KERNELS:
        for op in route.ops:
            out[op] = (*out.get(op, ()), f"{namespace}::{route.name}")
    return out


ROUTES: dict[str, tuple[str, ...]] = routes()

SWAPPED_OPS: dict[str, str] = {
    op: route.composite for route in KERNELS if route.composite for op in route.ops
}
"""Catalogue op -> the ``bi_props.ops`` composite the enabled target swaps for its kernel (the
CPU target's identity evidence reads it)."""


def _linear() -> Callable[..., Any]:
    def linear(input, weight, bias=None):
        """input @ weight.T + bias with the bias added in float32 before the one rounding
        (addmm on the rows flattened); without a bias, matmul (routed to mm/bmm/mv)."""
        if bias is None or input.dim() == 0:
            return torch.matmul(input, weight.t())
        leading = math.prod(input.shape[:-1])  # explicit: -1 is ambiguous when K = 0
        rows = input if input.dim() == 2 else input.reshape(leading, input.shape[-1])
        out = torch.addmm(bias, rows, weight.t())  # aten's autograd formula, then the kernel
        return out.reshape(*input.shape[:-1], weight.shape[0])

    return linear


# -- dtypes outside the kernels' domain: the stock kernel, so the switch changes no contract --

KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
"""The dtypes every kernel here takes. A call with a tensor of another dtype (integer, bool,
complex) runs the stock kernel the override replaced, so the switch changes no contract there:
the stock op's error (a NotImplementedError for an integer softmax) or its result (integer
reductions are exact in any order, hence batch-invariant anyway). The parity property draws
those dtypes to check it (model.case.PARITY_DTYPES)."""

_CPU_KEYSET = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)


def _outside_domain(args: tuple, kwargs: dict, data: int = 0) -> bool:
    """A floating or complex tensor of a dtype outside KERNEL_DTYPES, or data (the argument at
    ``data``: x, q, logits...) that is not floating; index tensors (cu_seqlens, block tables,
    token ids) are integers by contract and decide nothing."""
    values = [*args, *kwargs.values()]
    values += [t for v in values if isinstance(v, (list, tuple)) for t in v]
    tensors = [v for v in values if isinstance(v, torch.Tensor)]
    if any(t.dtype not in KERNEL_DTYPES and (t.is_floating_point() or t.is_complex())
           for t in tensors):  # fmt: skip
        return True
    first = args[data] if len(args) > data else None
    return isinstance(first, torch.Tensor) and first.dtype not in KERNEL_DTYPES


def _stock_kernel(name: str) -> Any:
    """The CPU kernel that ``aten::name`` has now (the stock one, before install overrides it),
    or None where this torch has no ``torch.library.get_kernel`` (before 2.9): every dtype then
    goes to the override, as it did before."""
    get_kernel = getattr(torch.library, "get_kernel", None)
    if get_kernel is None:
        return None
    qualified = f"aten::{name}"
    try:
        return get_kernel(qualified, "CPU")
    except Exception:  # an op with no CPU kernel of its own (composite): nothing to fall back to
        return None


def _guarded_aten(
    name: str, kernel: Callable[..., Any], stock: Any, all_dtypes: bool
) -> Callable[..., Any]:
    """``kernel`` for ``aten::name``; unless ``all_dtypes``, dtypes outside KERNEL_DTYPES go to
    the stock kernel it replaces."""
    if stock is None or all_dtypes:
        return kernel

    def guarded(*args: Any, **kwargs: Any) -> Any:
        if _outside_domain(args, kwargs):
            return stock.call_boxed(_CPU_KEYSET, *args, **kwargs)
        return kernel(*args, **kwargs)

    guarded.__doc__ = f"aten::{name}: the batch-invariant kernel on KERNEL_DTYPES, else stock."
    return guarded


def _guarded_composite(
    kernel: Callable[..., Any], stock: Callable[..., Any], data: int
) -> Callable[..., Any]:
    """A swapped ``bi_props.ops`` composite: the kernel on KERNEL_DTYPES (``data``: the
    argument that decides), else the stock composite it replaced (whose aten ops are the guarded
    overrides above)."""

    def guarded(*args: Any, **kwargs: Any) -> Any:
        if _outside_domain(args, kwargs, data):
            return stock(*args, **kwargs)
        return kernel(*args, **kwargs)

    guarded.__name__, guarded.__qualname__ = kernel.__name__, kernel.__qualname__
    guarded.__doc__ = kernel.__doc__
    guarded.__wrapped__ = kernel  # type: ignore[attr-defined]
    return guarded


def install(namespace: str = NAMESPACE) -> None:
    """Route the stock CPU entry points through the batch-invariant kernels, for this process.

    Idempotent for the same namespace; one-way (no uninstall). Call it once, early, when the
    switch is on.
    """
    if _INSTALLED:
        if _INSTALLED[0] != namespace:
            raise RuntimeError(
                f"bi_props kernels already installed as {_INSTALLED[0]!r}, not {namespace!r}"
            )
        return
    import bi_props.ops as stock_ops

    defs = torch.library.Library(namespace, "DEF")
    for route in KERNELS:
        defs.define(route.schema)
        defs.impl(route.name, route.kernel, "CPU")
    _LIBRARIES.append(defs)

    ns = getattr(torch.ops, namespace)
    aten = torch.library.Library("aten", "IMPL")
    overrides = {
        name: (forwarder(ns), route.all_dtypes)
        for route in KERNELS
        for name, forwarder in route.aten.items()
    }
    stock = {name: _stock_kernel(name) for name in overrides}  # before any override
    with warnings.catch_warnings():
        # aten warns (once per process) that it overrides a kernel: that is the point here.
        warnings.filterwarnings("ignore", message="(?s).*previously registered kernel")
        for name, (kernel, all_dtypes) in overrides.items():
            aten.impl(name, _guarded_aten(name, kernel, stock[name], all_dtypes), "CPU")
        # aten::linear is CompositeImplicitAutograd: with a bias and an input that is not a
        # contiguous 2-D/3-D matrix it runs matmul and then adds the bias in the output dtype
        # (a second rounding in 16-bit). Batch-invariant, but not the float32 accumulation the
        # target declares: it goes through addmm instead (one rounding; found by `reference`).
        aten.impl("linear", _linear(), "CompositeImplicitAutograd")
    _LIBRARIES.append(aten)

    for route in KERNELS:
        if route.composite is None:
            continue
        name = route.composite
        fn = route.composite_function(ns)
        guarded = _guarded_composite(fn, getattr(stock_ops, name), route.data_argument)
        SWAPPED[name] = guarded
        setattr(stock_ops, name, guarded)
    _INSTALLED.append(namespace)
