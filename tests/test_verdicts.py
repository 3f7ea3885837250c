"""Every failure is a finding: a failure that does not replay is a
``flaky`` finding, an error of bi_props is an ``internal`` one (exit 3), a known failure (by full
signature) does not stop the cell's search, and a fresh process confirms only the same property
and kind. A real Session whose judge is replaced (no workers): what is checked is how failures
become findings, not the target.
"""

from __future__ import annotations

import time

from hypothesis import strategies as st

from bi_props.campaigns.fuzz import KNOWN_ONLY_TURNS, Cell, run_slice
from bi_props.campaigns.records import Failure
from bi_props.campaigns.session import Session
from bi_props.model.case import Case
from bi_props.model.known import KnownFailure
from bi_props.model.properties import Verdict
from bi_props.model.space import parse
from bi_props.runner.controller import (
    CONFIRM_GRACE_S,
    CONFIRM_PATIENCE,
    ConfirmationCut,
    InternalError,
    Runner,
    WorkerCrash,
    WorkerHang,
    WorkerStartFailure,
)


def mm_case(m: int, k: int) -> Case:
    return Case("mm", "torch.mm", "float32", (m, k, 2), ("contiguous",) * 2, "general", 0)


def session_judged_by(judge) -> Session:
    """A Session on the CPU target whose judge is ``judge(case, fresh) -> Verdict`` (no worker
    starts: the strategy is replaced too)."""
    session = Session("cpu", parse({"ops": {"include": ["mm"]}}, "test", "test"))
    session.judge = lambda op, prop, switch, case, fresh=False, patience=1.0: judge(case, fresh)
    session.strategy = lambda op, prop: st.builds(mm_case, st.integers(1, 64), st.integers(0, 64))
    session.covered = lambda op: True
    session.explicit_examples = False  # the slice's own draws only (explicit: test_explicit.py)
    return session


def test_a_failure_that_does_not_replay_is_a_flaky_finding() -> None:
    seen: set = set()

    def judge(case: Case, fresh: bool) -> Verdict:
        first = fresh or case not in seen  # wrong on the first sight of each case only
        seen.add(case)
        return Verdict(False, "bits differ", "mismatch") if first else Verdict(True)

    session = session_judged_by(judge)
    cell = Cell("mm", "reference", "enabled")
    run_slice(session, cell, 50, None, seed=1)
    assert not cell.done  # a flaky mismatch: the cell keeps exploring for other bugs
    [finding] = session.findings
    assert finding.kind == "flaky", finding
    assert "failed (mismatch)" in finding.message and "bits differ" in finding.message
    assert "replay of the same case in the same worker: passed" in finding.message
    # The fresh worker saw the first observation again: the same property and the first kind.
    assert finding.reproduced_in_fresh_process is True
    assert finding.first_kind == "mismatch"
    # Later turns meet the same nondeterminism (first seen: a mismatch) as settled by the flaky
    # finding: skipped, never shrunk or recorded again, and the cell retires after
    # KNOWN_ONLY_TURNS such turns.
    for turn in range(2, 2 + KNOWN_ONLY_TURNS):
        run_slice(session, cell, 10, None, seed=turn)
    assert [f.kind for f in session.findings] == ["flaky"], session.findings
    assert session.skipped_known[("mm", "reference", "enabled")] >= KNOWN_ONLY_TURNS
    assert cell.done and "met only its known failure" in cell.retired_why, cell


def test_a_case_that_fails_differently_on_replay_is_no_flaky_finding() -> None:
    """Hypothesis raises Flaky also when the same case fails with another error on replay (a
    crash, then a timeout while the replacement worker starts on a loaded machine: the CI run
    of 2026-12-01 saw planted_crash and planted_hang come out ``flaky``). The case never
    passed, so neither failure is evidence of nondeterminism: both are ordinary findings."""
    seen: set = set()

    def judge(case: Case, fresh: bool) -> Verdict:
        if case.shape[0] < 8:
            return Verdict(True)
        if case in seen:
            raise WorkerHang("no answer within 3 s")
        seen.add(case)
        raise WorkerCrash("the process died (SIGSEGV)")

    session = session_judged_by(judge)
    cell = Cell("mm", "reference", "enabled")
    run_slice(session, cell, 50, None, seed=1)
    kinds = sorted(f.kind for f in session.findings)
    assert "flaky" not in kinds, session.findings
    assert "crash" in kinds, session.findings


