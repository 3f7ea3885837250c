"""One explicit example at deployment size per enabled batch-invariance cell, like ``@example``.

The space draws a share of examples at the sizes models run at (``[scale]``, one in
``scale_every``); in a short campaign a cell sees a handful of them, and whether one was a
vocabulary-wide row or a 512-key needle beside a longer sequence was a matter of luck. Here an
enabled ``batch_invariance`` cell of an op with a deployment axis (``OpSpec.scale``) runs, in its
first turn, one case of its own strategy drawn at deployment size that reaches
``model.deployment.DEPLOYMENT_GOALS`` (32,000 logits, a needle of 512 keys beside a longer
sequence, a position past 4,096, a step past 1,024 tokens): among the draws that reach it, one
that can show a size-keyed switch (``preference``: a needle of exactly a named switch point
beside a longer sequence), the cheapest of those, in float32 where the space has it. Drawn once
per session, with a fixed random seed (the same case in every run of a space), without
shrinking: the example keeps the drawn operand sizes, so its reductions are long enough to vary.
Spaces with ``scale_every = 0`` (the Triton interpreter's) run none.

The example counts as reached sizes in the report (``SizeReach``) and as a judged example; its
coverage line says ``"deployment": true``. A failure on it is shrunk by Hypothesis like a known
case's. Imports no torch.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..model.case import Case
from ..model.deployment import SCALE_POINTS, reaches_goal
from ..model.op_registry import OPS
from .explicit import for_entry, generated, run_cases

DEPLOYMENT_NOTE = (
    "not shrunk: the cell's explicit deployment-size example (drawn once, at the sizes models "
    "run at)"
)
"""The session's ``shrink_note`` while the example runs (``Session._note_example`` reads it)."""
DRAWS = 200
"""Draws of the cell's deployment-size strategy tried for one that reaches the goal."""
CANDIDATES = 5
"""Draws reaching the goal among which the example is chosen (``preference``, then the cheapest
by ``case_work``); drawing goes on until one of them is preferred."""
SEED = 20261207


def applies(session: Any, op: str, prop: str, switch: str) -> bool:
    """Whether the cell has a deployment-size example: an enabled batch-invariance cell of an op
    with a deployment axis, in a space that draws deployment sizes."""
    spec = OPS.get(op)
    return (
        prop == "batch_invariance"
        and switch == "enabled"
        and spec is not None
        and bool(spec.scale)
        and session.space.scale_every > 0
    )


def deployment_case(session: Any, op: str, prop: str) -> Case | None:
    """The cell's deployment-size example, drawn once per session (None where no draw of
    ``DRAWS`` reached the goal: the op's strategy may not reach it in this space)."""
    cache: dict = session.drawn_examples
    key = ("deployment", op, prop)
    if key not in cache:
        cache[key] = _draw(session, op, prop)
    return cache[key]


def _draw(session: Any, op: str, prop: str) -> Case | None:
    from ..catalogue.strategies import cases
    from ..runner.controller import case_work
    from .modes import mode_space

    axis = OPS[op].scale
    space = replace(mode_space(session), scale_every=1)  # every draw at deployment size
    strategy = cases(space, op, prop, session.entries(op))

    def enough(drawn: list[Case]) -> bool:
        reached = [c for c in drawn if reaches_goal(axis, c)]
        return len(reached) >= CANDIDATES and any(preference(axis, c) == 0 for c in reached)

    reached = [c for c in generated(strategy, DRAWS, SEED, enough) if reaches_goal(axis, c)]
    # the cheapest of the preferred: the goal is the size along the axis, not the work around it
    chosen = min(reached, key=lambda c: (preference(axis, c), case_work(c)), default=None)
    if chosen is not None and chosen.dtype != "float32" and "float32" in space.dtypes:
        # float32: a changed reduction order rounds away in a 16-bit output more often than
        # not; the dtype is independent of the sizes drawn
        chosen = replace(chosen, dtype="float32")
    return chosen


def preference(axis: str, case: Case) -> int:
    """How well a case reaching the goal can show a size-keyed switch (0 is best): on the
    context axis, a needle of exactly a named switch point (``SCALE_POINTS``) beside a longer
    companion. A kernel that picks its split from the batch's longest sequence then runs one path
    for the needle alone and the other in the batch at every switch point from the needle's
    length up to the companion's, the needle's own included (a needle of 700 beside 3,000 keys
    misses a switch at 512)."""
    if axis != "context" or not case.shape or case.batch is None:
        return 0
    needle = int(case.shape[0])
    longer = any(c.rows > needle for c in case.batch.companions)
    return 0 if needle in SCALE_POINTS and longer else 1


def run_deployment(
    session: Any,
    op: str,
    prop: str,
    switch: str,
    stop_at: float | None = None,
    shrink_end: float | None = None,
) -> tuple[int, list]:
    """Run the cell's deployment-size example once per session (in each mode the run draws);
    return (examples judged, new failures), as ``explicit.run_explicit``."""
    cell = ("deployment", op, prop, switch)
    if cell in session.drawn_done or not applies(session, op, prop, switch):
        return 0, []
    session.drawn_done.add(cell)
    case = deployment_case(session, op, prop)
    if case is None:
        return 0, []
    from .modes import each_mode

    ready = [c for c in (for_entry(session, m) for m in each_mode(session, case)) if c]
    return run_cases(
        session, op, prop, switch, ready, DEPLOYMENT_NOTE, lambda c: None, stop_at, shrink_end
    )


__all__ = ["DEPLOYMENT_NOTE", "applies", "deployment_case", "run_deployment"]
