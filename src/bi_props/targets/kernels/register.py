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

from . import (
    activation,
    attention,
    gather,
    linalg,
    moe,
    normalization,
    paged_attention,
    reductions,
    rotary,
    sampling,
)

NAMESPACE = "bi_props_cpu"
KERNEL_PREFIX = f"{NAMESPACE}::"

_LIBRARIES: list[torch.library.Library] = []  # Library objects unregister when collected
_INSTALLED: list[str] = []
SWAPPED: dict[str, Callable[..., Any]] = {}
"""bi_props.ops attribute name -> the batch-invariant function installed in its place."""

_SCHEMAS: dict[str, tuple[str, Callable[..., Any]]] = {
    "mm": ("mm(Tensor self, Tensor mat2) -> Tensor", linalg.mm),
    "addmm": (
        "addmm(Tensor self, Tensor mat1, Tensor mat2, *, Scalar beta=1, Scalar alpha=1) -> Tensor",
        linalg.addmm,
    ),
    "bmm": ("bmm(Tensor self, Tensor mat2) -> Tensor", linalg.bmm),
    "mv": ("mv(Tensor self, Tensor vec) -> Tensor", linalg.mv),
    "sum": (
        "sum(Tensor self, int[1]? dim=None, bool keepdim=False, *, ScalarType? dtype=None)"
        " -> Tensor",
        reductions.sum,
    ),
    "mean": (
        "mean(Tensor self, int[1]? dim=None, bool keepdim=False, *, ScalarType? dtype=None)"
        " -> Tensor",
        reductions.mean,
    ),
    "softmax": (
        "softmax(Tensor self, int dim, bool half_to_float) -> Tensor",
        normalization.softmax,
    ),
    "log_softmax": (
        "log_softmax(Tensor self, int dim, bool half_to_float) -> Tensor",
        normalization.log_softmax,
    ),
    "rms_norm": (
        "rms_norm(Tensor input, int[] normalized_shape, Tensor? weight=None, float? eps=None)"
        " -> Tensor",
        normalization.rms_norm,
    ),
    "silu": ("silu(Tensor self) -> Tensor", activation.silu),
    "add_rms_norm": (
        "add_rms_norm(Tensor x, Tensor residual, Tensor weight, float? eps=None)"
        " -> (Tensor, Tensor)",
        normalization.add_rms_norm,
    ),
    "silu_and_mul": ("silu_and_mul(Tensor x) -> Tensor", activation.silu_and_mul),
    "gelu_and_mul": (
        "gelu_and_mul(Tensor x, str approximate='none') -> Tensor",
        activation.gelu_and_mul,
    ),
    "fused_add_rms_norm": (
        "fused_add_rms_norm(Tensor(a!) x, Tensor(b!) residual, Tensor weight, float eps) -> ()",
        normalization.fused_add_rms_norm,
    ),
    "layer_norm": (
        "layer_norm(Tensor input, int[] normalized_shape, Tensor? weight=None, Tensor? bias=None,"
        " float eps=1e-05) -> Tensor",
        normalization.layer_norm,
    ),
    "embedding": ("embedding(Tensor weight, Tensor indices) -> Tensor", gather.embedding),
    "varlen_attention": (
        "varlen_attention(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens, float? scale=None,"
        " bool causal=True) -> Tensor",
        attention.varlen_attention,
    ),
    "mixed_attention": (
        "mixed_attention(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k,"
        " float? scale=None, bool causal=True) -> Tensor",
        attention.mixed_attention,
    ),
    # -- inference ops
    "rotary_embedding": (
        "rotary_embedding(Tensor positions, Tensor query, Tensor key, int head_size,"
        " Tensor cos_sin_cache, bool is_neox=True) -> (Tensor, Tensor)",
        rotary.rotary_embedding,
    ),
    "argmax": ("argmax(Tensor self, int? dim=None, bool keepdim=False) -> Tensor", sampling.argmax),
    "top_k": ("top_k(Tensor logits, int k) -> (Tensor, Tensor)", sampling.top_k),
    "fused_moe": (
        "fused_moe(Tensor hidden_states, Tensor w1, Tensor w2, Tensor gating_output, int topk,"
        " bool renormalize=True) -> Tensor",
        moe.fused_moe,
    ),
    "paged_decode_attention": (
        "paged_decode_attention(Tensor query, Tensor k_cache, Tensor v_cache, Tensor block_table,"
        " Tensor seq_lens, float? scale=None) -> Tensor",
        paged_attention.paged_decode_attention,
    ),
}


