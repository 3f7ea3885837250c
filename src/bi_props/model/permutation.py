"""The row permutation of a batch (property ``row_permutation``): which order, and how much moves.

vLLM's MoE test permutes a batch's rows, runs the kernel, un-permutes the output and expects the
same bits. Here the units permuted are the batch's rows, or its samples (each a sequence of its
own) for ops whose samples are sequences (``OpSpec.sequences``) or own other output rows than
input rows (``OpSpec.output_rows``): packed or paged sequences move whole.

The order is a derangement (no unit keeps its place) in which every row lands at another index
(``MOVED_SHARE``: all of them, above the floor of one half the property states): a random one
drawn from the case's seed (so the case alone determines it, in the worker and in a reproducer),
else a rotation by one unit, which always qualifies (every unit after the first moves up by the
first one's rows, the first one moves to the end). numpy only: the worker and the controller
both use it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

MOVED_SHARE = 1.0
"""The share of the batch's rows the permutation moves to another index (every row)."""
MOVED_SHARE_FLOOR = 0.5
"""The least share of rows a row permutation must move to count (a stated floor)."""
SALT = 0x5EED_0F0
"""Mixed into the case's seed: the permutation's draw is independent of the tensors' values."""
TRIES = 16


def offsets(sizes: Sequence[int]) -> list[int]:
    """Index of each unit's first row, in the given order."""
    return [int(v) for v in np.concatenate(([0], np.cumsum(sizes, dtype=np.int64)[:-1]))]


def moved_rows(order: Sequence[int], sizes: Sequence[int]) -> int:
    """Rows whose index changes when the units (rows ``sizes``) are put in ``order`` (the new
    sequence of original unit indices)."""
    before = offsets(sizes)
    after = offsets([sizes[u] for u in order])
    return sum(int(sizes[u]) for new, u in enumerate(order) if after[new] != before[u])


def _qualifies(order: Sequence[int], sizes: Sequence[int]) -> bool:
    deranged = all(u != new for new, u in enumerate(order))
    return deranged and moved_rows(order, sizes) == int(sum(sizes))


def derangement(sizes: Sequence[int], seed: int) -> tuple[int, ...]:
    """The units' new order (``order[new] = original unit``) for units of ``sizes`` rows (each
    at least 1: a space's rows and companion rows start at 1): a derangement that moves every
    row, drawn from ``seed``; the identity when there are fewer than two units (nothing can
    move: such an example is degenerate)."""
    n = len(sizes)
    if n < 2:
        return tuple(range(n))
    rng = np.random.default_rng([int(seed) & 0xFFFFFFFF, SALT])
    for _ in range(TRIES):
        order = tuple(int(u) for u in rng.permutation(n))
        if _qualifies(order, sizes):
            return order
    return (*range(1, n), 0)  # a rotation by one unit: always a derangement moving every row


def inverse(order: Sequence[int]) -> tuple[int, ...]:
    """``inverse(order)[u]`` is the new position of original unit ``u``."""
    back = [0] * len(order)
    for new, u in enumerate(order):
        back[u] = new
    return tuple(back)


def row_order(order: Sequence[int], sizes: Sequence[int]) -> list[int]:
    """The permutation of the rows themselves: the original row index at each new index."""
    starts = offsets(sizes)
    return [starts[u] + r for u in order for r in range(int(sizes[u]))]


def unpermute_index(order: Sequence[int], sizes: Sequence[int]) -> list[int]:
    """Where each original row of the output lies in the permuted output: indexing the
    permuted output with it gives the output in the original order. ``sizes`` are the output
    rows each unit owns, in the original order."""
    new_starts = offsets([sizes[u] for u in order])
    back = inverse(order)
    return [new_starts[back[u]] + r for u in range(len(order)) for r in range(int(sizes[u]))]


__all__ = [
    "MOVED_SHARE",
    "MOVED_SHARE_FLOOR",
    "derangement",
    "inverse",
    "moved_rows",
    "offsets",
    "row_order",
    "unpermute_index",
]
