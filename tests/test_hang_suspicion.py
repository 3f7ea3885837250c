"""Hang suspicion: while searching and shrinking, a hang is suspected from the op's own observed
cost (``min(example_timeout_s, max(SUSPECT_FLOOR_S, SUSPECT_FACTOR x slowest))``), not after the
profile's whole example timeout; the finding of a hang still needs a fresh process that waits the
full timeout, and a suspicion it does not confirm is a note, never an exit-1 finding
(runner/controller.py, campaigns/hangs.py).

The first tests need no worker. The end-to-end ones use tests/planted/planted_hang.py (mm never
returns for K == 7) and a library written here that is only slow for K == 7; their profiles'
example timeout is 15 s, a suspicion's 5 s.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from bi_props.campaigns import hangs
from bi_props.campaigns.fuzz import Cell, run_slice
from bi_props.campaigns.records import Failure
from bi_props.campaigns.session import Session
from bi_props.model.case import Batch, Case, Companion
from bi_props.model.space import parse
from bi_props.reporting.data import exit_status
from bi_props.runner.controller import (
    SUSPECT_FACTOR,
    SUSPECT_FLOOR_S,
    Runner,
    WorkerHang,
    case_work,
    suspect_timeout,
)

PLANTED = Path(__file__).resolve().parent / "planted"
FULL_S = 15.0  # the end-to-end profiles' example timeout: 3x a suspicion's floor


def mm_case(m: int = 3, k: int = 5, n: int = 4, seed: int = 0) -> Case:
    return Case(
        "mm", "torch.mm", "float32", (m, k, n), ("contiguous", "contiguous"), "general", seed
    )


# -- the timeout, no worker --------------------------------------------------------------------


def test_the_constants_say_a_generous_factor_and_a_floor_of_seconds() -> None:
    assert SUSPECT_FACTOR >= 10
    assert 2 <= SUSPECT_FLOOR_S <= 10


def test_suspect_timeout_floor_factor_cap_and_first_call() -> None:
    assert suspect_timeout(60, None) == 60  # nothing observed yet: the full timeout
    assert suspect_timeout(60, 0.001) == SUSPECT_FLOOR_S  # milliseconds: the floor
    assert suspect_timeout(60, 1.0) == SUSPECT_FACTOR * 1.0  # the factor
    assert suspect_timeout(60, 10.0) == 60  # never past the profile's timeout
    assert suspect_timeout(2, 0.001) == 2  # a profile shorter than the floor keeps its own
    assert suspect_timeout(60, 0.5, scale=4) == SUSPECT_FACTOR * 0.5 * 4  # a larger case
    assert suspect_timeout(60, 0.5, scale=0.1) == SUSPECT_FACTOR * 0.5  # never scaled down


def test_case_work_counts_the_batch_rows_and_the_other_extents() -> None:
    assert case_work(mm_case(3, 7, 4)) == 3 * 7 * 4
    batched = Case(
        "mm",
        "torch.mm",
        "float32",
        (3, 7, 4),
        ("contiguous", "contiguous"),
        "general",
        0,
        batch=Batch(0, (Companion(1, 5),)),
    )
    assert case_work(batched) == (3 + 5) * 7 * 4
    assert case_work(mm_case(3, 0, 4)) == 3 * 4  # an empty extent still costs a call


def test_the_runner_suspects_from_completed_calls_of_the_same_cell() -> None:
    runner = Runner("planted_hang", example_timeout_s=60, suspect_hangs=True)  # never started
    small, large = mm_case(2, 3, 2), mm_case(20, 30, 20)
    assert runner.example_timeout("reference", small, "enabled") == (60, "")  # first call
    runner.observed("mm", "reference", "enabled", small, 0.5)
    timeout, why = runner.example_timeout("reference", small, "enabled")
    assert timeout == SUSPECT_FACTOR * 0.5 and "a hang suspected" in why
    assert "the profile's example timeout is 60 s" in why
    # ten times the work of the largest completed call: ten times the time allowed (capped)
    runner.observed("mm", "reference", "enabled", small, 0.01)  # the slowest stays 0.5 s
    assert runner.example_timeout("reference", large, "enabled")[0] == 60
    runner.observed("mm", "reference", "enabled", mm_case(10, 30, 20), 0.05)
    assert runner.example_timeout("reference", large, "enabled")[0] == 20.0  # 2x the work
    # another property, the other switch state, a spawned worker's first call: full timeout
    assert runner.example_timeout("determinism", small, "enabled") == (60, "")
    assert runner.example_timeout("reference", small, "disabled") == (60, "")
    assert runner.example_timeout("reference", small, "enabled", warming=True) == (60, "")
    runner.trust("mm", "reference", "enabled")  # a suspicion there was not confirmed
    assert runner.example_timeout("reference", small, "enabled") == (60, "")


def test_without_suspicion_every_example_waits_the_full_timeout() -> None:
    """The pytest plugin's runner: a failed test cannot be taken back, so no suspicion."""
    runner = Runner("planted_hang", example_timeout_s=60)
    runner.observed("mm", "reference", "enabled", mm_case(), 0.001)
    assert runner.example_timeout("reference", mm_case(), "enabled") == (60, "")


