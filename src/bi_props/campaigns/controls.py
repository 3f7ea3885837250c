"""The negative controls: a search for batch variance with the switch off, in turns.

Also the helpers the search shares with the session and the fuzz slice (``case_size``,
``is_final_replay``, ``internal_message``); ``bi_props.campaigns.session`` re-exports them.
Imports Hypothesis but never torch, like the session.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from hypothesis.control import current_build_context

from ..model import property_spec
from ..model.case import Case
from ..runner.controller import DeadlineReached, WorkerFailure

if TYPE_CHECKING:
    from .session import Session


@dataclass
class Control:
    """What a negative control (a control property with the switch off) saw for one op."""

    op: str
    property: str
    variance_seen: bool
    case: str | None
    message: str
    examples: int = 0  # searched (no variance yet); shrink replays are not counted
    # "not run", "searching" (examples left, no variance yet), "shrinking" (variance seen, the
    # shrink was cut: a later turn continues it), or "done".
    state: str = "done"
    shrink: str = "complete"


def case_size(case: Case) -> tuple:
    """An order on cases, smallest first: elements across the batch, then extents, companions
    and the repr (to break ties). Used to keep the smallest failing case seen while shrinking."""
    rows = case.shape[0] if case.shape else 0
    if case.batch is not None:
        rows += sum(c.rows for c in case.batch.companions)
    per_row = 1
    for extent in case.shape[1:]:
        per_row *= max(extent, 1)
    companions = 0 if case.batch is None else len(case.batch.companions)
    return (rows * per_row, sum(case.shape), companions, len(repr(case)), repr(case))


def internal_message(exc: BaseException) -> str:
    """What a finding of kind ``internal`` says: a bug of bi_props, with its traceback."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip()
    return (
        f"bi_props itself failed ({type(exc).__name__}: {exc}); this is a bug of bi_props, not "
        f"a finding about the target. Please report it with this traceback:\n{text}"
    )


def is_final_replay() -> bool:
    try:
        return bool(current_build_context().is_final)
    except Exception:  # outside a Hypothesis test (e.g. a direct call): treat as final
        return True


def control_entry(session: Session, op: str, prop: str) -> Control:
    """The control of (op, prop) in the session, added ("not run") on first use."""
    for control in session.controls:
        if (control.op, control.property) == (op, prop):
            return control
    control = Control(op, prop, False, None, "not run", state="not run", shrink="not started")
    session.controls.append(control)
    return control


