"""Every small size once: a cover of small shapes in a claimed op's enabled reference cell.

A kernel that misbehaves at one particular small size (a hang when K is 7, a wrong tail when
the last dimension is 13) is found by a random search only when it happens to draw that size:
Hypothesis' integers favour the ends of a range and the space's tile edges, so an inner value
such as 7 came about once in a hundred draws of ``mm``, and a short campaign ran too few
examples of one cell to meet it. Like PyTorch's exhaustive 16-bit inputs, the small sizes are few
enough to try each: in its first turn, the enabled ``reference`` cell of an op the target claims
runs a cover of the cell's own strategy drawn in a space clipped to ``SMALL`` along every extent
(rows, dims, companions, attention lengths, paged contexts; no deployment sizes): of ``DRAWS``
draws (fixed seed, generation only), greedily the case that adds the most (dimension, size) pairs
not yet covered, the cheaper first on ties, at most ``MOST`` cases: most sizes from the
extent's minimum to ``SMALL`` of each dimension the strategy varies (for ``mm``, at least 12 of
the 17 sizes of each of M, K and N; a size the draws never met is not tried).

The cases are judged examples of the cell (coverage lines say ``"explicit": true``); the first
failure ends the cover and is shrunk by Hypothesis like a known case's; a hang is suspected
in seconds like any example's (campaigns/hangs.py). Drawn once per session, eagerly: where
the run draws only compiled calls (a target that compiles every case), no cover, as every new
size would compile a new graph. Imports no torch.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..model.case import Case
from ..model.op_registry import OPS
from ..model.space import Extent, Space
from .explicit import for_entry, generated, run_cases

SMALL = 16
"""The largest size of the cover along every extent (the first tile edge of every profile)."""
DRAWS = 80
"""Draws of the cell's strategy in the clipped space the cover is chosen from."""
MOST = 20
"""Cases of the cover at most: three dimensions of 0..16 need 17."""
SEED = 20261208
SMALL_NOTE = (
    "not shrunk: the cell's explicit small-size example (a cover of every small size of each "
    "dimension, drawn once)"
)
"""The session's ``shrink_note`` while the cover runs."""


def applies(session: Any, op: str, prop: str, switch: str) -> bool:
    """Whether the cell runs the cover: the enabled reference cell of an op the target claims."""
    if prop != "reference" or switch != "enabled" or op not in OPS:
        return False
    from .modes import mode_space

    if "eager" not in mode_space(session).modes:  # compiled only: each size a new graph
        return False
    covered = getattr(session, "covered", None)
    return covered is None or bool(covered(op))


def small_space(space: Space) -> Space:
    """``space`` with every size extent clipped to ``SMALL`` and no deployment-size draws."""

    def clip(extent: Extent) -> Extent:
        return Extent(extent.min, max(extent.min, min(extent.max, SMALL)))

    return replace(
        space,
        rows=clip(space.rows),
        dim=clip(space.dim),
        companion_rows=clip(space.companion_rows),
        op_dim={op: clip(e) for op, e in space.op_dim.items()},
        attention_length=clip(space.attention_length),
        paged_context=min(space.paged_context, SMALL),
        max_companions=min(space.max_companions, 3),
        scale_every=0,
        modes=("eager",),  # compiled, each new size would compile a new graph (seconds each)
    )


def cover(drawn: list[Case], most: int = MOST) -> list[Case]:
    """Greedily, the case adding the most (dimension, size) pairs not yet covered (the cheaper
    first on ties), until none adds one or ``most`` are chosen; cheapest first."""
    from ..runner.controller import case_work

    left = sorted(drawn, key=case_work)
    covered: set[tuple[int, int]] = set()
    chosen: list[Case] = []
    while left and len(chosen) < most:
        gains = [len(set(enumerate(c.shape)) - covered) for c in left]
        best = max(range(len(left)), key=lambda i: (gains[i], -i))
        if gains[best] == 0:
            break
        case = left.pop(best)
        covered |= set(enumerate(case.shape))
        chosen.append(case)
    return sorted(chosen, key=case_work)


def cover_cases(session: Any, op: str, prop: str) -> list[Case]:
    """The cell's small-size cover, drawn once per session."""
    cache: dict = session.drawn_examples
    key = ("small", op, prop)
    if key not in cache:
        cache[key] = cover(_draws(session, op, prop))
    return cache[key]


def _draws(session: Any, op: str, prop: str) -> list[Case]:
    from ..catalogue.strategies import cases
    from .modes import mode_space

    strategy = cases(small_space(mode_space(session)), op, prop, session.entries(op))
    return generated(strategy, DRAWS, SEED)


def run_small_cover(
    session: Any,
    op: str,
    prop: str,
    switch: str,
    shrink_end: float | None = None,
) -> tuple[int, list]:
    """Run the cell's small-size cover once per session, whole; a failure's shrink ends at
    ``shrink_end``; return (examples judged, new failures), as ``explicit.run_explicit``."""
    cell = ("small", op, prop, switch)
    if cell in session.drawn_done or not applies(session, op, prop, switch):
        return 0, []
    session.drawn_done.add(cell)
    ready = [c for c in (for_entry(session, c) for c in cover_cases(session, op, prop)) if c]
    # all of it in one turn, whatever the turn's limit (each case is small, twenty at most):
    # cut at the slice's shrink bound it was one case in a crowded campaign; the campaign's
    # end still stops it (DeadlineReached)
    # the first failure ends it, as a failure ends a turn's search: one cover of 20 small
    # cases would otherwise record a finding per failure class it meets, unshrunk
    return run_cases(
        session, op, prop, switch, ready, SMALL_NOTE, lambda c: None, None, shrink_end, True
    )


__all__ = ["SMALL_NOTE", "applies", "cover", "cover_cases", "run_small_cover", "small_space"]
