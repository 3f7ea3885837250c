"""Shrinking a failing case that Hypothesis did not draw: an explicit example, a case built by
hand, a case recorded elsewhere.

Hypothesis shrinks what its own strategy drew. A case that failed outside a search (a known
batch-variant case run first, as an explicit example) is handed to Hypothesis' shrinker anyway:
``reductions(base)`` is a strategy whose every draw is a simplification of ``base`` (fewer rows,
smaller extents, companions dropped, shorter or plain, the needle earlier, a simpler dtype,
layout, value class, no padding), drawn in a fixed order, and whose choice sequence for ``base``
itself is known (``choices_of``). That sequence is saved under the search's *secondary* key of an
in-memory example database (where Hypothesis keeps failing cases it has not minimised yet): the
search replays it first, sees it fail, and shrinks it like any failure it found itself. Where the
replay does not reproduce the failure, nothing is lost: the case stays as it was.

Below the session: its functions take the session as a ``ShrinkSession``, what they use of it.
Imports Hypothesis but never torch, like the session.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from ..model.case import (
    DTYPES,
    LAYOUTS,
    PARITY_DTYPES,
    VALUE_CLASSES,
    Batch,
    Case,
    Companion,
    case_size,
)
from . import hangs

if TYPE_CHECKING:
    from ..model.verdict import Verdict
    from .records import Failure

NOT_REPLAYED = "that did not fail again when replayed"
"""How a shrink ends whose base case passed when run again: the failure is ``flaky``."""
DTYPE_ORDER = (*DTYPES, *PARITY_DTYPES)
"""Dtypes in the order a shrink prefers them (float32 first)."""
SHRINK_EXAMPLES = 2000
"""Hypothesis' shrink budget for one case: ample; ``stop_at`` is the real bound."""


class ShrinkSession(Protocol):
    """What a shrink uses of the session (``Session`` is one): its target, and how it judges a
    candidate case and words a leak or a promise finding."""

    target: str

    def judge(self, op: str, prop: str, switch: str, case: Case) -> Verdict: ...

    def leak_message(self, op: str, prop: str, case: Case) -> str | None: ...

    def promise_message(self, op: str, evidence: str) -> str: ...


def _int(low: int, high: int, value: int, draws: list[Any]) -> st.SearchStrategy[int] | int:
    """An integer knob in [low, high] whose base value is ``value``: a draw (its choice is the
    value itself) when there is a range, else the constant."""
    if high <= low:
        return value
    draws.append(value)
    return st.integers(low, high)


def _pick(options: tuple, value: Any, draws: list[Any]) -> st.SearchStrategy | Any:
    """A choice among ``options`` (simplest first) whose base is ``value``."""
    if value not in options or len(options) < 2:
        return value
    draws.append(options.index(value))
    return st.sampled_from(options)


def _plan(base: Case) -> tuple[list, list[Any]]:
    """The knobs of ``base`` in draw order (each a strategy or a constant) and the choice
    sequence that reproduces ``base`` (one entry per strategy knob)."""
    choices: list[Any] = []
    knobs: list[Any] = [_int(1, base.shape[0], base.shape[0], choices)] if base.shape else []
    knobs += [_int(1, extent, extent, choices) for extent in base.shape[1:]]
    companions = base.batch.companions if base.batch is not None else ()
    for c in companions:
        if len(companions) > 1:
            choices.append(True)
            knobs.append(st.booleans())  # kept (shrinks toward dropped)
        knobs.append(_int(1, c.rows, c.rows, choices))
        if c.queries:
            knobs.append(_int(1, c.queries, c.queries, choices))
        if c.content != "plain":
            knobs.append(_pick(("plain", c.content), c.content, choices))
    if base.batch is not None:
        knobs.append(_int(0, len(companions), base.batch.position, choices))
    knobs.append(_pick(DTYPE_ORDER, base.dtype, choices))
    knobs += [_pick(LAYOUTS, layout, choices) for layout in base.layouts]
    knobs.append(_pick(VALUE_CLASSES, base.values, choices))
    knobs.append(_int(0, base.padded, base.padded, choices))
    return knobs, choices


def choices_of(base: Case) -> tuple:
    """The choice sequence under which ``reductions(base)`` draws ``base`` itself."""
    return tuple(_plan(base)[1])


