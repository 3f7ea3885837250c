"""Planted library, bug class *precision loss* (float32): TF32-style input truncation.

Batch-invariant and deterministic (each output element summed in float64, in order, from its own
row and column), but both operands' mantissas are cut to 10 bits first, as a tensor-core TF32 path
does: a relative error near 2^-11 per input. Only ``reference`` can see it, and only where the
bound is honest: at K = 4096 the old worst-case bound allowed ~1.7e5 ulps and let it pass.
Declares float32 internals (the default), which is the promise it breaks.
"""

from __future__ import annotations

import plantedlib
import torch

NAMESPACE = "planted_tf32"
OPS = ["mm"]
KERNEL_PREFIX = f"{NAMESPACE}::"
ROUTES = {"mm": (f"{NAMESPACE}::mm",)}


def truncate(t: torch.Tensor, bits: int = 10) -> torch.Tensor:
    """Zero all but the top ``bits`` explicit mantissa bits of float32 values (toward zero)."""
    as_int = t.contiguous().view(torch.int32)
    mask = ~((1 << (23 - bits)) - 1)
    return (as_int & mask).view(torch.float32)


def mm(a, b):
    plantedlib.check(a, b)
    if a.dtype != torch.float32:
        return plantedlib.mm_float64(a, b).to(a.dtype)
    return plantedlib.mm_float64(truncate(a), truncate(b)).to(a.dtype)  # BUG: TF32 inputs


def enable(enabled: bool) -> None:
    if enabled:
        plantedlib.install(NAMESPACE, mm)
