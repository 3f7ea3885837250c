"""The building blocks of `bi-props fuzz`: cells and one time-boxed slice of a cell.

A cell is (op, property, switch state); a slice runs up to ``SLICE_EXAMPLES`` examples of it as one
Hypothesis run with its own seed and the campaign's example database (stable key per cell, so past
failures replay first). A failing slice is shrunk, confirmed in a fresh worker and recorded by the
session; the cell then keeps exploring for *other* bugs (each further distinct signature is shrunk
and recorded too, as Hypothesis' ``report_multiple_bugs`` does), its settled signatures skipped,
until ``settle_turn``'s rule retires it. campaign.py (local) and ray_runner.py (Ray actors) drive
them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

try:
    from builtins import BaseExceptionGroup, ExceptionGroup
except ImportError:  # Python 3.10: the backport Hypothesis itself depends on
    from exceptiongroup import BaseExceptionGroup, ExceptionGroup

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from ..catalogue import cells
from ..model.space import Space
from ..runner.controller import DeadlineReached
from .records import (
    FAILED_DIFFERENTLY,
    FLAKY_SHRINK,
    RETIRING_KINDS,
    Failure,
    as_flaky,
)
from .session import Session, case_size, internal_message, is_final_replay

SLICE_EXAMPLES = 10
KNOWN_ONLY_TURNS = 5
"""A cell retires after this many turns that met only settled signatures (its known bugs) and
found no new one: a cell that keeps failing with a known bug does not keep its share of the
budget for ever. Turns that met no failure at all do not count."""


@dataclass
class Cell:
    op: str
    prop: str
    switch: str
    examples: int = 0
    done: bool = False
    turns: int = 0  # slices run in this process (the first replays the example database)
    shrink_s: float = 0.0  # seconds this run spent after a slice's first failure (shrinking)
    findings: int = 0  # new signatures this cell recorded in this process
    known_only_turns: int = 0  # turns that met only settled signatures (``KNOWN_ONLY_TURNS``)
    found_new: bool = False  # the last slice recorded a new signature (Ray retires on it)
    retired_why: str = ""  # why ``done`` was set, in words (report.json's cells)

    @property
    def name(self) -> str:
        return f"{self.op} {self.prop} [{self.switch}]"


def cells_for(space: Space) -> list[Cell]:
    chosen = cells(space.ops, space.exclude_properties)
    return [Cell(op, prop, switch) for op, prop, switch in chosen]


class BudgetSpent(KeyboardInterrupt):
    """Raised inside a slice whose shrink ran past the campaign's end. A KeyboardInterrupt so
    that Hypothesis stops at once and neither shrinks it nor saves the example that was about to
    run as a failure; ``run_slice`` records the smallest failing case seen instead."""


class SameFailure(KeyboardInterrupt):
    """Raised inside a slice whose failure is of a class already recorded (the same exception
    from the same op in another property: ``session.failure_class``): no shrink, no second
    fresh-process confirmation; ``run_slice`` records it at once as the same failure."""


class TurnOver(KeyboardInterrupt):
    """Raised inside a slice whose turn is over (its time limit, or the campaign's end) while no
    failure is pending: the slice ends quietly, the cell stays live."""


class Interrupted(BaseException):
    """SIGTERM. A BaseException, like KeyboardInterrupt: Hypothesis must not take it for a failure
    of the example that was running (it would shrink it, call it flaky, and retire the cell)."""


def _on_sigterm(signum, frame):  # pragma: no cover - exercised through a subprocess test
    raise Interrupted()


def retires(failure: Failure) -> bool:
    """Whether a new finding of this failure retires its cell (``RETIRING_KINDS``)."""
    return failure.kind in RETIRING_KINDS or failure.error_type == "WorkerStartFailure"


def settle_turn(cell: Cell, new: list[Failure], met_known: bool, broken: bool = False) -> None:
    """The cell's fate after one slice. ``new``: the failures of signatures not settled before
    the slice (each now recorded); ``met_known``: the slice met a settled signature (skipped, or
    replayed from the database); ``broken``: the search itself failed (bi_props' error outside
    any example). A new finding keeps the cell exploring for other bugs unless its kind retires
    it (``retires``); a slice that met only known failures counts toward ``KNOWN_ONLY_TURNS``."""
    cell.found_new = bool(new)
    if cell.done:  # retired already (a driver may run one more slice): the reason stands
        return
    if broken:
        cell.done, cell.retired_why = True, "the search stopped: an error of bi_props"
        return
    if new:
        cell.findings += len(new)
        cell.known_only_turns = 0
        costly = sorted({f.kind for f in new if retires(f)})
        if costly:
            cell.done = True
            cell.retired_why = f"a {' and '.join(costly)} finding (each further one is costly)"
        return
    if met_known:
        cell.known_only_turns += 1
        if cell.known_only_turns >= KNOWN_ONLY_TURNS:
            cell.done = True
            cell.retired_why = (
                f"{cell.known_only_turns} turns met only its known failure(s), nothing new"
            )


def database_key(target: str, op: str, prop: str, switch: str) -> bytes:
    """The example-database key of one cell (stable across bi_props versions and processes)."""
    return f"bi_props:fuzz:{target}:{op}:{prop}:{switch}".encode()


def run_slice(
    session: Session,
    cell: Cell,
    examples: int,
    database,
    seed: int | None,
    stop_at: float | None = None,
    turn_end: float | None = None,
    stop_why: str = "at the end of the budget",
    floor: int = 0,
    floor_end: float | None = None,
) -> int:
    """Run up to ``examples`` examples of one cell; return how many ran. Every failure becomes a
    finding: recorded by the session on Hypothesis' final replay; a failure that did not happen
    again on replay is a finding of kind ``flaky`` (both observations in its message); an error
    of bi_props itself is a finding of kind ``internal``. A failure whose signature is settled
    (a known failure, or one already recorded) is skipped by later turns, which keep exploring
    the cell for other signatures; ``settle_turn`` says when the cell retires.

    ``stop_at`` (``time.monotonic()``) bounds shrinking: once a failure was seen, an example that
    would start after it ends the slice, and each failure is recorded with the smallest failing
    case seen so far (``Finding.shrink`` says so). A crash or hang costs a worker replacement per
    failing replay, and a hang the whole example timeout: without the bound, one hang could eat a
    campaign's budget many times over. SIGTERM or Ctrl-C during a shrink likewise records the
    smallest case seen (unconfirmed: there may be no time for a fresh process) and re-raises.
    ``stop_why`` says in each such finding why its shrink stopped at ``stop_at``.

    ``turn_end`` (``time.monotonic()``) is the turn's time limit: with no failure pending, an
    example that would start after it ends the slice (the first example always runs). An example
    the runner cut at the campaign's end (``DeadlineReached``) ends it the same way, or, with a
    failure pending, like the end of the budget during a shrink. ``floor``: the turn goes on
    past ``turn_end`` while the cell has judged fewer examples in this session, until
    ``floor_end`` (a claimed op's floor of evidence reached in one turn)."""
    count = 0
    first_failure: list[float] = []
    findings_before = len(getattr(session, "findings", ()))
    strategy = session.strategy(cell.op, cell.prop)
    smallest: dict[tuple, Failure] = {}  # failure signature -> smallest failing case seen
    settled: dict[tuple, bool] = {}  # failure signature -> settled when first seen this slice
    replayed: set[tuple] = set()  # signatures that failed again on the final replay
    finals: dict[tuple, Failure] = {}  # their final (minimal) failures, recorded after the slice
    deferred: set[tuple] = set()  # signatures ended as SameFailure (recorded as their class)
    started = time.monotonic()
    # The first turn of a cell replays the example database (past failures first; they fail and
    # are recorded as still failing). Later turns skip settled signatures instead of stopping at
    # them, and do not replay the database: a skipped failure would be deleted from it.
    first_turn = cell.turns == 0
    from . import hangs  # hang suspicion: a hang shows in seconds (campaigns/hangs.py)

    hangs.suspect_hangs(session)
    cell.turns += 1
    if first_turn and cell.prop == "reference" and hasattr(session, "swept"):
        # once per campaign: every 16-bit pattern through an elementwise op
        from .sweep import run_sweeps

        run_sweeps(session, cell.op, cell.switch)
    # Explicit examples first (campaigns/explicit.py): the known batch-variant cases of the op
    # and a case in every dtype of the contract, each once per session, then the draws.
    explicit_new: list[Failure] = []
    if getattr(session, "explicit_examples", False):
        from .explicit import run_explicit

        judged, explicit_new = run_explicit(
            session, cell.op, cell.prop, cell.switch, stop_at=turn_end, shrink_end=stop_at
        )
        count += judged
        if any(retires(f) for f in explicit_new):
            settle_turn(cell, explicit_new, False)
            return count
        # and once, an example at deployment size (campaigns/deployment_example.py)
        from .deployment_example import run_deployment

        judged, deployed_new = run_deployment(
            session, cell.op, cell.prop, cell.switch, stop_at=turn_end, shrink_end=stop_at
        )
        count += judged
        explicit_new += deployed_new
        if any(retires(f) for f in deployed_new):
            settle_turn(cell, explicit_new, False)
            return count
        # and once, every small size of each dimension (campaigns/small_cover.py)
        from .small_cover import run_small_cover

        judged, small_new = run_small_cover(
            session, cell.op, cell.prop, cell.switch, shrink_end=stop_at
        )
        count += judged
        explicit_new += small_new
        if any(retires(f) for f in small_new):
            settle_turn(cell, explicit_new, False)
            return count
    is_settled = getattr(session, "settled", lambda signature: False)
    accounted = getattr(session, "accounted", lambda failure: is_settled(failure.classed()))
    has_finding = getattr(session, "has_finding_for", lambda failure: False)
    same_failure = getattr(session, "same_failure", lambda failure: None)
    skipped = getattr(session, "skipped_known", {})
    skipped_before = skipped.get((cell.op, cell.prop, cell.switch), 0)
    broken = False  # the search failed outside any example (bi_props' own error)

    judged = getattr(session, "judged", {})
    key = (cell.op, cell.prop, cell.switch)

    def below_floor() -> bool:
        """Below the floor, within its time (``floor``, ``floor_end``)."""
        if not floor or floor_end is None or time.monotonic() >= floor_end:
            return False
        return judged.get(key, 0) < floor

    @settings(
        max_examples=examples,
        database=database,
        deadline=None,
        derandomize=False,
        print_blob=False,
        suppress_health_check=list(HealthCheck),
        # no explain phase: it replays the failure many times (a crash: a worker restart each)
        phases=[
            phase
            for phase in Phase
            if phase != Phase.explain and (first_turn or phase != Phase.reuse)
        ],
    )
    @given(data=st.data())
    def slice_test(data):
        nonlocal count, stop_why
        case = data.draw(strategy, label="case")
        past_end = stop_at is not None and time.monotonic() >= stop_at
        if smallest and not past_end and hangs.confirmation_due(session, smallest.values()):
            past_end, stop_why = True, hangs.CONFIRMATION_WHY  # its full-timeout confirmation
        if smallest and past_end and not is_final_replay():  # the final replay records itself
            raise BudgetSpent()
        over = turn_end is not None and time.monotonic() >= turn_end
        if not smallest and count and over and not below_floor():
            raise TurnOver()
        session.last_failure = None
        try:
            session.check(cell.op, cell.prop, cell.switch, case)
        except DeadlineReached:  # cut by the campaign's end: not judged, not counted
            if smallest:
                raise BudgetSpent() from None
            raise TurnOver() from None
        except Exception:
            count += 1  # judged: it failed

            if not first_failure:
                first_failure.append(time.monotonic())
            failure = session.last_failure
            if failure is not None:
                # one Hypothesis failure per cell and kind; settled: its class is recorded
                # or known (``Failure.classed``), so another dtype or size is not hidden. Once
                # one is raised, nothing is skipped for the rest of the slice: its shrink may
                # pass through a settled class (and ends there if it is the same bug).
                session.skip_settled = False
                signature = failure.signature()
                if signature not in settled and not accounted(failure):
                    _prewarm(session, cell.switch, len(smallest) + 1)
                settled.setdefault(signature, accounted(failure))
                if is_final_replay():
                    replayed.add(signature)
                    finals[signature] = failure
                kept = smallest.get(signature)
                if kept is None or case_size(failure.case) < case_size(kept.case):
                    smallest[signature] = failure
                if not settled[signature] and same_failure(failure) is not None:
                    deferred.add(signature)
                    raise SameFailure() from None  # its class was shrunk and confirmed once
            raise
        count += 1  # judged: it held (or was counted apart by the session: degenerate, ...)

    key = database_key(session.target, cell.op, cell.prop, cell.switch)
    slice_test.hypothesis.inner_test._hypothesis_internal_add_digest = key
    # The database key is the cell's name, not a digest of this function's source: past failures
    # replay first in every later run (and campaign), whatever edits this file sees.
    slice_test._hypothesis_internal_database_key = key
    if seed is not None:  # a campaign's derived seed: this turn's randomness is reproducible
        slice_test = hypothesis_seed(seed)(slice_test)
        # @seed also switches the example database off (Settings(database=None)); a campaign
        # needs both, so the database is put back.
        slice_test._hypothesis_internal_use_settings = settings(
            slice_test._hypothesis_internal_use_settings, database=database
        )
    # (a first turn whose explicit examples recorded a failure skips it too: no second
    # finding of that signature, no shrink of a failure already recorded this run)
    session.skip_settled = not first_turn or bool(explicit_new)
    # The final replay's failure is recorded after the slice (``_record_final``), so that one
    # drawn near a known case can be reduced further first, outside Hypothesis' own test.
    deferred_before = getattr(session, "defer_finalize", False)
    session.defer_finalize = True
    try:
        try:
            slice_test()
        except BaseExceptionGroup as group:  # several distinct failures, maybe with a signal
            if isinstance(group, Exception):  # failures only (or Flaky): the general path
                raise
            raise _deciding(group) from None
    except TurnOver:
        pass
    except SameFailure:  # recorded at once (finalize refers to the first of its class)
        for failure in smallest.values():
            if not has_finding(failure) and not _unproven_class(session, failure):
                session.finalize(failure)
    except BudgetSpent:
        spent = time.monotonic() - started
        for failure in smallest.values():
            if _unproven_class(session, failure):
                continue
            session.finalize(
                failure,
                shrink=f"stopped {stop_why} after {spent:.0f} s of this cell: "
                "the smallest failing case seen, not necessarily minimal",
            )
    except (KeyboardInterrupt, Interrupted):
        for failure in smallest.values():
            session.finalize(
                failure,
                shrink="interrupted while shrinking: the smallest failing case seen",
                confirm=False,
            )
        raise
    except Exception as exc:  # findings (PropertyFailed, WorkerFailure, several), or Flaky
        flaky = _hypothesis_flaky(exc)
        for signature, failure in smallest.items():
            if signature in deferred:  # one of several failures: recorded as its class
                if not has_finding(failure):
                    session.finalize(failure)
                continue
            if signature in replayed:
                continue
            if flaky and session.passed_again(failure):  # the very case passed when rerun
                _record_flaky(session, failure)
            elif flaky:  # failed again, but differently (a crash, then a timeout under load)
                if not has_finding(failure):
                    session.finalize(failure, shrink=FAILED_DIFFERENTLY)
            elif not _unproven_class(session, failure):  # shrunk away inside another
                session.finalize(  # failure of the same origin: still a finding
                    failure,
                    shrink="seen while Hypothesis shrank another failure of the same origin: "
                    "the smallest failing case seen, not necessarily minimal",
                )
        if not smallest:  # an error outside any example: bi_props' own, never a silent retire
            session.internal(f"{cell.name}: the search stopped: {internal_message(exc)}")
        broken = not smallest
    finally:
        session.skip_settled = False
        session.defer_finalize = deferred_before
        # (a stand-in session without ``recorded`` records on its final replay itself)
        for failure in finals.values() if hasattr(session, "recorded") else ():
            if not has_finding(failure):
                _record_final(session, failure, stop_at)
        if first_failure:
            cell.shrink_s += time.monotonic() - first_failure[0]
    new = [failure for signature, failure in smallest.items() if not settled[signature]]
    new = [failure for failure in new if not hangs.noted(session, failure)]  # no finding
    if hasattr(session, "findings"):  # what this turn recorded anew (a shrink that ended in a
        # recorded class recorded nothing), the explicit examples' included
        new = [f for f in session.findings[findings_before:] if f.status != "known"]
    else:
        new = explicit_new + new
    skipped_now = skipped.get((cell.op, cell.prop, cell.switch), 0) > skipped_before
    met_known = skipped_now or any(settled.values())
    settle_turn(cell, new, met_known, broken)
    return count


def _unproven_class(session, failure: Failure) -> bool:
    """A failure whose shrink did not finish, of a cell and kind that already has a finding:
    only a finished shrink shows it is another class (another bug) and not the recorded one
    met at a larger case; so it is counted as met (``skipped_known``), not recorded."""
    findings = getattr(session, "findings", None)
    if not findings or not hasattr(session, "skipped_known"):
        return False
    cell = (failure.op, failure.prop, failure.switch)
    mine = (session.target, *cell, failure.kind, failure.error_type)
    if not any(f.signature()[:6] == mine for f in findings):
        return False
    session.skipped_known[cell] = session.skipped_known.get(cell, 0) + 1
    return True


def _record_final(session: Session, failure: Failure, stop_at: float | None) -> None:
    """Record the minimal failure of Hypothesis' shrink (``Session.record_final``)."""
    session.record_final(failure, stop_at=stop_at)


def _prewarm(session, switch: str, count: int) -> None:
    """A failure seen for the first time will be confirmed in a fresh process after its shrink:
    start that interpreter now (``count`` per switch state, one per failure of the slice), so
    its import overlaps the shrink (a vLLM import is most of a 13 s confirmation on 2 cores)."""
    prewarm = getattr(getattr(session, "runner", None), "prewarm", None)
    if prewarm is None:
        return
    for state in ("disabled", "enabled") if switch == "both" else (switch,):
        prewarm(state, count)


def _members(group: BaseExceptionGroup) -> list[BaseException]:
    """The members of a (possibly nested) exception group, a group of failures only (an
    ExceptionGroup, Hypothesis' FlakyFailure among them) kept whole."""
    leaves: list[BaseException] = []
    for member in group.exceptions:
        nested = isinstance(member, BaseExceptionGroup) and not isinstance(member, Exception)
        leaves.extend(_members(member) if nested else [member])
    return leaves


def _deciding(group: BaseExceptionGroup) -> BaseException:
    """The one exception that decides how a slice ends when Hypothesis reports several distinct
    failures at once (an exception group), since the slice's own signals (KeyboardInterrupt
    subclasses) may be among them: a real interrupt first (SIGTERM, Ctrl-C), then the end of the
    budget, then the real failures (an ExceptionGroup of them: each is a finding), and only when
    nothing else failed, SameFailure. Without this, a slice with one failure of a recorded class
    and one new failure ended the whole campaign with an uncaught exception group."""
    members = _members(group)
    signals = (BudgetSpent, SameFailure, TurnOver)
    interrupts = [m for m in members if isinstance(m, (Interrupted, KeyboardInterrupt))]
    failures = [m for m in members if isinstance(m, Exception)]
    ranked = (
        [m for m in interrupts if not isinstance(m, signals)]
        + [m for m in members if isinstance(m, BudgetSpent)]
        + ([ExceptionGroup(str(group), failures)] if failures else [])
        + [m for m in members if isinstance(m, (SameFailure, TurnOver))]
    )
    return ranked[0] if ranked else group


def _hypothesis_flaky(exc: BaseException) -> bool:
    """Whether Hypothesis itself said a replay was inconsistent (its Flaky, or an exception
    group holding one). Necessary, not sufficient, for a ``flaky`` finding: Hypothesis raises it
    also when the same case fails with another error on replay, and a signature it folded into
    another failure of the same origin while shrinking was never replayed at all; neither is
    evidence of nondeterminism. A ``flaky`` finding also needs its very case to have passed when
    run again (``Session.passed_again``)."""
    from hypothesis.errors import Flaky

    if isinstance(exc, Flaky):
        return True
    group = getattr(exc, "exceptions", None)  # an ExceptionGroup (3.11, or the 3.10 backport)
    if isinstance(group, (list, tuple)):
        return any(_hypothesis_flaky(e) for e in group)
    return False


def _record_flaky(session: Session, failure: Failure) -> None:
    """A failure that passed when Hypothesis replayed the very same case: a ``flaky`` finding
    (``records.as_flaky``)."""
    session.finalize(as_flaky(failure), shrink=FLAKY_SHRINK, confirm_kind=failure.kind)