@st.composite
def reductions(draw: st.DrawFn, base: Case) -> Case:
    """Simplifications of ``base`` (see the module's docstring); its choices ``choices_of(base)``
    give ``base`` itself, and every draw shrinks toward the simplest case of its structure."""
    knobs, _ = _plan(base)
    values = iter(draw(k) if isinstance(k, st.SearchStrategy) else k for k in knobs)
    shape = tuple(next(values) for _ in base.shape)
    batch = None
    if base.batch is not None:
        companions = base.batch.companions
        kept: list[Companion] = []
        for c in companions:
            keep = next(values) if len(companions) > 1 else True
            rows = next(values)
            queries = min(next(values), rows) if c.queries else 0
            content = next(values) if c.content != "plain" else "plain"
            if keep:
                kept.append(replace(c, rows=rows, queries=queries, content=content))
        if not kept:  # a batch needs a companion: the first, as simple as drawn
            first = companions[0]
            kept = [replace(first, rows=1, queries=min(first.queries, 1), content="plain")]
        position = min(next(values), len(kept))
        batch = Batch(position, tuple(kept))
    dtype = next(values)
    layouts = tuple(next(values) for _ in base.layouts)
    kind = next(values)
    padded = next(values)
    return replace(
        base,
        shape=shape,
        dtype=dtype,
        layouts=layouts,
        values=kind,
        batch=batch,
        padded=padded,
        options=dict(base.options),
    )


class _Stop(KeyboardInterrupt):
    """Ends the shrink at ``stop_at``: Hypothesis stops at once, records nothing."""


class _Same(AssertionError):
    """The candidate fails as the case did."""


def shrink(
    session: ShrinkSession,
    failure: Failure,
    stop_at: float | None = None,
    origin: str = "an explicit example",
) -> tuple[Failure, str]:
    """``failure`` with the smallest case found that fails like it (same property, switch,
    kind and exception type) and that case's message, and how the shrink ended, in words."""
    from hypothesis.database import InMemoryExampleDatabase, choices_to_bytes

    from ..runner.controller import DeadlineReached

    base = failure.case
    smallest = base
    message = failure.message
    database = InMemoryExampleDatabase()
    key = f"bi_props:shrink:{session.target}:{failure.op}:{failure.prop}".encode()
    database.save(key + b".secondary", choices_to_bytes(choices_of(base)))
    started = time.monotonic()

    @settings(
        database=database,
        max_examples=SHRINK_EXAMPLES,
        phases=[Phase.reuse, Phase.shrink],
        deadline=None,
        print_blob=False,
        suppress_health_check=list(HealthCheck),
        report_multiple_bugs=False,
    )
    @given(data=st.data())
    def search(data):
        nonlocal smallest, message
        case = data.draw(reductions(base), label="case")
        if stop_at is not None and time.monotonic() >= stop_at:
            raise _Stop()
        if hangs.confirmation_due(session, [failure]):  # a suspected hang's full confirmation
            raise _Stop(hangs.CONFIRMATION_WHY)
        try:
            seen = fails_like(session, failure, case)
        except DeadlineReached:  # the campaign's end: the smallest case seen stands
            raise _Stop() from None
        if seen is not None:
            if _size(case) < _size(smallest):
                smallest, message = case, seen
            raise _Same()

    search._hypothesis_internal_database_key = key
    search.hypothesis.inner_test._hypothesis_internal_add_digest = key
    spent = lambda: time.monotonic() - started  # noqa: E731
    how = f"not shrunk: {origin} {NOT_REPLAYED}"
    try:
        search()
    except _Stop as stop:
        why = str(stop) or "at the end of its time"
        how = (
            f"shrunk from {origin} for {spent():.0f} s, stopped {why}: the smallest failing "
            "case seen"
        )
    except _Same:
        how = f"shrunk by Hypothesis from {origin} ({spent():.1f} s)"
        if smallest is base:
            how = f"complete: {origin} that no simplification still fails"
    except Exception as exc:  # Hypothesis gave up: the case stays as it was
        how = f"not shrunk: {origin} ({type(exc).__name__} in the shrink)"
    return replace(failure, case=smallest, message=message), how


def _size(case: Case) -> tuple:
    return case_size(case)[:4]


def fails_like(session: ShrinkSession, failure: Failure, case: Case) -> str | None:
    """What ``case``'s failure says when it fails as ``failure`` did (the same kind, a promise
    finding being a mismatch of the observation, and where it names one the same exception
    type); None when it does not."""
    from ..runner.controller import WorkerFailure
    from .records import LEAK, PROMISE

    if failure.kind == LEAK:  # a leak needs the switch-off observation to differ
        return session.leak_message(failure.op, failure.prop, case)
    expected = failure.confirm_as or ("mismatch" if failure.kind == PROMISE else failure.kind)
    try:
        verdict = session.judge(failure.op, failure.prop, failure.switch, case)
    except WorkerFailure as exc:
        same = exc.kind == expected and type(exc).__name__ == (failure.error_type or "")
        return str(exc) if same else None
    except Exception:
        return None
    if verdict.ok or verdict.kind != expected:
        return None
    if failure.error_type and verdict.error_type not in (None, failure.error_type):
        return None
    if failure.kind == PROMISE:  # what was promised, then this case's evidence
        return session.promise_message(failure.op, verdict.message)
    return verdict.message


__all__ = ["choices_of", "fails_like", "reductions", "shrink"]
