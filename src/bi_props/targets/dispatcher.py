"""Reading the dispatcher: which kernel is active for an aten op on a dispatch key, and where it
was registered (``torch._C._dispatch_dump``'s text), and the aten ops on each catalogue op's path
(``PATH_OPS``). The one reader the vllm, sglang, vllm-ascend-triton and module targets share; pure
helpers (no torch, no vLLM), unit-tested with literal samples.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

# Disabled state: every aten op on any path of the catalogue op (matmul's batched form goes
# through bmm, linear through addmm/matmul/mm...); none may be vLLM's (that would be a switch leak).
PATH_OPS: dict[str, tuple[str, ...]] = {
    "mm": ("aten::mm", "aten::mm.out"),
    "addmm": ("aten::addmm", "aten::addmm.out"),
    "matmul": ("aten::matmul", "aten::mm", "aten::bmm"),
    "linear": ("aten::linear", "aten::addmm", "aten::matmul", "aten::mm"),
    "bmm": ("aten::bmm", "aten::bmm.out"),
    "sum": ("aten::sum", "aten::sum.dim_IntList"),
    "mean": ("aten::mean.dim", "aten::mean"),
    "softmax": ("aten::_softmax", "aten::softmax.int"),
    "log_softmax": ("aten::_log_softmax", "aten::log_softmax.int"),
    "rms_norm": ("aten::rms_norm", "aten::mean.dim", "aten::_fused_rms_norm"),
    "add_rms_norm": ("aten::rms_norm", "aten::mean.dim", "aten::_fused_rms_norm"),
    # F.scaled_dot_product_attention picks a fused kernel (CPU: the flash one for 4-d inputs) or
    # the math path (bmm, _safe_softmax): each is the call's own aten op, none is "the" softmax.
    "attention": (
        "aten::_softmax",
        "aten::_safe_softmax",
        "aten::bmm",
        "aten::matmul",
        "aten::_scaled_dot_product_flash_attention_for_cpu",
        "aten::_scaled_dot_product_flash_attention",
        "aten::_scaled_dot_product_efficient_attention",
        "aten::_scaled_dot_product_cudnn_attention",
    ),
}

# Aten ops (base names, overloads included) whose result can depend on the order of a
# floating-point reduction: when a call of a claimed op dispatches one of them, its kernel must be
# the target's whatever the op's paths say (a module claiming rms_norm whose entry reaches stock
# aten::sum has not routed it). Order-insensitive reductions (max, amax, any, argmax) are not here.
ORDER_SENSITIVE_OPS: frozenset[str] = frozenset(
    f"aten::{name}"
    for name in (
        "mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul", "mv", "addmv", "dot", "vdot",
        "_int_mm", "_scaled_mm", "linear", "convolution", "_convolution",
        "sum", "nansum", "mean", "prod", "cumsum", "cumprod", "logsumexp", "logcumsumexp",
        "var", "std", "var_mean", "std_mean", "norm", "linalg_vector_norm",
        "_softmax", "_log_softmax", "_safe_softmax", "rms_norm", "_fused_rms_norm",
        "native_layer_norm", "native_group_norm", "native_batch_norm", "_native_batch_norm_legit",
        "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
        "_flash_attention_forward", "_efficient_attention_forward",
        "embedding_bag", "_embedding_bag", "index_add", "scatter_add", "scatter_reduce",
    )
)  # fmt: skip

_KERNEL_LINE = re.compile(
    r"^(?P<key>[A-Za-z0-9_]+)(?:\[alias\])?(?P<inactive> \(inactive\))?: registered at "
    r"(?P<where>.+?)(?: :: .*)?$"
)


def parse_dispatch_kernel(dump: str, key: str) -> str | None:
    """The location (``path:line``) of the active kernel for dispatch ``key`` in the text of
    ``torch._C._dispatch_dump(op)``, or None when that key has no kernel of its own (composite
    ops, an empty dump for an op that does not exist). Lines marked ``(inactive)`` are kernels
    that a later registration overrode; they are skipped."""
    for line in dump.splitlines():
        match = _KERNEL_LINE.match(line.strip())
        if match and match["key"] == key and not match["inactive"]:
            return match["where"].strip()
    return None


# Where a backend key has no kernel of its own, the dispatcher runs these, in this order.
_COMPOSITE_KEYS = ("CompositeExplicitAutogradNonFunctional", "CompositeExplicitAutograd")


def parse_active_kernel(dump: str, key: str) -> tuple[str, str] | None:
    """``(key, location)`` of the kernel that runs for dispatch ``key``: the key's own, else the
    explicit composite one the dispatcher falls back to (a stock ``aten::_safe_softmax`` has no
    CPU kernel, and it still runs); None for implicit composites, which decompose before any
    kernel (their parts are dispatched and seen instead), and ops this torch does not have."""
    for candidate in (key, *_COMPOSITE_KEYS):
        location = parse_dispatch_kernel(dump, candidate)
        if location is not None:
            return candidate, location
    return None


def is_order_sensitive(qualified_name: str) -> bool:
    """Whether an aten op (``aten::sum.dim_IntList``) is one of ORDER_SENSITIVE_OPS."""
    return qualified_name.split(".")[0] in ORDER_SENSITIVE_OPS


def location_path(location: str) -> str:
    """``/a/b.py:1314`` -> ``/a/b.py`` (the line number is optional)."""
    path, sep, line = location.rpartition(":")
    return path if sep and line.isdigit() else location


def load_dumper() -> Callable[[str], str]:
    """``torch._C._dispatch_dump``, checked on ``aten::mm``: the one way the targets read the
    dispatcher. Raises (AttributeError, RuntimeError...) where this torch has no usable dump; the
    caller says what that leaves unobservable."""
    import torch

    dump = torch._C._dispatch_dump
    sample = dump("aten::mm")
    if "schema:" not in sample and "registered at" not in sample:
        raise RuntimeError(f"unrecognised dump format: {sample[:200]!r}")
    return dump


def cached_dumper(
    dump: Any, unobservable: str | None, why: Callable[[Exception], str]
) -> tuple[Any, str | None]:
    """A target's ``(dump, unobservable)`` after asking for the dump: the cached one, or the dump
    loaded once (``load_dumper``), or None and ``why(exc)`` (what that leaves unobservable)."""
    if dump is not None or unobservable is not None:
        return dump, unobservable
    try:
        return load_dumper(), None
    except Exception as exc:
        return None, why(exc)
