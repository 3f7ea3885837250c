"""Planted library, bug class *a second distinct mismatch behind a known one*, in one cell.

``aten::mm`` is correct but for two bugs of the same cell (mm reference [enabled], mismatch):
float32 inputs with K >= 4 are multiplied in float16 (far outside the float32 bound), and
bfloat16 inputs with N >= 2 return the product rounded through float16 first. A known-failures
file lists the first (its case names its class: float32); the second, in bfloat16, must still be
reported as new.
"""

from __future__ import annotations

import plantedlib
import torch

NAMESPACE = "planted_second_class"
OPS = ["mm"]
KERNEL_PREFIX = f"{NAMESPACE}::"
ROUTES = {"mm": (f"{NAMESPACE}::mm",)}


def mm(a, b):
    plantedlib.check(a, b)
    exact = plantedlib.mm_float64(a, b)
    if a.dtype == torch.float32 and a.shape[1] >= 4:  # BUG 1 (the known one): float16 sums
        return plantedlib.mm_float64(a.to(torch.float16), b.to(torch.float16)).to(a.dtype)
    if a.dtype == torch.bfloat16 and b.shape[1] >= 2:  # BUG 2: rounded through float16
        return exact.to(torch.float16).to(a.dtype)
    return exact.to(a.dtype)


def enable(enabled: bool) -> None:
    if enabled:
        plantedlib.install(NAMESPACE, mm)
