"""Planted library, bug class *precision loss* (16-bit outputs): a split-K kernel whose partial
sums are stored in the output dtype.

Batch-invariant and deterministic: K is cut into blocks of 64, each block summed in float64 and
rounded to the output dtype (bf16/fp16: a partial-sum buffer in the output type), the partials
summed in float64 and rounded once more. float32 inputs are computed correctly. It declares
float32 internals (the default), which a bf16 partial breaks; the old bound was infinite for
bf16 from K = 256 and accepted it.
"""

from __future__ import annotations

import plantedlib
import torch

NAMESPACE = "planted_bf16_intermediate"
OPS = ["mm"]
KERNEL_PREFIX = f"{NAMESPACE}::"
ROUTES = {"mm": (f"{NAMESPACE}::mm",)}
BLOCK = 64


def mm(a, b):
    plantedlib.check(a, b)
    if a.dtype == torch.float32:
        return plantedlib.mm_float64(a, b).to(a.dtype)
    k = a.shape[1]
    total = torch.zeros((a.shape[0], b.shape[1]), dtype=torch.float64)
    for start in range(0, k, BLOCK):
        part = plantedlib.mm_float64(a[:, start : start + BLOCK], b[start : start + BLOCK])
        total += part.to(a.dtype).to(torch.float64)  # BUG: the partial is rounded to bf16/fp16
    return total.to(a.dtype)


def enable(enabled: bool) -> None:
    if enabled:
        plantedlib.install(NAMESPACE, mm)
