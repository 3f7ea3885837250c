"""Planted library, bug class *a softmax that chunks a long row once the call has many rows*.

Softmax and log_softmax kernels keep a row in registers up to a width and loop over chunks past
it; some also pick the chunked path only for calls of many rows (one program per row). Here
``aten::_softmax`` and ``aten::_log_softmax`` reduce each row's exp-sum in float64, one
rounding at the end (batch-invariant), unless the row is longer than CHUNK *and* the call holds
more than MANY_ROWS rows: then the sum is accumulated chunk by chunk in float32. Both are within
the reference bound, so only batch invariance can see it, and only at sizes past the small
draws (the cpu profile's last dims stop at 160): a vocabulary-wide row, or any row past 1,024
logits, beside companions that make the call many rows. Expected finding: softmax or
log_softmax batch_invariance [enabled], in float32.
"""

from __future__ import annotations

import warnings

import torch

NAMESPACE = "planted_softmax_chunked"
OPS = ["softmax", "log_softmax"]
KERNEL_PREFIX = f"{NAMESPACE}::"
ROUTES = {"softmax": (f"{NAMESPACE}::softmax",), "log_softmax": (f"{NAMESPACE}::log_softmax",)}
CHUNK = 1024
MANY_ROWS = 64

_LIBRARIES: list[torch.library.Library] = []


SCALAR_NAMES = {
    torch.int64: "Long",
    torch.int32: "Int",
    torch.int16: "Short",
    torch.int8: "Char",
    torch.uint8: "Byte",
    torch.bool: "Bool",
    torch.complex64: "ComplexFloat",
    torch.complex128: "ComplexDouble",
}
"""The stock kernel's names of the dtypes it refuses (its error message, kept for parity)."""


def _kernel(x: torch.Tensor, dim: int, half_to_float: bool, log: bool) -> torch.Tensor:
    if not x.is_floating_point():
        last = x.dim() <= 1 or dim in (-1, x.dim() - 1)
        name = f"{'log_' if log else ''}softmax_{'lastdim_' if last else ''}kernel_impl"
        scalar = SCALAR_NAMES.get(x.dtype, str(x.dtype))
        raise NotImplementedError(f'"{name}" not implemented for {scalar!r}')
    out_dtype = torch.float32 if half_to_float else x.dtype
    if x.dim() == 0:
        x = x.reshape(1)
        dim = 0
    rows_last = x.movedim(dim, -1)
    n = rows_last.shape[-1]
    if rows_last.numel() == 0:
        return torch.empty(x.shape, dtype=out_dtype)
    rows = rows_last.numel() // n
    x64 = rows_last.to(torch.float64)
    top = x64.amax(-1, keepdim=True)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    shifted = x64 - top
    e = torch.exp(shifted)
    if n > CHUNK and rows > MANY_ROWS:
        # BUG: the chunked path (float32 partial sums) is chosen by the call's rows
        total = torch.zeros((*e.shape[:-1], 1), dtype=torch.float32)
        for lo in range(0, n, CHUNK):
            total = total + e[..., lo : lo + CHUNK].to(torch.float32).cumsum(-1)[..., -1:]
        total = total.to(torch.float64)
    else:
        total = e.cumsum(-1)[..., -1:]  # a sequential scan per row: one order, any batch
    y = shifted - torch.log(total) if log else e / total
    return y.to(out_dtype).movedim(-1, dim).reshape(x.shape).contiguous()


def softmax(x, dim, half_to_float):
    return _kernel(x, dim, half_to_float, log=False)


def log_softmax(x, dim, half_to_float):
    return _kernel(x, dim, half_to_float, log=True)


def enable(enabled: bool) -> None:
    if not enabled:
        return
    defs = torch.library.Library(NAMESPACE, "DEF")
    aten = torch.library.Library("aten", "IMPL")
    ns = getattr(torch.ops, NAMESPACE)
    for name, kernel, aten_name in (
        ("softmax", softmax, "_softmax"),
        ("log_softmax", log_softmax, "_log_softmax"),
    ):
        defs.define(f"{name}(Tensor self, int dim, bool half_to_float) -> Tensor")
        defs.impl(name, kernel, "CPU")
        op = getattr(ns, name)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="(?s).*previously registered kernel")
            aten.impl(aten_name, lambda x, d, h, op=op: op(x, d, h), "CPU")
    _LIBRARIES.extend((defs, aten))
