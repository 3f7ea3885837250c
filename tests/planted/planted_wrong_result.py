"""Planted library, bug class *wrong result*.

Batch-invariant and deterministic, but when K is odd it silently drops the last term of the sum
over K (an off-by-one in a K loop unrolled by two). Expected finding: mm reference [enabled], the
minimal case having K = 1 (the smallest odd K), where the result is all zeros.
"""

from __future__ import annotations

import plantedlib

NAMESPACE = "planted_wrong_result"
OPS = ["mm"]
KERNEL_PREFIX = f"{NAMESPACE}::"
ROUTES = {"mm": (f"{NAMESPACE}::mm",)}


def mm(a, b):
    plantedlib.check(a, b)
    k = a.shape[1]
    return plantedlib.mm_float64(a, b, columns=k - k % 2).to(a.dtype)  # BUG: k // 2 pairs only


def enable(enabled: bool) -> None:
    if enabled:
        plantedlib.install(NAMESPACE, mm)