def test_only_a_case_that_held_when_run_again_counts_as_passed_again() -> None:
    """A settled failure skipped on a later run of the same case is no pass (the CI run of
    2026-12-01 saw planted_hang's K = 7 timeout as ``flaky``: the replay had been skipped as
    settled), nor is an unobservable verdict; only a property that held is."""
    import pytest

    from bi_props.campaigns.records import PropertyFailed

    outcome = {"verdict": Verdict(False, "bits differ", "mismatch")}
    session = session_judged_by(lambda case, fresh: outcome["verdict"])
    case = mm_case(8, 3)
    with pytest.raises(PropertyFailed):
        session.check("mm", "reference", "enabled", case)
    failure = session.last_failure
    session.skip_settled, session.settled = True, lambda signature: True
    session.check("mm", "reference", "enabled", case)  # skipped: settled
    assert not session.passed_again(failure)
    outcome["verdict"] = Verdict(False, "no profiler", "not_observable")
    session.check("mm", "reference", "enabled", case)
    assert not session.passed_again(failure)
    outcome["verdict"] = Verdict(True)
    session.check("mm", "reference", "enabled", case)
    assert session.passed_again(failure)


def test_a_failure_folded_into_another_while_shrinking_is_no_flaky_finding() -> None:
    """Two signatures with one origin (PropertyFailed from the same line): Hypothesis shrinks
    them as one failure and replays only the last. The other was never replayed, which says
    nothing about determinism: it is recorded as an ordinary finding, never as ``flaky``."""

    def judge(case: Case, fresh: bool) -> Verdict:
        if case.shape[0] >= 8:  # deterministic: large cases mismatch, smaller ones raise
            return Verdict(False, "bits differ", "mismatch")
        if case.shape[0] >= 2:
            return Verdict(False, "the op raised ValueError", "error", "ValueError")
        return Verdict(True)

    session = session_judged_by(judge)
    cell = Cell("mm", "reference", "enabled")
    session.strategy = lambda op, prop: st.builds(mm_case, st.integers(1, 64), st.integers(0, 64))
    run_slice(session, cell, 100, None, seed=3)
    kinds = sorted(f.kind for f in session.findings)
    assert "flaky" not in kinds, session.findings
    assert "error" in kinds, session.findings


def test_an_error_of_bi_props_is_an_internal_finding_and_exit_3() -> None:
    from bi_props.campaigns.campaign import Ledger

    def judge(case: Case, fresh: bool) -> Verdict:
        if case.shape[0] >= 5:
            raise KeyError("a judge's bug")
        return Verdict(True)

    session = session_judged_by(judge)
    cell = Cell("mm", "reference", "enabled")
    run_slice(session, cell, 50, None, seed=1)
    [finding] = session.findings
    assert (finding.kind, finding.error_type) == ("internal", "KeyError")
    assert "bug of bi_props" in finding.message and "a judge's bug" in finding.message
    assert finding.case == repr(mm_case(5, 0))  # shrunk like any finding
    assert session.status == "internal error"
    report = {"findings": [vars(finding)], "status": session.status}
    assert Ledger.exit_status(None, report) == 3


def test_an_error_outside_any_example_stops_the_cell_loudly_and_exits_3() -> None:
    """A bug of bi_props before any case reaches the judge (here: drawing the case) records no
    finding of a case; it is kept as the run's internal error, never a silent retire."""
    from bi_props.campaigns.campaign import Ledger

    def broken(_: int) -> Case:
        raise ZeroDivisionError("a strategy's bug")

    session = session_judged_by(lambda case, fresh: Verdict(True))
    session.strategy = lambda op, prop: st.integers(0, 3).map(broken)
    cell = Cell("mm", "reference", "enabled")
    run_slice(session, cell, 20, None, seed=1)
    assert cell.done and session.findings == []
    [error] = session.internal_errors
    assert error.startswith("mm reference [enabled]: the search stopped"), error
    assert "ZeroDivisionError" in error and "bug of bi_props" in error
    assert session.status == "internal error"
    assert Ledger.exit_status(None, {"findings": [], "status": session.status}) == 3