def test_a_suspicion_is_kept_per_case_and_a_full_timeout_hang_clears_it() -> None:
    runner = Runner("planted_hang", example_timeout_s=60, suspect_hangs=True)
    runner._hung("parity", mm_case(k=7), "enabled", " (a hang suspected: ...)")
    assert runner.suspicion("parity", mm_case(k=7), "enabled") == "a hang suspected: ..."
    assert runner.suspicion("parity", mm_case(k=7), "both") is not None  # parity's cells
    assert runner.suspicion("parity", mm_case(k=8), "enabled") is None
    runner._hung("parity", mm_case(k=7), "enabled", "")  # it hung the full timeout
    assert runner.suspicion("parity", mm_case(k=7), "enabled") is None


class _Known:
    def matches(self, signature: tuple) -> bool:
        return False


class _Session:
    """What ``hangs.settle_suspicion`` reads of a Session."""

    target = "planted_hang"
    known = (_Known(),)

    def __init__(self) -> None:
        self.runner = Runner("planted_hang", example_timeout_s=60, suspect_hangs=True)
        self.hang_suspicions: list[dict] = []
        self.reports = 0

    def write_report(self) -> None:
        self.reports += 1


def _failure(kind: str = "timeout", case: Case | None = None) -> Failure:
    case = case or mm_case(k=7)
    return Failure("mm", "reference", "enabled", case, kind, "no answer within 5 s", "WorkerHang")


def test_an_unconfirmed_suspicion_is_a_note_and_its_cell_gets_the_full_timeout() -> None:
    session = _Session()
    session.runner.observed("mm", "reference", "enabled", mm_case(), 0.001)
    session.runner._hung("reference", mm_case(k=7), "enabled", " (a hang suspected: x)")
    passed = "not reproduced: the case passed in a fresh worker"
    noted, _ = hangs.settle_suspicion(session, _failure(), None, False, passed, "complete")
    assert noted and session.reports == 1
    [note] = session.hang_suspicions
    assert note["confirmation"] == passed and note["suspicion"] == "a hang suspected: x"
    assert "not a finding" in note["outcome"]
    assert hangs.noted(session, _failure())
    assert session.runner.example_timeout("reference", mm_case(), "enabled") == (60, "")
    # a suspected hang whose replay passed (a flaky finding's first kind: timeout): slowness
    flaky = _failure("flaky")
    noted, _ = hangs.settle_suspicion(session, flaky, "timeout", None, "cut", "not shrunk")
    assert noted and len(session.hang_suspicions) == 1  # the same case: noted once
    # confirmed: a finding, its confirmation says the full timeout was waited
    noted, words = hangs.settle_suspicion(session, _failure(), None, True, "reproduced", "")
    assert not noted and "full example timeout (60 s) waited" in words
    # a hang that waited the full timeout, or another kind: not a suspicion's business
    for other in (_failure(case=mm_case(k=9)), _failure("crash")):
        assert hangs.settle_suspicion(session, other, None, False, "x", "") == (False, "x")


def test_a_shrink_stops_where_a_full_timeout_confirmation_would_not_fit() -> None:
    session = _Session()
    runner = session.runner
    runner.observed("mm", "reference", "enabled", mm_case(), 0.001)
    runner._hung("reference", mm_case(k=7), "enabled", " (a hang suspected: x)")
    pending = [_failure()]
    assert not hangs.confirmation_due(session, pending)  # no campaign end
    runner.deadline = time.monotonic() + 200
    assert not hangs.confirmation_due(session, pending)
    runner.deadline = time.monotonic() + 60  # less than 5 s + 5 s + (60 - 5) s
    assert hangs.confirmation_due(session, pending)
    assert not hangs.confirmation_due(session, [_failure(case=mm_case(k=9))])  # no suspicion


# -- end to end: real workers ------------------------------------------------------------------


SLOW_LIBRARY = '''
"""Slow, not hung: mm sleeps SLOW_S seconds when K == 7, then answers correctly."""
import time

import plantedlib

NAMESPACE = "hang_suspicion_slow"
OPS = ["mm"]
KERNEL_PREFIX = f"{NAMESPACE}::"
ROUTES = {"mm": (f"{NAMESPACE}::mm",)}
SLOW_S = 8.0


def mm(a, b):
    plantedlib.check(a, b)
    if a.shape[1] == 7:
        time.sleep(SLOW_S)
    return plantedlib.mm_float64(a, b).to(a.dtype)


def enable(enabled):
    if enabled:
        plantedlib.install(NAMESPACE, mm)
'''


