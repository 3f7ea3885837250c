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
    "rms_norm": ("aten::rms_norm", "aten::mean.dim"),
    "add_rms_norm": ("aten::rms_norm", "aten::mean.dim"),
    "attention": ("aten::_softmax", "aten::bmm", "aten::matmul"),
}

_KERNEL_LINE = re.compile(
    r"^(?P<key>[A-Za-z0-9_]+)(?P<inactive> \(inactive\))?: registered at "
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