def test_an_internal_error_from_the_worker_is_an_internal_finding() -> None:
    def judge(case: Case, fresh: bool) -> Verdict:
        raise InternalError("worker: bi_props failed")

    session = session_judged_by(judge)
    run_slice(session, Cell("mm", "reference", "enabled"), 20, None, seed=1)
    assert [f.kind for f in session.findings] == ["internal"]


def test_a_known_failure_does_not_stop_the_cell_from_finding_a_new_one() -> None:
    def judge(case: Case, fresh: bool) -> Verdict:
        m, k = case.shape[0], case.shape[1]
        if m >= 10:
            return Verdict(False, "known: m >= 10", "mismatch")
        if k >= 30:
            return Verdict(False, "new: k >= 30", "error", "RuntimeError")
        return Verdict(True)

    session = session_judged_by(judge)
    session.known = [KnownFailure("cpu", "mm", "reference", "enabled", "mismatch")]
    cell = Cell("mm", "reference", "enabled")
    for turn in range(20):
        run_slice(session, cell, 10, None, seed=turn)
        if cell.done:
            break
    kinds = {f.kind: f.status for f in session.findings}
    assert kinds == {"mismatch": "known", "error": "new"}, session.findings
    # an error keeps the cell exploring; it retired once its turns met only known failures
    assert cell.done and "met only its known failure" in cell.retired_why, cell
    [new] = [f for f in session.findings if f.kind == "error"]
    assert new.case == repr(mm_case(1, 30))


def test_a_cell_with_only_a_known_failure_stays_live() -> None:
    session = session_judged_by(
        lambda case, fresh: (
            Verdict(False, "known", "mismatch") if case.shape[0] >= 10 else Verdict(True)
        )
    )
    session.known = [KnownFailure("cpu", "mm", "reference", "enabled", "mismatch")]
    cell = Cell("mm", "reference", "enabled")
    run_slice(session, cell, 30, None, seed=2)
    assert not cell.done
    assert [f.status for f in session.findings] == ["known"]
    run_slice(session, cell, 30, None, seed=3)  # skipped now: the search goes on, no new finding
    assert not cell.done
    assert len(session.findings) == 1
    assert session.skipped_known[("mm", "reference", "enabled")] >= 1


def test_a_cell_with_two_bugs_of_different_kinds_reports_both_each_shrunk() -> None:
    """Like Hypothesis' report_multiple_bugs: after the cell's first finding its later
    turns skip that signature and keep exploring, so a second, different bug of the same cell
    (here: wrong values for K == 3, an exception for M > 50) is found and shrunk too. Before,
    the first finding retired the cell and the second stayed hidden."""

    def judge(case: Case, fresh: bool) -> Verdict:
        m, k = case.shape[0], case.shape[1]
        if m > 50:
            return Verdict(
                False, "the op raised ValueError: tile out of range", "error", "ValueError"
            )
        if k == 3:
            return Verdict(False, "bits differ", "mismatch")
        return Verdict(True)

    session = session_judged_by(judge)
    session.strategy = lambda op, prop: st.builds(mm_case, st.integers(1, 64), st.integers(0, 8))
    cell = Cell("mm", "reference", "enabled")
    turns = 0
    while not cell.done and turns < 30 and len(session.findings) < 2:
        run_slice(session, cell, 10, None, seed=turns)
        turns += 1
    found = {f.kind: f for f in session.findings}
    assert sorted(found) == ["error", "mismatch"], session.findings
    assert found["mismatch"].case == repr(mm_case(1, 3)), found["mismatch"]
    assert found["error"].case == repr(mm_case(51, 0)), found["error"]
    assert all(f.shrink == "complete" and f.status == "new" for f in found.values())
    assert not cell.done and cell.findings == 2
    # Later turns meet both only as settled signatures: skipped, the cell retires boundedly.
    for turn in range(turns, turns + 30):
        if cell.done:
            break
        run_slice(session, cell, 10, None, seed=turn)
    assert cell.done and "met only its known failure" in cell.retired_why, cell
    assert len(session.findings) == 2


