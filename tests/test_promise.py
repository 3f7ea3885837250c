"""The engine's promise is judged, and unclaimed ops are observed.

``VLLM_BATCH_INVARIANT=1`` promises batch-invariant inference, not a list of swapped ops: for a
target whose switch promises it (``Hello.promises_inference``), the model-level properties are
judged whatever ops it claims. For ops a target does not claim, the enabled state's batch
invariance is recorded (``Session.unclaimed``) and reported, never a failure.

The session is driven with a stubbed judge and hello (no worker): what is tested is what the
session does with a verdict.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from bi_props.campaigns.records import PropertyFailed
from bi_props.campaigns.session import Session
from bi_props.model.case import Batch, Case, Companion
from bi_props.model.observation import Hello
from bi_props.model.properties import Verdict
from bi_props.model.space import load_profile

VARIANT = Verdict(False, "needle rows inside the batch (actual) vs alone (desired)\nMismatched")


def _case(op: str, m: int, companions: int = 1) -> Case:
    batch = Batch(0, tuple(Companion(2, 1 + i) for i in range(companions)))
    shape, layouts = (m, 4, 3), ("contiguous",) * 2
    return Case(op, "torch.mm", "float32", shape, layouts, "general", 0, batch=batch)


def _session(monkeypatch, covered: tuple[str, ...], promises: bool, verdicts) -> Session:
    session = Session("vllm", load_profile("dev"))
    hello = Hello("vllm", "enabled", "ready", covered=covered, promises_inference=promises)
    monkeypatch.setattr(session, "hello", lambda switch="disabled": hello)
    session.runner._hellos = {"enabled": hello}
    answers = iter(verdicts)
    last: list[Verdict] = []

    def judge(op, prop, switch, case, fresh=False, patience=1.0):
        if fresh:  # the fresh-process confirmation sees what the example saw
            return last[-1]
        last.append(next(answers))
        return last[-1]

    monkeypatch.setattr(session, "judge", judge)
    return session


def test_a_promise_target_fails_on_model_logprobs_it_does_not_claim(monkeypatch):
    """Before: "logprobs fails, but the target does not claim probe_model" (not covered)."""
    drift = Verdict(False, "needle logprobs ...\nof which the target does not claim: ['mm']")
    session = _session(monkeypatch, ("bmm",), True, [drift])
    case = _case("probe_model", 3)
    with pytest.raises(PropertyFailed, match="logprobs"):
        session.check("probe_model", "logprobs", "enabled", case)
    [finding] = session.findings
    assert (finding.op, finding.property, finding.switch) == ("probe_model", "logprobs", "enabled")
    assert "of which the target does not claim: ['mm']" in finding.message
    assert session.not_covered == {}
    assert "probe_model" not in session.unclaimed  # judged, not merely observed


def test_decode_is_judged_too_for_a_promise_target(monkeypatch):
    session = _session(monkeypatch, ("bmm",), True, [Verdict(False, "decode step ...")])
    with pytest.raises(PropertyFailed):
        session.check("probe_model", "decode", "enabled", _case("probe_model", 3))
    assert [f.property for f in session.findings] == ["decode"]


def test_a_target_without_the_promise_keeps_model_results_as_not_claimed(monkeypatch):
    session = _session(monkeypatch, ("mm",), False, [VARIANT])
    session.check("probe_model", "logprobs", "enabled", _case("probe_model", 3))  # no raise
    assert session.findings == []
    assert "does not claim probe_model" in session.not_covered["probe_model"]
    assert session.unclaimed["probe_model"]["batch_variant"] is True


def test_unclaimed_ops_record_batch_variance_with_the_switch_on(monkeypatch):
    """Without the promise (a library that claims some ops), an unclaimed op's batch variance
    is observed and reported, never a failure (under a promise it is a ``promise`` finding:
    test_a_promise_target_fails_on_an_unswapped_batch_variant_op)."""
    ok = Verdict(True)
    session = _session(monkeypatch, ("bmm",), False, [ok, VARIANT, VARIANT, ok])
    big, small = _case("mm", 9, companions=2), _case("mm", 2)
    for case in (_case("mm", 1), big, small, _case("mm", 1)):
        session.check("mm", "batch_invariance", "enabled", case)  # never raises: not claimed
    assert session.findings == []
    entry = session.unclaimed["mm"]
    assert entry["batch_variant"] is True and entry["examples"] == 4
    assert entry["case"] == repr(small)  # the smallest variant case seen
    assert entry["property"] == "batch_invariance" and "Mismatched" in entry["message"]
    # An unclaimed op that stayed invariant says so too.
    quiet = _session(monkeypatch, ("bmm",), False, [ok, ok])
    for m in (1, 2):
        quiet.check("sum", "batch_invariance", "enabled", _case("sum", m))
    assert quiet.unclaimed["sum"] == {
        "property": "batch_invariance",
        "batch_variant": False,
        "case": None,
        "examples": 2,
        "message": "",
    }
    report = session.report()
    assert report["unclaimed"] == [{"op": "mm", **entry}]
    assert report["promises_inference"] is False


def test_a_promise_target_fails_on_an_unswapped_batch_variant_op(monkeypatch):
    """Under a switch that promises batch-invariant inference (vllm, vllm-engine,
    ascend, verl), an op the target does not swap that is batch-variant with the switch on is a
    finding of kind ``promise`` naming the op (before: only observed, exit 0)."""
    from bi_props.reporting.data import exit_status

    ok = Verdict(True)
    session = _session(monkeypatch, ("bmm",), True, [ok, VARIANT])
    session.check("mm", "batch_invariance", "enabled", _case("mm", 1))  # invariant: no finding
    with pytest.raises(PropertyFailed, match="promise broken"):
        session.check("mm", "batch_invariance", "enabled", _case("mm", 2))
    [finding] = session.findings
    assert (finding.op, finding.property, finding.switch, finding.kind) == (
        "mm",
        "batch_invariance",
        "enabled",
        "promise",
    )
    assert "not swapped: mm" in finding.message and "the target claims ['bmm']" in finding.message
    assert finding.reproduced_in_fresh_process is True, finding.confirmation  # as a mismatch
    assert session.unclaimed["mm"]["batch_variant"] is True  # still reported as observed
    assert exit_status(session.report()) == 1


def test_routing_not_observable_for_every_op_is_no_verdict_exit_3(monkeypatch):
    """Routing "not observable" for every op reaches the exit status (it once did not)."""
    from bi_props.reporting.data import exit_status, no_routing_verdict

    why = "routing not observable: no ROUTES, no KERNEL_PREFIX"
    blind = Verdict(False, why, "not_observable")
    session = _session(monkeypatch, ("mm", "sum"), True, [blind, blind])
    session.check("mm", "routing", "enabled", _case("mm", 2))
    session.check("sum", "routing", "enabled", _case("sum", 2))
    report = session.report()
    assert report["routing_observed"] == [] and no_routing_verdict(report)
    assert exit_status(report) == 3
    # One op observed on evidence: the other claimed op still has no routing verdict (exit 3),
    # unless the target declares its routing unobservable (tests/test_routing_names.py).
    seen = _session(monkeypatch, ("mm", "sum"), True, [blind, Verdict(True)])
    seen.check("mm", "routing", "enabled", _case("mm", 2))
    seen.check("sum", "routing", "enabled", _case("sum", 2))
    assert seen.report()["routing_observed"] == ["sum"]
    assert no_routing_verdict(seen.report()) == ["mm"]
    assert exit_status(seen.report()) == 3


def test_claimed_ops_and_other_properties_are_not_recorded_as_unclaimed(monkeypatch):
    session = _session(monkeypatch, ("mm",), True, [VARIANT, Verdict(True)])
    with pytest.raises(PropertyFailed):
        session.check("mm", "batch_invariance", "enabled", _case("mm", 2))
    session.check("sum", "determinism", "enabled", _case("sum", 2))
    assert session.unclaimed == {}


def test_routing_not_observable_is_recorded_not_passed(monkeypatch):
    why = "routing not observable: torch._C._dispatch_dump unusable"
    session = _session(monkeypatch, ("mm",), True, [Verdict(False, why, "not_observable")])
    session.check("mm", "routing", "enabled", _case("mm", 2))  # neither a pass nor a finding
    assert session.findings == []
    assert session.unobservable == {("mm", "enabled"): why}
    assert session.report()["routing_not_observable"] == [
        {"op": "mm", "switch": "enabled", "reason": why}
    ]
    assert [e["outcome"] for e in session.examples_log] == ["not_observable"]


def test_targets_declare_the_promise():
    from bi_props.targets.ascend import AscendTarget
    from bi_props.targets.cpu import CpuTarget
    from bi_props.targets.module import ModuleTarget
    from bi_props.targets.vllm import VllmTarget
    from bi_props.targets.vllm_engine import VllmEngineTarget

    assert VllmTarget().promises_inference() and VllmEngineTarget().promises_inference()
    assert AscendTarget().promises_inference()  # VLLM_BATCH_INVARIANT=1 on vllm-ascend
    assert not CpuTarget().promises_inference()
    assert not ModuleTarget("planted_correct").promises_inference()


def test_reports_show_unclaimed_ops_and_unobservable_routing(tmp_path: Path):
    from bi_props.reporting import write_reports

    report = {
        "target": "vllm",
        "findings": [],
        "controls": [],
        "not_covered": [{"op": "mm", "reason": "batch_invariance fails, but ..."}],
        "routing_not_observable": [{"op": "bmm", "switch": "enabled", "reason": "no dump"}],
        "unclaimed": [
            {
                "op": "mm",
                "property": "batch_invariance",
                "batch_variant": True,
                "case": "Case('mm', ...)",
                "examples": 7,
                "message": "Mismatched",
            },
            {
                "op": "sum",
                "property": "batch_invariance",
                "batch_variant": False,
                "case": None,
                "examples": 5,
                "message": "",
            },
        ],
        "routing_notes": ["target 'x' declares no KERNEL_PREFIX and no ROUTES"],
        "cells": [
            {
                "target": "vllm",
                "op": "bmm",
                "property": "routing",
                "switch": "enabled",
                "examples": 3,
            },
            {
                "target": "vllm",
                "op": "mm",
                "property": "batch_invariance",
                "switch": "enabled",
                "examples": 7,
            },
        ],
    }
    (tmp_path / "report.json").write_text(json.dumps(report))
    write_reports(tmp_path)
    md = (tmp_path / "report.md").read_text()
    assert "## Routing not observable (not a pass)" in md and "`bmm` [enabled]: no dump" in md
    assert (
        "`mm`: not claimed, batch-variant with the switch on: yes (batch_invariance, 7 "
        "examples); smallest case seen: Case('mm', ...)" in md
    )
    assert "`sum`: not claimed, batch-variant with the switch on: no" in md
    assert "declares no KERNEL_PREFIX" in md
    assert "| routing not observable |" in md  # the cell's status is not "passed"
    html = (tmp_path / "report.html").read_text()
    assert "Routing not observable (not a pass)" in html and "smallest case seen" in html
    cases = {c.get("name"): c for c in ET.parse(tmp_path / "junit.xml").getroot().iter("testcase")}
    [skip] = [c.find("skipped") for n, c in cases.items() if n.startswith("bmm routing")]
    assert skip.get("message") == "routing not observable: no dump"
    [skip] = [c.find("skipped") for n, c in cases.items() if n.startswith("mm batch_invariance")]
    assert skip.get("message").startswith("not claimed, batch-variant with the switch on: yes")


def test_the_pytest_plugin_exits_3_by_the_same_rules(monkeypatch):
    """In the plugin: an internal error (here: in a negative control) or routing
    not observable for any op makes the pytest session exit 3, like ``bi-props fuzz``."""
    from types import SimpleNamespace

    from bi_props import plugin

    session = _session(monkeypatch, ("mm",), True, [])
    session.judge_switching = lambda: None
    session.internal("negative control mm batch_invariance [disabled]: bi_props failed")
    stash = {plugin._KEY: SimpleNamespace(_session=session)}
    config = SimpleNamespace(stash=SimpleNamespace(get=lambda key, default=None: stash.get(key)))
    pytest_session = SimpleNamespace(config=config, exitstatus=0)
    plugin.pytest_sessionfinish(pytest_session)
    assert pytest_session.exitstatus == 3
    clean = _session(monkeypatch, ("mm",), True, [])
    clean.judge_switching = lambda: None
    stash[plugin._KEY] = SimpleNamespace(_session=clean)
    pytest_session = SimpleNamespace(config=config, exitstatus=0)
    plugin.pytest_sessionfinish(pytest_session)
    assert pytest_session.exitstatus == 0


def test_under_pytest_xdist_a_workers_exit_3_reaches_the_controller(monkeypatch):
    """A pytest-xdist worker sends its Session's verdict (and summary) in ``workeroutput``;
    the controller, whose own tests all passed, exits 3 when a worker's verdict says so."""
    from types import SimpleNamespace

    from bi_props import plugin

    session = _session(monkeypatch, ("mm",), True, [])
    session.judge_switching = lambda: None
    session.internal("negative control mm batch_invariance [disabled]: bi_props failed")
    stash = {plugin._KEY: plugin.BiPropsState.__new__(plugin.BiPropsState)}
    # property_tests=0: its verdict is sent even by a worker that ran no property test
    stash[plugin._KEY].__dict__.update(
        _session=session, missing=None, profile="ci", skipped=0, property_tests=0
    )
    worker_config = SimpleNamespace(
        stash=SimpleNamespace(get=lambda key, default=None: stash.get(key, default)),
        workeroutput={},
    )
    plugin.pytest_sessionfinish(SimpleNamespace(config=worker_config, exitstatus=0))
    sent = worker_config.workeroutput["bi_props"]
    assert sent["exit_status"] == 3
    assert any("INTERNAL ERROR" in text for _, text, _ in sent["lines"]), sent["lines"]
    controller_stash = {plugin._KEY: SimpleNamespace(_session=None)}
    controller = SimpleNamespace(stash=controller_stash)
    node = SimpleNamespace(
        workeroutput={"bi_props": sent}, gateway=SimpleNamespace(id="gw0"), config=controller
    )
    plugin.pytest_testnodedown(node, None)
    pytest_session = SimpleNamespace(config=controller, exitstatus=0)
    plugin.pytest_sessionfinish(pytest_session)
    assert pytest_session.exitstatus == 3