def run_control(
    session: Session,
    op: str,
    prop: str = "batch_invariance",
    *,
    examples: int | None = None,
    stop_at: float | None = None,
    seed: int | None = None,
    database=None,
    shrink: bool = True,
) -> Control:
    """One turn of a negative control: search for batch variance with the switch off, and
    shrink what shows it toward the smallest case.

    Never a failure: it shows that the test can see variance at all (stock kernels are not
    promised to be invariant). Its budget, ``[runner] control_examples`` of the space, is
    spent over turns of up to ``examples`` examples (all of it when None); the search stops
    at the first variance. ``stop_at`` (``time.monotonic()``) bounds the turn: no example
    starts after it (the first always runs), so a shrink in flight stops there with the
    smallest case seen by ``case_size``, and a later turn continues it from the example
    database (``database``: the campaign's; without one, the cut shrink is final). With
    ``shrink`` False the turn ends at its first variance (saved in the example database; a
    later turn shrinks it): the campaign's scheduler leaves the time to the controls still
    searching. The control's ``state`` says where it stands: searching, shrinking, or done."""
    control = control_entry(session, op, prop)
    if control.state == "done":
        return control
    judge = property_spec.get(prop).judge
    strategy = session.strategy(op, prop)
    left = session.space.control_examples - control.examples
    count = 0
    errors: list[str] = []
    internal: list[str] = []  # errors of bi_props itself: an internal error of the run
    searched: list[int] = []
    variants: list[tuple[Case, str]] = []  # every variant case seen, in order
    started = time.monotonic()

    class _Variant(AssertionError):
        pass

    class _Stop(KeyboardInterrupt):  # Hypothesis stops at once, saves nothing as a failure
        pass

    profile = settings()  # the current profile (pytest's, or the campaign's)
    database = database if database is not None else profile.database

    @settings(
        profile,
        max_examples=max(1, left if examples is None else min(examples, left)),
        database=database,
        deadline=None,  # a first example may start a worker; timing belongs to benchmarks
        derandomize=profile.derandomize if seed is None else False,
        print_blob=False,
        suppress_health_check=list(HealthCheck),
        phases=[phase for phase in Phase if phase != Phase.explain],
    )
    @given(data=st.data())
    def search(data):
        nonlocal count, stop_at
        case = data.draw(strategy, label="case")
        past_end = count and stop_at is not None and time.monotonic() >= stop_at
        if past_end and not is_final_replay():
            raise _Stop()
        count += 1
        try:
            verdict = judge(session.runner.observe(prop, case, "disabled"))
        except DeadlineReached:
            raise _Stop() from None
        except WorkerFailure as exc:  # the disabled cells report it; here it is no variance
            errors.append(str(exc).splitlines()[0])
            return
        except Exception as exc:  # InternalError from a worker, or a judge's bug: ours
            internal.append(internal_message(exc))
            raise _Stop() from None
        if not verdict.ok:
            if not variants:
                searched.append(count)  # examples until the first variance
                if not shrink:  # no shrink in this turn: it ends at the next example
                    stop_at = time.monotonic()
            variants.append((case, verdict.message))
            raise _Variant()

    key = f"bi_props:control:{session.target}:{op}:{prop}".encode()
    search.hypothesis.inner_test._hypothesis_internal_add_digest = key
    search._hypothesis_internal_database_key = key
    if seed is not None:
        search = hypothesis_seed(seed)(search)
        search._hypothesis_internal_use_settings = settings(
            search._hypothesis_internal_use_settings, database=database
        )
    complete = False
    try:
        search()
    except _Stop:
        pass
    except Exception as exc:  # the variance, shrunk (Hypothesis' last replay is minimal)
        complete = bool(variants)
        if not variants:  # no variance raised it: an error of bi_props (or Hypothesis')
            internal.append(internal_message(exc))
    if internal:  # never a silent "searching": the run's internal errors and exit status 3
        where = f"negative control {op} {prop} [disabled]"
        session.internal(f"{where}: {internal[0]}")
        first = internal[0].splitlines()[0]
        if not control.variance_seen:
            control.examples += count
            control.state = "done"
            control.shrink = "not started"
            control.message = f"INTERNAL ERROR after {control.examples} example(s): {first}"
            session.write_report()
            return control
    if not control.variance_seen:
        control.examples += searched[0] if searched else count
    if variants:
        if complete:
            case, message = variants[-1]
            shrink = "complete"
        else:
            case, message = min(variants, key=lambda v: case_size(v[0]))
            spent = time.monotonic() - started
            shrink = f"cut after {spent:.1f} s of this turn: the smallest case seen" + (
                "" if database is not None else " (final: no example database to resume)"
            )
        control.variance_seen = True
        control.case = repr(case)
        control.message = message
        control.shrink = shrink
        control.state = "done" if complete or database is None else "shrinking"
    elif control.variance_seen:  # a shrinking control whose saved case no longer varies
        control.state = "done"
    elif control.examples >= session.space.control_examples:
        control.state = "done"
        control.shrink = "not needed"
        control.message = f"no {prop} violation seen in {control.examples} examples"
    else:
        control.state = "searching"
        control.shrink = "not started"
        control.message = (
            f"no {prop} violation seen yet in {control.examples} of "
            f"{session.space.control_examples} examples"
        )
    if errors:
        control.message += f" ({len(errors)} example(s) failed in the worker: {errors[0]})"
    session.write_report()
    return control