def _confirm(fresh_result) -> tuple:
    def judge(case: Case, fresh: bool) -> Verdict:
        if not fresh:
            return Verdict(False, "bits differ", "mismatch")
        if isinstance(fresh_result, Exception):
            raise fresh_result
        return fresh_result

    session = session_judged_by(judge)
    failure = Failure("mm", "reference", "enabled", mm_case(3, 3), "mismatch", "x", None)
    session.finalize(failure)
    [finding] = session.findings
    return finding.reproduced_in_fresh_process, finding.confirmation


def test_a_fresh_process_confirms_only_the_same_property_and_kind() -> None:
    assert _confirm(Verdict(False, "bits differ", "mismatch"))[0] is True
    crashed = _confirm(WorkerCrash("the process died"))
    assert crashed == (False, "not reproduced: a fresh worker failed with crash, not mismatch")
    assert _confirm(Verdict(True)) == (False, "not reproduced: the case passed in a fresh worker")
    state, why = _confirm(WorkerStartFailure("import failed"))
    assert state is None and why.startswith("not confirmed: the fresh worker did not start")
    # A finding that IS a worker that cannot start (the target breaks when switched on) is
    # reproduced by a fresh worker that cannot start either.
    session = session_judged_by(lambda case, fresh: (_ for _ in ()).throw(WorkerStartFailure("x")))
    start = Failure("mm", "reference", "enabled", mm_case(3, 3), "error", "x", "WorkerStartFailure")
    session.finalize(start)
    [finding] = session.findings
    assert finding.reproduced_in_fresh_process is True, finding.confirmation
    state, why = _confirm(ConfirmationCut("cut after 5.0 s at the campaign's end"))
    assert state is None and why.startswith("not confirmed: the fresh worker's example was cut")


def test_a_fresh_worker_that_hangs_confirms_only_a_hang() -> None:
    """Silence in the fresh worker (a loaded machine, a cold start) shows neither a mismatch nor
    its absence: "not confirmed", never "not reproduced". It does confirm a timeout finding."""
    state, why = _confirm(WorkerHang("no answer within 9.0 s"))
    assert state is None, why
    assert why.startswith("not confirmed: the fresh worker's example did not finish"), why
    assert "showed no mismatch" in why

    session = session_judged_by(lambda case, fresh: (_ for _ in ()).throw(WorkerHang("silent")))
    hang = Failure("mm", "reference", "enabled", mm_case(3, 3), "timeout", "x", "WorkerHang")
    session.finalize(hang)
    [finding] = session.findings
    assert finding.reproduced_in_fresh_process is True, finding.confirmation


def test_a_fresh_confirmation_waits_longer_unless_the_finding_is_a_hang() -> None:
    """A non-hang finding's confirmation gets CONFIRM_PATIENCE example timeouts; a hang's gets the
    profile's own timeout (that timeout is the finding)."""
    patience: list[float] = []
    session = session_judged_by(lambda case, fresh: Verdict(False, "bits differ", "mismatch"))

    def judge(op, prop, switch, case, fresh=False, **kwargs):
        patience.append(kwargs.get("patience", 1.0))
        raise WorkerHang("silent")

    session.judge = judge
    for kind in ("mismatch", "timeout"):
        session.finalize(Failure("mm", "reference", "enabled", mm_case(3, 3), kind, "x", None))
    assert patience == [CONFIRM_PATIENCE, 1.0]

    runner = Runner("cpu", example_timeout_s=2.0)
    assert runner.timeout(patience=CONFIRM_PATIENCE) == (2.0 * CONFIRM_PATIENCE, False)
    runner.deadline = time.monotonic() + 1.0  # the campaign's end still bounds it
    wait, cut = runner.timeout(CONFIRM_GRACE_S, CONFIRM_PATIENCE)
    assert cut and wait <= 1.0 + CONFIRM_GRACE_S


def test_an_error_is_confirmed_only_by_the_same_exception_type() -> None:
    """A ValueError finding is not 'reproduced' by a fresh worker raising a RuntimeError."""

    def judged(fresh_type: str):
        def judge(case: Case, fresh: bool) -> Verdict:
            return Verdict(False, "raised", "error", "ValueError" if not fresh else fresh_type)

        session = session_judged_by(judge)
        failure = Failure("mm", "reference", "enabled", mm_case(3, 3), "error", "x", "ValueError")
        session.finalize(failure)
        [finding] = session.findings
        return finding.reproduced_in_fresh_process, finding.confirmation

    assert judged("ValueError")[0] is True
    assert judged("RuntimeError") == (
        False,
        "not reproduced: a fresh worker raised RuntimeError, not ValueError",
    )


