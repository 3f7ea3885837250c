"""What a green verdict rests on: judged examples per claimed op, the power probe's p, the
detection power, order-blind examples counted apart, and the floor that makes a thin run exit 3.

No worker starts: the controls' observations and the cells' verdicts are replaced."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from bi_props.campaigns.evidence import detection_power, power_text, session_evidence
from bi_props.campaigns.records import Finding
from bi_props.campaigns.session import Session
from bi_props.model import property_spec
from bi_props.model.case import Batch, Case, Companion
from bi_props.model.observation import Hello
from bi_props.model.properties import Verdict
from bi_props.model.space import parse
from bi_props.reporting.data import ReportData, exit_status, thin_evidence
from bi_props.reporting.verdict import verdict_line


def _session(**runner) -> Session:
    space = parse({"ops": {"include": ["mm", "sum"]}, "runner": runner}, "test", "test")
    session = Session("cpu", space)
    session.runner._hellos["enabled"] = Hello("cpu", "enabled", "ready", covered=("mm", "sum"))
    session.covered = lambda op: True
    session.entries = lambda op: None
    return session


def _mm(values: str = "general") -> Case:
    batch = Batch(0, (Companion(1, 15),))
    return Case("mm", "torch.mm", "float32", (1, 32, 8), ("contiguous",) * 2, values, 0,
                batch=batch)  # fmt: skip


def test_detection_power_is_one_minus_the_miss_probability():
    assert detection_power(None, 10) is None
    assert detection_power(0.0, 100) == 0.0
    assert detection_power(0.25, 10) == pytest.approx(1 - 0.75**10)


def test_the_power_probe_measures_p_on_the_enabled_cells_own_draws(monkeypatch):
    """The probe runs the enabled cell's strategy with the switch off: hits / judged is p, and
    every hit is kept as a known batch-variant case for the enabled cells."""
    session = _session(power_examples=20, control_examples=40)
    drawn: list = []

    def observe(prop, case, switch):
        assert switch == "disabled"
        drawn.append(case)
        return case

    session.runner.observe = observe
    spec = property_spec.get("batch_invariance")
    verdicts = {}

    def judge(case):  # every other draw varies; the op's explicit examples do not
        verdicts[repr(case)] = Verdict(len(verdicts) % 2 == 0 or case.seed >= 20261202)
        return verdicts[repr(case)]

    monkeypatch.setattr(property_spec, "get", lambda name: replace(spec, judge=judge))
    monkeypatch.setattr(session, "strategy", lambda op, prop: _cases())
    control = session.control("mm", "batch_invariance", seed=3)
    assert control.power_draws == 20 and control.power_judged == 20
    assert 0 < control.power_hits < 20 and control.hit_rate == control.power_hits / 20
    assert control.variance_seen and len(session.variants["mm"]) == control.variant_cases


def _cases():
    from hypothesis import strategies as st

    return st.builds(lambda seed: replace(_mm(), seed=seed), st.integers(0, 2**20))


def test_order_blind_and_degenerate_examples_are_counted_apart_never_as_judged():
    session = _session()
    verdicts = iter([Verdict(True, compared=8, rows=3), Verdict(True, compared=8, rows=3),
                     Verdict(True, compared=0, degenerate="zero elements")])  # fmt: skip
    session.judge = lambda *a, **k: next(verdicts)
    cell = ("mm", "batch_invariance", "enabled")
    assert session.check(*cell, _mm()) == "ok"
    # order-exact values: no reduction order can show; the suite draws again on these two
    assert session.check(*cell, _mm("exact")) == "order-blind"
    assert session.check(*cell, _mm()) == "degenerate"
    assert session.judged[cell] == 1 and session.order_blind[cell] == 1
    assert session.rows_judged[cell] == 3 and session.degenerate[cell][0] == 1


def test_a_claimed_op_below_the_floor_is_thin_and_exits_3():
    session = _session(min_judged=5)
    session.judged[("mm", "reference", "enabled")] = 5
    session.judged[("mm", "batch_invariance", "enabled")] = 5
    session.judged[("sum", "reference", "enabled")] = 4  # one short
    session.judged[("sum", "batch_invariance", "enabled")] = 9
    report = session.report()
    thin = thin_evidence(report)
    assert thin == ["sum (reference: 4 judged < 5)"], thin
    assert exit_status(report) == 3
    line = verdict_line(ReportData(Path("."), report, [], {}, {}, [], []))
    assert line.startswith("THIN EVIDENCE (exit 3): 1 op(s) below the floor of 5"), line
    assert "sum (reference: 4 judged < 5)" in line
    session.findings.append(
        Finding("cpu", "mm", "reference", "enabled", "mismatch", "Case(...)", "off", True)
    )
    report = session.report()
    assert exit_status(report) == 1  # a failing finding decides first; the line says so
    line = verdict_line(ReportData(Path("."), report, [], {}, {}, [], []))
    assert line.startswith("THIN EVIDENCE (the run exits 1: its findings decide)"), line
    session.findings.clear()
    session.judged[("sum", "reference", "enabled")] = 5
    assert thin_evidence(session.report()) == [] and exit_status(session.report()) == 0


def test_an_unclaimed_op_has_no_floor_but_its_evidence_is_shown():
    session = _session(min_judged=5)
    session.runner._hellos["enabled"] = Hello("cpu", "enabled", "ready", covered=("mm",))
    session.judged.update(
        {("mm", "reference", "enabled"): 5, ("mm", "batch_invariance", "enabled"): 7}
    )
    entries = {e["op"]: e for e in session_evidence(session)["ops"]}
    assert not entries["sum"]["claimed"] and entries["sum"]["thin"] == []
    assert entries["mm"]["judged"]["batch_invariance"] == 7
    assert power_text(entries["mm"]).startswith("7 judged")
