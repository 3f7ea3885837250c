"""Planted library, bug class *fewer dtypes than the stock op* (a kernel configured per dtype).

The kernel picks its accumulation from a table with entries for the three float dtypes every
batch-invariant test draws (float32, bfloat16, float16), like a Triton kernel's per-dtype config
table. Those calls are correct, batch-invariant and deterministic; a float64 or integer call,
which stock ``aten::mm`` accepts, raises a KeyError with the switch on.
Expected finding: mm parity [both] on a dtype outside the three, and nothing else.
"""

from __future__ import annotations

import plantedlib
import torch

NAMESPACE = "planted_dtype_table"
OPS = ["mm"]
KERNEL_PREFIX = f"{NAMESPACE}::"
ROUTES = {"mm": (f"{NAMESPACE}::mm",)}

_ACCUMULATE = {
    torch.float32: torch.float64,
    torch.bfloat16: torch.float64,
    torch.float16: torch.float64,
}  # fmt: skip  BUG: no float64, no integers


def mm(a, b):
    plantedlib.check(a, b)
    _ACCUMULATE[a.dtype]  # raises KeyError outside the table
    return plantedlib.mm_float64(a, b).to(a.dtype)


def enable(enabled: bool) -> None:
    if enabled:
        plantedlib.install(NAMESPACE, mm)