def test_a_kernel_right_only_when_replayed_is_a_flaky_finding(monkeypatch) -> None:
    """End to end, real workers: tests/planted/planted_flaky.py through run_slice."""
    import os
    from pathlib import Path

    planted = str(Path(__file__).resolve().parent / "planted")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([planted, os.environ.get("PYTHONPATH", "")]))
    space = parse(
        {
            "ops": {"include": ["mm"]},
            "dtypes": {"choices": ["float32"]},
            "shapes": {"rows": {"min": 1, "max": 8}, "dim": {"min": 1, "max": 8}},
            "runner": {"example_timeout_s": 30, "start_timeout_s": 120},
        },
        "test",
        "test",
    )
    session = Session("planted_flaky", space)
    try:
        cell = Cell("mm", "reference", "enabled")
        run_slice(session, cell, 10, None, seed=1)
    finally:
        session.close()
    assert not cell.done  # a flaky finding keeps the cell exploring (its first kind settled)
    [finding] = session.findings
    assert (finding.op, finding.property, finding.switch) == ("mm", "reference", "enabled")
    assert finding.kind == "flaky", finding.message
    assert "replay of the same case in the same worker: passed" in finding.message
    assert finding.reproduced_in_fresh_process is True, finding.confirmation


def test_an_internal_error_inside_a_control_is_the_runs_internal_error_and_exit_3() -> None:
    """``Session.control`` once swallowed every exception: an InternalError raised by
    every observation left the control "searching ... 12 of 200", no internal error, exit 0."""
    from bi_props.campaigns.campaign import Ledger

    session = session_judged_by(lambda case, fresh: Verdict(True))

    def observe(prop, case, switch):
        raise InternalError("worker: bi_props failed while observing")

    session.runner.observe = observe
    control = session.control("mm", "batch_invariance", examples=12, seed=1)
    assert not control.variance_seen
    assert control.state == "done" and control.message.startswith("INTERNAL ERROR"), control
    [error] = session.internal_errors
    assert error.startswith("negative control mm batch_invariance [disabled]: "), error
    assert "InternalError" in error and "bi_props failed while observing" in error
    assert session.status == "internal error"
    assert Ledger.exit_status(None, {"findings": [], "status": session.status}) == 3


def test_a_judges_bug_inside_a_control_is_an_internal_error_not_no_variance(monkeypatch) -> None:
    from dataclasses import replace

    from bi_props.model import property_spec

    session = session_judged_by(lambda case, fresh: Verdict(True))
    session.runner.observe = lambda prop, case, switch: object()
    spec = property_spec.get("batch_invariance")

    def broken(observation):
        raise KeyError("a judge's bug")

    monkeypatch.setattr(property_spec, "get", lambda name: replace(spec, judge=broken))
    control = session.control("mm", "batch_invariance", examples=5, seed=1)
    assert control.message.startswith("INTERNAL ERROR"), control
    assert "KeyError" in session.internal_errors[0]


def test_one_failure_class_is_shrunk_and_confirmed_once_across_properties() -> None:
    """Findings do not starve the campaign: the same exception from one op in
    several properties (a half-installed kernel raising TypeError) is one failure class: the
    first cell shrinks it and confirms it in a fresh process; the others record it at once as
    the same failure, without a shrink or a second fresh worker."""
    fresh_runs: list[Case] = []

    def judge(case: Case, fresh: bool) -> Verdict:
        if fresh:
            fresh_runs.append(case)
        return Verdict(False, "the op raised TypeError: bad dtype", "error", "TypeError")

    session = session_judged_by(judge)
    first = Cell("mm", "reference", "enabled")
    run_slice(session, first, 50, None, seed=1)
    assert len(fresh_runs) == 1 and not first.done  # an error: the cell explores on
    other = Cell("mm", "determinism", "enabled")

    def judge_other(case: Case, fresh: bool) -> Verdict:
        if fresh:
            fresh_runs.append(case)
        return Verdict(
            False,
            "second run (actual) vs first run (desired): one call raised ...\n"
            "  first:  TypeError: bad dtype\n  second: TypeError: bad dtype",
            "error",
            "TypeError",
        )

    session.judge = lambda op, prop, switch, case, fresh=False, patience=1.0: judge_other(
        case, fresh
    )
    ran = run_slice(session, other, 50, None, seed=2)
    assert ran == 1 and not other.done, ran  # no shrink: recorded at its first failing example
    assert len(fresh_runs) == 1, fresh_runs  # no second fresh-process confirmation
    first_finding, second = session.findings
    assert second.property == "determinism" and second.kind == "error"
    assert second.shrink.startswith("not shrunk again: the same failure as mm reference")
    assert second.confirmation.startswith("as mm reference [enabled] (the same failure)")
    assert second.reproduced_in_fresh_process == first_finding.reproduced_in_fresh_process