def routes(namespace: str = NAMESPACE) -> dict[str, tuple[str, ...]]:
    """Catalogue op -> the ``{namespace}::`` profiler events, one of which must appear."""
    p = f"{namespace}::"
    return {
        "mm": (p + "mm",),
        "matmul": (p + "mm", p + "bmm", p + "mv"),  # vector @ vector (aten::dot) goes to mv
        "bmm": (p + "bmm",),
        "addmm": (p + "addmm",),
        "linear": (p + "addmm", p + "mm", p + "bmm", p + "mv"),
        "sum": (p + "sum",),
        "mean": (p + "mean",),
        "softmax": (p + "softmax",),
        "log_softmax": (p + "log_softmax",),
        "rms_norm": (p + "rms_norm",),
        "silu": (p + "silu",),
        "add_rms_norm": (p + "add_rms_norm",),
        "attention": (p + "varlen_attention",),
        "mixed_attention": (p + "mixed_attention",),
        "silu_and_mul": (p + "silu_and_mul",),
        "gelu_and_mul": (p + "gelu_and_mul",),
        "fused_add_rms_norm": (p + "fused_add_rms_norm",),
        "layer_norm": (p + "layer_norm",),
        "embedding": (p + "embedding",),
        # -- inference ops
        "rotary_embedding": (p + "rotary_embedding",),
        "greedy_argmax": (p + "argmax",),
        "top_k": (p + "top_k",),
        "fused_moe": (p + "fused_moe",),
        "paged_decode_attention": (p + "paged_decode_attention",),
    }


ROUTES: dict[str, tuple[str, ...]] = routes()


def _aten_overrides(ns: Any) -> dict[str, Callable[..., Any]]:
    """aten overload -> CPU kernel that forwards to the custom op (what the profiler shows)."""

    def dot(self, tensor):
        return ns.mv(self.unsqueeze(0), tensor).reshape(())

    return {
        "mm": lambda self, mat2: ns.mm(self, mat2),
        "addmm": lambda self, mat1, mat2, *, beta=1, alpha=1: ns.addmm(
            self, mat1, mat2, beta=beta, alpha=alpha
        ),
        "bmm": lambda self, mat2: ns.bmm(self, mat2),
        "mv": lambda self, vec: ns.mv(self, vec),
        "dot": dot,
        "sum": lambda self, *, dtype=None: ns.sum(self, None, False, dtype=dtype),
        "sum.dim_IntList": lambda self, dim, keepdim=False, *, dtype=None: ns.sum(
            self, dim, keepdim, dtype=dtype
        ),
        "mean": lambda self, *, dtype=None: ns.mean(self, None, False, dtype=dtype),
        "mean.dim": lambda self, dim, keepdim=False, *, dtype=None: ns.mean(
            self, dim, keepdim, dtype=dtype
        ),
        "_softmax": lambda self, dim, half_to_float: ns.softmax(self, dim, half_to_float),
        "_log_softmax": lambda self, dim, half_to_float: ns.log_softmax(self, dim, half_to_float),
        "rms_norm": lambda input, normalized_shape, weight=None, eps=None: ns.rms_norm(
            input, normalized_shape, weight, eps
        ),
        "silu": lambda self: ns.silu(self),
        "layer_norm": _layer_norm(ns),
        "embedding": _embedding(ns),
        # -- inference ops
        "argmax": lambda self, dim=None, keepdim=False: ns.argmax(self, dim, keepdim),
    }


def _layer_norm(ns: Any) -> Callable[..., Any]:
    def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5, cudnn_enable=True):
        return ns.layer_norm(input, normalized_shape, weight, bias, eps)

    return layer_norm


def _embedding(ns: Any) -> Callable[..., Any]:
    def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
        """Forward only (padding_idx and scale_grad_by_freq concern the gradient)."""
        return ns.embedding(weight, indices)

    return embedding


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


SWAPPED_OPS: dict[str, str] = {
    "add_rms_norm": "add_rms_norm",
    "attention": "varlen_attention",
    "mixed_attention": "mixed_attention",
    "silu_and_mul": "silu_and_mul",
    "gelu_and_mul": "gelu_and_mul",
    "fused_add_rms_norm": "fused_add_rms_norm",
    "rotary_embedding": "rotary_embedding",
    "top_k": "top_k",
    "fused_moe": "fused_moe",
    "paged_decode_attention": "paged_decode_attention",
}
"""Catalogue op -> the ``bi_props.ops`` composite the enabled target swaps for its kernel (one
of ``_swapped``'s; the CPU target's identity evidence reads it)."""


