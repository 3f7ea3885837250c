"""Planted library, bug class *a path keyed on the call's row count that the needle cannot see*.

Like ``planted_correct``, except that a call with an even number of rows accumulates in float32
from the last term of K to the first. The needle alone (1 row) and a batch of an odd number of
rows take the same path, so the needle's own comparison passes; a window of the batch with an
even number of rows (``bi_props.model.windows``) shows it. Expected finding: mm
batch_invariance [enabled], found at a window.
"""

from __future__ import annotations

import plantedlib

NAMESPACE = "planted_even_rows"
OPS = ["mm"]
KERNEL_PREFIX = f"{NAMESPACE}::"
ROUTES = {"mm": (f"{NAMESPACE}::mm",)}


def mm(a, b):
    plantedlib.check(a, b)
    if a.shape[0] % 2 == 0:  # BUG: the algorithm depends on the parity of the call's rows
        return plantedlib.mm_float32_reversed(a, b).to(a.dtype)
    return plantedlib.mm_float64(a, b).to(a.dtype)


def enable(enabled: bool) -> None:
    if enabled:
        plantedlib.install(NAMESPACE, mm)