def test_a_control_asked_not_to_shrink_ends_its_turn_at_the_first_variance(monkeypatch) -> None:
    """While other controls are still searching, a control that sees variance
    stops there (the case saved in the example database, shrunk in a later turn), leaving the
    rest of its turn to the blind ones."""
    from dataclasses import replace

    from hypothesis.database import InMemoryExampleDatabase

    from bi_props.model import property_spec

    session = session_judged_by(lambda case, fresh: Verdict(True))
    session.space = replace(session.space, power_examples=0)  # the search alone, no probe
    judged: list[Case] = []
    session.runner.observe = lambda prop, case, switch: case
    spec = property_spec.get("batch_invariance")

    def judge(case):
        judged.append(case)
        return Verdict(False, "bits differ") if case.shape[0] >= 3 else Verdict(True)

    monkeypatch.setattr(property_spec, "get", lambda name: replace(spec, judge=judge))
    database = InMemoryExampleDatabase()
    control = session.control(
        "mm", "batch_invariance", seed=1, database=database, stop_at=time.monotonic() + 60,
        shrink=False,
    )  # fmt: skip
    assert control.variance_seen and control.state == "shrinking", control
    variant = [i for i, c in enumerate(judged) if c.shape[0] >= 3]
    assert len(judged) <= variant[0] + 2, (len(judged), variant[:3])  # no shrink this turn
    later = session.control("mm", "batch_invariance", seed=2, database=database)
    assert later.state == "done" and later.shrink == "complete", later


def test_the_failure_class_is_the_exception_whatever_the_propertys_words() -> None:
    from bi_props.campaigns.records import failure_class

    case = mm_case(2, 3)
    words = {
        "reference": "the op raised TypeError: bad dtype",
        "determinism": "second run ...:\n  first:  TypeError: bad dtype\n  second: ...",
        "parity": "contract parity: enabled TypeError: bad dtype; disabled returned normally",
        "routing": "the op raised TypeError: bad dtype",
    }
    classes = {
        failure_class(Failure("mm", prop, "enabled", case, "error", text, "TypeError"))
        for prop, text in words.items()
    }
    assert classes == {("error", "TypeError", "bad dtype")}
    # one root cause across ops (a half-installed library raising the same TypeError in every
    # op it touched): one class, shrunk and confirmed once
    other_op = Failure(
        "bmm", "reference", "enabled", case, "error", words["reference"], "TypeError"
    )
    assert failure_class(other_op) == next(iter(classes))
    numbers = Failure("bmm", "reference", "enabled", case, "error", "the op raised "
                      "TypeError: bad dtype at dim 3 of 17", "TypeError")  # fmt: skip
    same_stem = Failure("mm", "reference", "enabled", case, "error", "the op raised "
                        "TypeError: bad dtype at dim 1 of 5", "TypeError")  # fmt: skip
    assert failure_class(numbers) == failure_class(same_stem) != failure_class(other_op)
    crash = Failure("mm", "reference", "enabled", case, "crash", "died (SIGSEGV) on ...",
                    "WorkerCrash")  # fmt: skip
    assert failure_class(crash) == ("crash", "WorkerCrash", "SIGSEGV")
    mismatch = Failure("mm", "reference", "enabled", case, "mismatch", "bits differ", None)
    assert failure_class(mismatch) is None  # a mismatch is each property's own evidence


