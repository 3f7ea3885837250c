"""Planted library, bug class *batch variance above a size threshold*.

Like ``planted_correct``, except that a call with M >= 64 rows takes a "large-M" path that
accumulates in float32 from the last term of K to the first: a row's bits then depend on how many
rows share the call. Expected finding: mm batch_invariance [enabled], the minimal batch having
exactly THRESHOLD rows in total (needle plus companions).
"""

from __future__ import annotations

import plantedlib

NAMESPACE = "planted_batch_variant"
OPS = ["mm"]
KERNEL_PREFIX = f"{NAMESPACE}::"
ROUTES = {"mm": (f"{NAMESPACE}::mm",)}
THRESHOLD = 64


def mm(a, b):
    plantedlib.check(a, b)
    if a.shape[0] >= THRESHOLD:  # BUG: the algorithm depends on the batch's size
        return plantedlib.mm_float32_reversed(a, b).to(a.dtype)
    return plantedlib.mm_float64(a, b).to(a.dtype)


def enable(enabled: bool) -> None:
    if enabled:
        plantedlib.install(NAMESPACE, mm)
