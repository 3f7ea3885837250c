"""Planted library, bug class *run-to-run nondeterminism*.

The kernel keeps a "packed weight" cache: the first call with a given ``mat2`` tensor sums in
float64, a repeated call with the very same (still alive) ``mat2`` tensor takes the cached path,
which accumulates in float32 in reverse order. So the same call on the same tensors, twice, gives
different bits, while a row alone and the same row in a batch (fresh tensors each) agree. Expected
finding: mm determinism [enabled], and nothing else.
"""

from __future__ import annotations

import plantedlib

NAMESPACE = "planted_nondeterministic"
OPS = ["mm"]
KERNEL_PREFIX = f"{NAMESPACE}::"
ROUTES = {"mm": (f"{NAMESPACE}::mm",)}

_packed = None  # the last mat2 seen (a strong reference: its identity cannot be recycled)


def mm(a, b):
    global _packed
    plantedlib.check(a, b)
    warm = b is _packed
    _packed = b
    if warm:  # BUG: the cached path rounds differently from the cold path
        return plantedlib.mm_float32_reversed(a, b).to(a.dtype)
    return plantedlib.mm_float64(a, b).to(a.dtype)


def enable(enabled: bool) -> None:
    if enabled:
        plantedlib.install(NAMESPACE, mm)