def test_several_distinct_failures_with_a_recorded_class_end_the_slice_cleanly() -> None:
    """The vLLM lane's rotary_embedding (2026-12-02 CI): Hypothesis reported two distinct
    failures of one slice as an exception group, one of them the slice's own SameFailure signal
    (a failure of a class recorded a moment before, on the final replay), and the group escaped
    run_slice and ended the campaign. Here the same crash is raised from two places (two origins
    to Hypothesis, one failure class to bi_props) next to a mismatch: every failure is a finding,
    none is lost, and nothing escapes."""

    def crash_here() -> None:
        raise WorkerCrash("the worker died (SIGSEGV)")

    def crash_there() -> None:
        raise WorkerCrash("the worker died (SIGSEGV)")

    def three_bugs(case: Case, fresh: bool) -> Verdict:
        m, k, _ = case.shape
        if m >= 40:
            (crash_here if m % 2 else crash_there)()
        if k >= 30:
            return Verdict(False, "bits differ", "mismatch")
        return Verdict(True)

    session = session_judged_by(three_bugs)
    grouped = 0
    for seed in range(8):
        session.findings.clear()
        cell = Cell("mm", "reference", "enabled")
        run_slice(session, cell, 200, None, seed=seed)  # never raises
        assert not session.internal_errors, session.internal_errors
        kinds = {f.kind for f in session.findings}
        assert kinds <= {"crash", "mismatch"}, kinds
        grouped += kinds == {"crash", "mismatch"}
    assert grouped, "no seed met the crash and the mismatch in one slice: the test shows nothing"


def test_the_deciding_exception_of_a_group_puts_interrupts_first_then_failures() -> None:
    from bi_props.campaigns.fuzz import (
        BaseExceptionGroup,
        BudgetSpent,
        ExceptionGroup,
        Interrupted,
        SameFailure,
        _deciding,
    )

    failure = ValueError("a finding")
    same = SameFailure()
    assert isinstance(_deciding(BaseExceptionGroup("g", [same, Interrupted()])), Interrupted)
    assert isinstance(_deciding(BaseExceptionGroup("g", [same, BudgetSpent()])), BudgetSpent)
    failures = ExceptionGroup("h", [failure])  # kept whole: it may be Hypothesis' FlakyFailure
    mixed = _deciding(BaseExceptionGroup("g", [same, BaseExceptionGroup("i", [failures, same])]))
    assert isinstance(mixed, ExceptionGroup) and mixed.exceptions == (failures,)
    assert _deciding(BaseExceptionGroup("g", [same, SameFailure()])) is same


def test_a_known_failure_of_one_class_does_not_hide_another_class_of_the_cell() -> None:
    """Failure classes: a known mm reference mismatch recorded in float32 (its case names the
    class) hides neither a bf16-only bug of the same cell nor a regression in another size:
    the bf16 one is reported as new, shrunk within bf16; what is skipped as known is counted."""
    from dataclasses import replace as _replace

    def judge(case: Case, fresh: bool) -> Verdict:
        if case.shape[0] >= 10:  # the known bug, every dtype
            return Verdict(False, "known: m >= 10", "mismatch")
        if case.dtype == "bfloat16" and case.shape[1] >= 3:  # a second bug, bf16 only
            return Verdict(False, "bf16: k >= 3", "mismatch")
        return Verdict(True)

    session = session_judged_by(judge)
    dtypes = st.sampled_from(("float32", "bfloat16"))
    session.strategy = lambda op, prop: st.builds(
        lambda m, k, d: _replace(mm_case(m, k), dtype=d), st.integers(1, 16), st.integers(0, 8),
        dtypes,
    )  # fmt: skip
    known_case = repr(mm_case(10, 0))
    session.known = [KnownFailure("cpu", "mm", "reference", "enabled", "mismatch", case=known_case)]
    cell = Cell("mm", "reference", "enabled")
    for turn in range(12):
        run_slice(session, cell, 10, None, seed=turn)
        if any(f.status == "new" for f in session.findings):
            break
    new = [f for f in session.findings if f.status == "new"]
    assert new, session.findings
    assert new[0].case == repr(_replace(mm_case(1, 3), dtype="bfloat16")), new[0]
    assert new[0].case_class == "bfloat16/contiguous/finite/small"
    assert session.report()["skipped_known"] or any(f.status == "known" for f in session.findings)
