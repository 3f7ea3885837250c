"""Deployment-size draws: the space of an example drawn at the sizes models run at, the named-size
strategy, and the cost budget that keeps such an example a few rows or a few sequences.

One example in the space's ``scale_every`` of an op with a deployment axis (``OpSpec.scale``,
``model/deployment.py``) takes this path; its flag shrinks to the small draw, so a failure found
at 151,936 logits still shrinks toward the smallest size that shows it.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from hypothesis import strategies as st

from ..model.case import Companion
from ..model.op_registry import OPS
from ..model.opspec import OpSpec
from ..model.space import Extent, Space


@lru_cache(maxsize=64)
def scale_flag(every: int) -> st.SearchStrategy[bool]:
    """True one draw in ``every`` (sampled_from draws an index about uniformly and shrinks toward
    False, the small draw)."""
    return st.sampled_from((False,) * (max(every, 1) - 1) + (True,))


def named_sizes(space: Space) -> tuple[int, ...]:
    """The deployment sizes a space names: its scale points and vocabulary sizes."""
    return tuple(sorted(set(space.scale_points) | set(space.vocab_sizes)))


@lru_cache(maxsize=1024)
def _sizes(low: int, high: int, named: tuple[int, ...]) -> st.SearchStrategy[int]:
    # each named size and its two neighbours, in order: shrinking the index moves to the
    # smallest candidate that still fails (1,025 for a kernel switching past 1,024)
    candidates = tuple(sorted({c for p in named for c in (p - 1, p, p + 1) if low <= c <= high}))
    plain = st.integers(low, high)
    if not candidates:
        return plain

    def place(drawn: tuple[bool, int, int]) -> int:
        on_candidate, candidate, v = drawn
        return candidate if on_candidate else v

    return st.tuples(st.booleans(), st.sampled_from(candidates), plain).map(place)


def sizes(space: Space, low: int, high: int) -> st.SearchStrategy[int]:
    """A size in [low, high]: half of the time a named size (or one off it), else any; shrinks
    toward ``low``."""
    high = max(low, high)
    return _sizes(low, high, named_sizes(space))


@lru_cache(maxsize=64)
def _vocabularies(low: int, high: int, vocab: tuple[int, ...], named: tuple[int, ...]):
    exact = tuple(v for v in vocab if low <= v <= high)
    other = _sizes(low, high, named)
    if not exact:
        return other
    return st.one_of(other, st.sampled_from(exact))  # shrinks toward the sizes branch


def vocabulary(space: Space, low: int) -> st.SearchStrategy[int]:
    """A vocabulary-wide last dimension: half of the time one of the space's vocabulary sizes
    exactly (what logits are), else ``sizes`` from ``low`` up to the largest, toward which it
    shrinks (a failure needing 1,025 logits shrinks to 1,025, not to a vocabulary)."""
    high = max(low, max(space.vocab_sizes))
    return _vocabularies(low, high, tuple(sorted(space.vocab_sizes)), named_sizes(space))


def deployment_space(space: Space, axis: str) -> Space:
    """The space of a deployment-size example along ``axis``: its upper limits raised to the
    scale's, its thresholds joined by the named sizes. Shapes the ops draw inside the raised
    limits are kept within the space's ``max_elements`` by ``within_budget`` (companions) and by
    the ops' own scaled draws (``ShapeContext.scaled``)."""
    named = named_sizes(space)
    if axis in ("tokens", "vocab"):
        top = max(space.companion_rows.max, space.max_tokens)
        return replace(
            space,
            rows=Extent(space.rows.min, max(space.rows.max, top)),
            companion_rows=Extent(space.companion_rows.min, top),
            thresholds=tuple(sorted(set(space.thresholds) | {p for p in named if p <= top})),
        )
    if axis == "context":
        top = max(space.attention_length.max, space.max_context)
        return replace(
            space,
            attention_length=Extent(space.attention_length.min, top),
            paged_context=max(space.paged_context, top),
            # a many-sequence batch may hold long ones too (the budget still bounds its cost)
            max_batch_tokens=max(space.max_batch_tokens, 2 * top),
            rows=Extent(space.rows.min, max(space.rows.max, top)),
            companion_rows=Extent(space.companion_rows.min, max(space.companion_rows.max, top)),
            thresholds=tuple(sorted(set(space.thresholds) | {p for p in named if p <= top})),
        )
    return space


def largest_rows(spec: OpSpec, case, budget: int) -> int:
    """The most rows a sample of ``case`` may have within ``budget`` (at least 1)."""
    if spec.sample_cost(case, 1) > budget:
        return 1
    low, high = 1, 1
    while spec.sample_cost(case, high * 2) <= budget and high < 1 << 30:
        high *= 2
    high *= 2
    while low < high - 1:  # cost(low) <= budget < cost(high)
        mid = (low + high) // 2
        if spec.sample_cost(case, mid) <= budget:
            low = mid
        else:
            high = mid
    return low


def within_budget(
    spec: OpSpec, case, companions: list[Companion], needle_rows: int, budget: int
) -> list[Companion]:
    """Companions cut so that the needle and all of them cost at most ``budget``: each in turn
    keeps the rows the budget has left (at least one row). Deterministic in what was drawn, so
    shrinking works on the drawn rows as before."""
    left = budget - spec.sample_cost(case, needle_rows)
    out = []
    for c in companions:
        rows = min(c.rows, largest_rows(spec, case, max(left, 0)))
        left -= spec.sample_cost(case, rows)
        out.append(c if rows == c.rows else replace(c, rows=max(rows, 1)))
    return out


def small_limit(space: Space, op: str, axis: str) -> int:
    """The largest size the space's small draws reach along ``axis`` for ``op``: an example
    past it was drawn at deployment size (the report counts those per cell)."""
    small = OPS[op].small_size if op in OPS else None
    if small is not None:
        return small(space)
    if axis == "vocab":
        return space.dim_for(op).max
    if axis == "context":  # an attention sequence's length
        return space.attention_length.max
    if axis == "positions":
        return min(space.rows.max, 4096)
    return space.rows.max + space.max_companions * space.companion_rows.max


def reach_points(space: Space, axis: str) -> tuple[int, ...]:
    """The named sizes a cell's size reach counts along ``axis``."""
    if axis == "vocab":
        return named_sizes(space)
    return tuple(sorted(set(space.scale_points)))
