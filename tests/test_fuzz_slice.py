"""``fuzz.run_slice`` bounds shrinking by the campaign's end: past ``stop_at`` (once a failure was
seen) the slice ends and each failure is recorded with the smallest failing case seen; SIGTERM or
Ctrl-C during a shrink records the smallest case unconfirmed and re-raises. The session is a fake
here (no workers): what is checked is the slice's control flow and what it hands to the session.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import pytest
from hypothesis import strategies as st

from bi_props.campaigns.fuzz import (
    KNOWN_ONLY_TURNS,
    Cell,
    Interrupted,
    retires,
    run_slice,
    settle_turn,
)
from bi_props.campaigns.records import Failure, PropertyFailed
from bi_props.campaigns.session import case_size, is_final_replay
from bi_props.model.case import Case


def mm_case(m: int, k: int) -> Case:
    return Case("mm", "torch.mm", "float32", (m, k, 2), ("contiguous",) * 2, "general", 0)


@dataclass
class FakeSession:
    """The part of Session that run_slice uses. The planted bug: any case with m >= 20 fails.
    ``interrupt_after`` raises an interrupt at that many failing examples (a SIGTERM mid-shrink)."""

    target: str = "fake"
    seconds_per_example: float = 0.0
    interrupt_after: int | None = None
    last_failure: Failure | None = None
    failing: list[Case] = field(default_factory=list)
    finalized: list[tuple[Failure, str, bool]] = field(default_factory=list)
    final_replays: int = 0

    def strategy(self, op: str, prop: str):
        return st.builds(mm_case, st.integers(1, 64), st.integers(0, 64))

    def check(self, op: str, prop: str, switch: str, case: Case) -> None:
        time.sleep(self.seconds_per_example)
        if case.shape[0] < 20:
            return
        self.failing.append(case)
        if self.interrupt_after is not None and len(self.failing) >= self.interrupt_after:
            raise Interrupted()
        self.last_failure = Failure(op, prop, switch, case, "mismatch", "m >= 20", None)
        if is_final_replay():
            self.final_replays += 1
            self.finalize(self.last_failure)
        raise PropertyFailed("m >= 20")

    def finalize(self, failure: Failure, shrink: str = "complete", confirm: bool = True) -> None:
        self.finalized.append((failure, shrink, confirm))


def test_without_an_end_the_slice_shrinks_to_the_minimal_case() -> None:
    session = FakeSession()
    cell = Cell("mm", "reference", "enabled")
    run_slice(session, cell, 200, None, seed=3)
    assert not cell.done and cell.findings == 1  # a mismatch: the cell explores for other bugs
    [(failure, shrink, confirm)] = session.finalized
    assert (failure.case.shape, shrink, confirm) == ((20, 0, 2), "complete", True)
    assert session.final_replays == 1


def test_past_its_end_the_slice_records_the_smallest_failing_case_seen() -> None:
    session = FakeSession()
    cell = Cell("mm", "reference", "enabled")
    run_slice(session, cell, 200, None, seed=3, stop_at=time.monotonic())
    assert not cell.done and cell.findings == 1
    [(failure, shrink, confirm)] = session.finalized
    assert shrink.startswith("stopped at the end of the budget")
    assert confirm  # confirmed in a fresh process like any finding
    assert session.final_replays == 0
    assert failure.case == min(session.failing, key=case_size)
    # The slice stopped at the first example after the first failure: no shrinking happened.
    assert len(session.failing) == 1


def test_a_bound_reached_during_the_shrink_stops_it_early() -> None:
    full = FakeSession()
    run_slice(full, Cell("mm", "reference", "enabled"), 200, None, seed=5)
    shrink_steps = len(full.failing)
    assert shrink_steps > 3

    session = FakeSession(seconds_per_example=0.01)
    cell = Cell("mm", "reference", "enabled")
    run_slice(session, cell, 200, None, seed=5, stop_at=time.monotonic() + 0.3)
    [(failure, shrink, _)] = session.finalized
    if shrink == "complete":  # a fast machine may finish the whole shrink within 0.3 s
        assert failure.case.shape == (20, 0, 2)
    else:
        assert len(session.failing) < shrink_steps
        assert failure.case == min(session.failing, key=case_size)


def test_an_interrupt_during_the_shrink_records_the_smallest_case_unconfirmed() -> None:
    session = FakeSession(interrupt_after=3)
    cell = Cell("mm", "reference", "enabled")
    with pytest.raises(Interrupted):
        run_slice(session, cell, 200, None, seed=3)
    [(failure, shrink, confirm)] = session.finalized
    assert shrink.startswith("interrupted while shrinking")
    assert confirm is False
    assert failure.case == min(session.failing[:2], key=case_size)


def test_an_interrupt_before_any_failure_records_nothing() -> None:
    session = FakeSession(interrupt_after=1)
    with pytest.raises(Interrupted):
        run_slice(session, Cell("mm", "reference", "enabled"), 200, None, seed=3)
    assert session.finalized == []


def test_case_size_orders_by_elements_then_extents() -> None:
    assert case_size(mm_case(20, 0)) < case_size(mm_case(20, 1)) < case_size(mm_case(21, 1))
    assert case_size(mm_case(1, 64)) < case_size(mm_case(2, 64))


def _failure(kind: str, error_type: str | None = None) -> Failure:
    return Failure("mm", "reference", "enabled", mm_case(1, 1), kind, "x", error_type)


def test_a_new_finding_keeps_the_cell_exploring_unless_its_kind_is_costly() -> None:
    """Every distinct bug in a cell: a mismatch or an error keeps the cell live;
    a crash, a hang, bi_props' own error or a worker that does not start retire it, since
    every later example meeting them again costs a worker or a whole timeout."""
    cell = Cell("mm", "reference", "enabled")
    settle_turn(cell, [_failure("mismatch")], met_known=False)
    assert not cell.done and cell.findings == 1 and cell.found_new
    settle_turn(cell, [_failure("error", "ValueError")], met_known=True)
    assert not cell.done and cell.findings == 2
    for kind, error_type in [
        ("crash", "WorkerCrash"),
        ("timeout", "WorkerHang"),
        ("internal", "KeyError"),
        ("error", "WorkerStartFailure"),
    ]:
        assert retires(_failure(kind, error_type)), kind
        costly = Cell("mm", "reference", "enabled")
        settle_turn(costly, [_failure("mismatch"), _failure(kind, error_type)], met_known=False)
        assert costly.done and kind in costly.retired_why, (kind, costly)
    assert not retires(_failure("flaky")) and not retires(_failure("promise"))


def test_a_cell_meeting_only_its_known_bugs_retires_after_a_bounded_number_of_turns() -> None:
    """A cell that keeps failing with a known signature (skipped: no shrink) retires after
    KNOWN_ONLY_TURNS turns that found nothing new; turns that met no failure do not count, and
    a new distinct finding starts the count again."""
    cell = Cell("mm", "reference", "enabled")
    settle_turn(cell, [_failure("mismatch")], met_known=False)
    for _ in range(KNOWN_ONLY_TURNS - 1):
        settle_turn(cell, [], met_known=True)
        settle_turn(cell, [], met_known=False)  # a clean turn: not counted
    assert not cell.done and cell.known_only_turns == KNOWN_ONLY_TURNS - 1
    settle_turn(cell, [_failure("error", "ValueError")], met_known=True)  # new: count again
    assert cell.known_only_turns == 0 and not cell.done
    for _ in range(KNOWN_ONLY_TURNS):
        assert not cell.done
        settle_turn(cell, [], met_known=True)
    assert cell.done and not cell.found_new
    assert (
        cell.retired_why == f"{KNOWN_ONLY_TURNS} turns met only its known failure(s), nothing new"
    )


def test_a_search_that_failed_outside_any_example_retires_the_cell() -> None:
    cell = Cell("mm", "reference", "enabled")
    settle_turn(cell, [], met_known=False, broken=True)
    assert cell.done and "error of bi_props" in cell.retired_why
