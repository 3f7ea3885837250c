"""Nested windows of a batch: many rows judged per kernel call (property ``batch_invariance``).

One batch-invariance example used to judge one needle: its rows alone against the same rows in
the batch. A batch holds many samples, and every one of them is owed the same promise. So each
example also runs *windows* of its batch, nested halves as PyTorch's inductor property tests
slice one batch (B, B/2, ..., 1), and compares every row of a window with the same row of the
whole batch, bitwise: one example judges about as many rows as the batch holds, at several batch
sizes (each a chance to cross a kernel's threshold on rows), for about twice the kernel time.

Two kinds, as the row permutation has: ops whose rows are independent cut the batch's rows
(prefixes of ``rows // 2, rows // 4, ..., 1`` rows, a sample cut where it falls); ops whose samples
are sequences (or own other output rows than input rows, or a padded batch) keep whole samples:
the needle with the first ``companions // 2, ..., 1`` companions. numpy only: the worker and the
controller (reports, reproducers) both use it.
"""

from __future__ import annotations

MAX_WINDOWS = 5
"""At most this many windows per example (the largest first): beyond it the rows judged grow by
less than one percent while each window still costs a call."""


def halvings(count: int, most: int = MAX_WINDOWS) -> list[int]:
    """``count // 2, count // 4, ..., 1``: distinct, each below ``count``, at most ``most``.
    Empty for a count below 2 (a batch of one unit has no smaller window)."""
    sizes: list[int] = []
    size = count // 2
    while size >= 1 and len(sizes) < most:
        if not sizes or size != sizes[-1]:
            sizes.append(size)
        size //= 2
    return sizes


def row_windows(total_rows: int, most: int = MAX_WINDOWS) -> list[int]:
    """The windows of a batch of independent rows: prefix lengths in rows."""
    return halvings(total_rows, most)


def sample_windows(companions: int, most: int = MAX_WINDOWS) -> list[int]:
    """The windows of a batch of whole samples: how many of its companions (the first ones, in
    batch order) each window keeps beside the needle. The needle alone is the property's own
    comparison, so no window of zero companions."""
    return halvings(companions, most)


def describe(kind: str, size: int, of: int) -> str:
    """A window in words, for failure messages and reproducers."""
    if kind == "rows":
        return f"the batch's first {size} of {of} rows"
    return f"the needle with the first {size} of its {of} companions"


__all__ = ["MAX_WINDOWS", "describe", "halvings", "row_windows", "sample_windows"]