def _swapped(ns: Any) -> dict[str, Callable[..., Any]]:
    def add_rms_norm(x, residual, weight, eps=None):
        """Batch-invariant ``bi_props.ops.add_rms_norm`` (custom op, see kernels.normalization)."""
        y, total = ns.add_rms_norm(x, residual, weight, eps)
        return y, total

    def varlen_attention(q, k, v, cu_seqlens, scale=None, causal=True):
        """Batch-invariant ``bi_props.ops.varlen_attention`` (custom op, see kernels.attention)."""
        return ns.varlen_attention(q, k, v, cu_seqlens, scale, causal)

    def mixed_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, scale=None, causal=True):
        """Batch-invariant ``bi_props.ops.mixed_attention`` (custom op, see kernels.attention)."""
        return ns.mixed_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, scale, causal)

    def silu_and_mul(x):
        """Batch-invariant ``bi_props.ops.silu_and_mul`` (custom op, see kernels.activation)."""
        return ns.silu_and_mul(x)

    def gelu_and_mul(x, approximate="none"):
        """Batch-invariant ``bi_props.ops.gelu_and_mul`` (custom op, see kernels.activation)."""
        return ns.gelu_and_mul(x, approximate)

    def fused_add_rms_norm(x, residual, weight, eps=1e-6):
        """Batch-invariant ``bi_props.ops.fused_add_rms_norm``, in place (kernels.normalization);
        returns the two mutated tensors, as the stock composite does."""
        ns.fused_add_rms_norm(x, residual, weight, float(eps))
        return x, residual

    # -- inference ops
    def rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox=True):
        """Batch-invariant ``bi_props.ops.rotary_embedding`` (custom op, see kernels.rotary)."""
        q, k = ns.rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox)
        return q, k

    def top_k(logits, k):
        """Batch-invariant ``bi_props.ops.top_k`` (custom op, see kernels.sampling)."""
        values, indices = ns.top_k(logits, k)
        return values, indices

    def fused_moe(hidden_states, w1, w2, gating_output, topk, renormalize=True):
        """Batch-invariant ``bi_props.ops.fused_moe`` (custom op, see kernels.moe)."""
        return ns.fused_moe(hidden_states, w1, w2, gating_output, topk, renormalize)

    def paged_decode_attention(query, k_cache, v_cache, block_table, seq_lens, scale=None):
        """Batch-invariant ``bi_props.ops.paged_decode_attention`` (kernels.paged_attention)."""
        return ns.paged_decode_attention(query, k_cache, v_cache, block_table, seq_lens, scale)

    return {
        "add_rms_norm": add_rms_norm,
        "varlen_attention": varlen_attention,
        "mixed_attention": mixed_attention,
        "silu_and_mul": silu_and_mul,
        "gelu_and_mul": gelu_and_mul,
        "fused_add_rms_norm": fused_add_rms_norm,
        "rotary_embedding": rotary_embedding,
        "top_k": top_k,
        "fused_moe": fused_moe,
        "paged_decode_attention": paged_decode_attention,
    }


# -- dtypes outside the kernels' domain: the stock kernel, so the switch changes no contract --

KERNEL_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
"""The dtypes every kernel here takes. A call with a tensor of another dtype (integer, bool,
complex) runs the stock kernel the override replaced, so the switch changes no contract there:
the stock op's error (a NotImplementedError for an integer softmax) or its result (integer
reductions are exact in any order, hence batch-invariant anyway). The parity property draws
those dtypes to check it (model.case.PARITY_DTYPES)."""

ALL_DTYPE_KERNELS = frozenset({"mm", "addmm", "bmm", "mv", "dot", "sum", "sum.dim_IntList",
                               "mean", "mean.dim"})  # fmt: skip
"""Overrides whose kernels also take integers and complex (exact integer products and sums, the
same tree in complex arithmetic): they keep every dtype."""

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


def _guarded_aten(name: str, kernel: Callable[..., Any], stock: Any) -> Callable[..., Any]:
    if stock is None or name in ALL_DTYPE_KERNELS:
        return kernel

    def guarded(*args: Any, **kwargs: Any) -> Any:
        if _outside_domain(args, kwargs):
            return stock.call_boxed(_CPU_KEYSET, *args, **kwargs)
        return kernel(*args, **kwargs)

    guarded.__doc__ = f"aten::{name}: the batch-invariant kernel on KERNEL_DTYPES, else stock."
    return guarded


_DATA_ARGUMENT = {"rotary_embedding": 1}  # (positions, query, ...): the query decides
"""The position of a composite's data argument where it is not the first."""


def _guarded_composite(kernel: Callable[..., Any], stock: Callable[..., Any]) -> Callable[..., Any]:
    """A swapped ``bi_props.ops`` composite: the kernel on KERNEL_DTYPES, else the stock
    composite it replaced (whose aten ops are the guarded overrides above)."""
    data = _DATA_ARGUMENT.get(kernel.__name__, 0)

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
    for name, (schema, kernel) in _SCHEMAS.items():
        defs.define(schema)
        defs.impl(name, kernel, "CPU")
    _LIBRARIES.append(defs)

    ns = getattr(torch.ops, namespace)
    aten = torch.library.Library("aten", "IMPL")
    overrides = _aten_overrides(ns)
    stock = {name: _stock_kernel(name) for name in overrides}  # before any override
    with warnings.catch_warnings():
        # aten warns (once per process) that it overrides a kernel: that is the point here.
        warnings.filterwarnings("ignore", message="(?s).*previously registered kernel")
        for name, kernel in overrides.items():
            aten.impl(name, _guarded_aten(name, kernel, stock[name]), "CPU")
        # aten::linear is CompositeImplicitAutograd: with a bias and an input that is not a
        # contiguous 2-D/3-D matrix it runs matmul and then adds the bias in the output dtype
        # (a second rounding in 16-bit). Batch-invariant, but not the float32 accumulation the
        # target declares: it goes through addmm instead (one rounding; found by `reference`).
        aten.impl("linear", _linear(), "CompositeImplicitAutograd")
    _LIBRARIES.append(aten)

    for name, fn in _swapped(ns).items():
        guarded = _guarded_composite(fn, getattr(stock_ops, name))
        SWAPPED[name] = guarded
        setattr(stock_ops, name, guarded)
    _INSTALLED.append(namespace)
