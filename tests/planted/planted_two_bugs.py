"""Planted library, two bug classes in ONE cell (every distinct bug in a cell is found).

mm reference [enabled] holds two different bugs: for K == 3 the kernel drops the last term of
the sum over K (wrong values: a ``mismatch``), and for more than LIMIT rows it raises
``ValueError`` (an ``error``; a tile index out of range, say). Both are batch-invariant and
deterministic otherwise. Expected findings in that cell: both, each shrunk (the mismatch to
K = 3, the error to LIMIT + 1 rows). A campaign whose cells retire at their first finding
reports only one of them.
"""

from __future__ import annotations

import plantedlib

NAMESPACE = "planted_two_bugs"
OPS = ["mm"]
KERNEL_PREFIX = f"{NAMESPACE}::"
ROUTES = {"mm": (f"{NAMESPACE}::mm",)}
LIMIT = 50
BAD_K = 3


def mm(a, b):
    plantedlib.check(a, b)
    if a.shape[0] > LIMIT:  # BUG 1
        raise ValueError(f"planted_two_bugs: more than {LIMIT} rows: tile index out of range")
    k = a.shape[1]
    columns = k - 1 if k == BAD_K else k  # BUG 2: the last term of K == 3 is dropped
    return plantedlib.mm_float64(a, b, columns=columns).to(a.dtype)


def enable(enabled: bool) -> None:
    if enabled:
        plantedlib.install(NAMESPACE, mm)