@pytest.fixture
def libraries(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Workers inherit the environment: the planted libraries and the slow one on their path."""
    (tmp_path / "hang_suspicion_slow.py").write_text(SLOW_LIBRARY)
    paths = [str(tmp_path), str(PLANTED), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, paths)))


def _space(dim: int | None = None):
    data = {
        "ops": {"include": ["mm"]},
        "dtypes": {"choices": ["float32"]},
        "values": {"choices": ["general"]},
        "shapes": {"rows": {"min": 1, "max": 4}},
        "runner": {"example_timeout_s": FULL_S, "start_timeout_s": 120},
    }
    if dim is not None:
        data["shapes"]["dim"] = {"min": dim, "max": dim}
    return parse(data, "test", "test")


@pytest.mark.slow
def test_a_hang_is_suspected_in_seconds_and_its_worker_replaced(libraries) -> None:
    runner = Runner("planted_hang", example_timeout_s=FULL_S, start_timeout_s=120)
    runner.suspect_hangs = True
    try:
        runner.observe("reference", mm_case(k=6), "enabled")  # a first call: the full timeout
        runner.observe("reference", mm_case(k=6, seed=1), "enabled")  # milliseconds
        stuck = runner._workers["enabled"]
        start = time.monotonic()
        with pytest.raises(WorkerHang, match=r"no answer within 5 s \(a hang suspected"):
            runner.observe("reference", mm_case(k=7), "enabled")
        assert time.monotonic() - start < FULL_S - 5
        assert not stuck.alive()  # killed
        assert runner.suspicion("reference", mm_case(k=7), "enabled") is not None
        runner.observe("reference", mm_case(k=8), "enabled")  # a replacement serves
        assert runner._workers["enabled"] is not stuck and runner.suspicions == 1
    finally:
        runner.close()


@pytest.mark.slow
def test_fuzz_finds_and_confirms_the_planted_hang_before_one_example_timeout(libraries) -> None:
    """Every case of this space has K == 7. After one completed call teaches the cell's cost,
    the slice's first example is a suspected hang at 5 s; the shrink stops where asked, and
    the fresh process waits the full 15 s to confirm it: a timeout finding."""
    session = Session("planted_hang", _space(dim=7))
    session.explicit_examples = False
    try:
        session.runner.observe("reference", mm_case(k=6), "enabled")  # warm-up, not counted
        session.runner.observe("reference", mm_case(k=6, seed=1), "enabled")
        cell = Cell("mm", "reference", "enabled")
        start = time.monotonic()
        run_slice(session, cell, 5, None, seed=3, stop_at=start + 8)
        elapsed = time.monotonic() - start
    finally:
        session.close()
    [finding] = session.findings
    assert (finding.kind, finding.error_type) == ("timeout", "WorkerHang")
    assert "no answer within 5 s (a hang suspected" in finding.message, finding.message
    assert finding.reproduced_in_fresh_process is True, finding.confirmation
    assert f"full example timeout ({FULL_S:g} s) waited" in finding.confirmation
    assert cell.done  # a confirmed hang retires its cell, as before
    # the first failure came well before one example timeout had passed
    assert elapsed - cell.shrink_s < FULL_S - 5, (elapsed, cell.shrink_s)
    assert session.hang_suspicions == []


@pytest.mark.slow
def test_a_slow_case_suspected_of_hanging_is_a_note_not_a_finding(libraries) -> None:
    """mm sleeps 8 s for K == 7: more than a suspicion's 5 s, less than the 15 s timeout. The
    fresh process answers, so no finding (exit status not 1), a note in report.json, and the
    cell is back on the full timeout."""
    session = Session("hang_suspicion_slow", _space())
    session.runner.suspect_hangs = True
    try:
        session.runner.observe("reference", mm_case(k=6), "enabled")
        session.runner.observe("reference", mm_case(k=6, seed=1), "enabled")
        slow = mm_case(k=7)
        with pytest.raises(WorkerHang) as hang:
            session.runner.observe("reference", slow, "enabled")
        failure = Failure(
            "mm", "reference", "enabled", slow, "timeout", str(hang.value), "WorkerHang"
        )
        session.finalize(failure)
        report = session.report()
        timeout = session.runner.example_timeout("reference", mm_case(), "enabled")
    finally:
        session.close()
    assert session.findings == [] and report["findings"] == []
    [note] = report["hang_suspicions"]
    assert note["case"] == repr(slow)
    assert note["confirmation"].startswith("not reproduced: the case passed"), note
    assert exit_status(report) != 1
    assert timeout == (FULL_S, "")


def test_case_work_follows_the_ops_cost_model() -> None:
    """Attention's cost is quadratic in a sequence's keys: a 512-key needle beside an 886-key
    sequence is far more work than 263 short rows of a wider head, not less (the shape product
    said 11,648 against 134,656 and suspected a hang of the long-context example)."""
    import bi_props.catalogue  # noqa: F401  (registers the ops)

    short = Case("attention", "", "float32", (8, 4, 2, 64), (), "general", 0).with_batch(
        Batch(0, (Companion(1, 255),))
    )
    long = Case("attention", "", "float32", (512, 1, 1, 8), (), "general", 0).with_batch(
        Batch(0, (Companion(1, 886),))
    )
    assert case_work(long) > 4 * case_work(short)
