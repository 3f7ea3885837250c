"""Routing names the op.

Without declared ``ROUTES``, routing [enabled] once passed on any profiler event with the
target's ``KERNEL_PREFIX``: a module claiming ``fused_moe`` that overrides only ``mm`` passed
fused_moe routing on its ``mod::mm`` event inside the stock composite. Now the event must name
the claimed op (``prefix + op``, ``prefix + op + "_..."``, or one of the op's aten names after the
prefix), or the dispatcher must show one of the op's own aten ops running the module's kernel.
Every claimed op whose enabled routing was never judged on evidence ends the run with no routing
verdict (exit 3), unless the target declares it unobservable, with a reason (``UNOBSERVABLE``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bi_props.model import properties
from bi_props.model.observation import Call, Hello, Observation
from bi_props.reporting.data import exit_status, no_routing_verdict

PLANTED = Path(__file__).resolve().parent / "planted"
COVERED = ("mm", "fused_moe", "silu", "silu_and_mul", "log_softmax")


def _obs(switch: str, events, identity=None) -> Observation:
    call = Call(outputs=(), events=tuple(events))
    evidence = {"active": switch == "enabled", "identity": identity or {}}
    return Observation("routing", switch, {"op": call}, evidence=evidence)


def _hello(switch: str, routes=None, unobservable=None) -> Hello:
    return Hello(
        "lib",
        switch,
        "ready",
        kernel_prefix="lib::",
        covered=COVERED,
        routes=routes or {},
        unobservable=unobservable or {},
    )


def _route(op: str, events, switch: str = "enabled", **hello) -> properties.Verdict:
    return properties.routing(_obs(switch, events), _hello(switch, **hello), op)


# -- the judge -----------------------------------------------------------------------------------


def test_an_event_of_the_prefix_naming_another_op_is_no_evidence_for_this_one():
    verdict = _route("fused_moe", ["aten::matmul", "lib::mm", "aten::mm"])
    assert (verdict.ok, verdict.kind) == (False, "mismatch")
    assert "saw lib::mm, which names mm, not fused_moe" in verdict.message
    assert "looked for an event starting with 'lib::' that names fused_moe" in verdict.message
    assert _route("mm", ["aten::mm", "lib::mm"]).ok  # the op it does name passes


@pytest.mark.parametrize(
    ("op", "event"),
    [
        ("fused_moe", "lib::fused_moe"),  # prefix + op
        ("fused_moe", "lib::fused_moe_grouped_gemm"),  # prefix + op + "_..."
        ("mm", "lib::mm.default"),  # an overload
        ("log_softmax", "lib::_log_softmax"),  # one of the op's aten names
        ("silu_and_mul", "lib::silu_and_mul"),
    ],
)
def test_an_event_naming_the_op_passes(op: str, event: str):
    assert _route(op, ["aten::empty", event]).ok


def test_the_longest_name_wins_so_a_longer_op_is_not_read_as_a_shorter_one():
    assert properties.event_names("silu_and_mul") == "silu_and_mul"
    assert properties.event_names("silu") == "silu"
    assert properties.event_names("varlen_kernel") is None
    verdict = _route("silu", ["lib::silu_and_mul"])
    assert not verdict.ok and "saw lib::silu_and_mul, which names silu_and_mul" in verdict.message
    unnamed = _route("silu", ["lib::helper"])
    assert not unnamed.ok and "saw lib::helper, which names no catalogue op" in unnamed.message


def test_identity_evidence_and_declared_routes_are_unchanged():
    swapped = _obs("enabled", ["lib::mm"], {"ops.fused_moe swapped": True})
    assert properties.routing(swapped, _hello("enabled"), "fused_moe").ok
    routes = {"fused_moe": ("lib::moe_kernel",)}
    assert _route("fused_moe", ["lib::moe_kernel"], routes=routes).ok
    assert not _route("fused_moe", ["lib::mm"], routes=routes).ok


def test_disabled_any_event_of_the_prefix_is_still_a_leak():
    verdict = _route("fused_moe", ["aten::mm", "lib::mm"], switch="disabled")
    assert not verdict.ok and "switch leak" in verdict.message and "lib::mm" in verdict.message


def test_a_declared_unobservable_op_is_not_observable_with_its_reason_never_a_pass():
    why = "the fused kernel runs inside a CUDA graph: no profiler event"
    verdict = _route("fused_moe", ["lib::mm"], unobservable={"fused_moe": why})
    assert (verdict.ok, verdict.kind) == (False, "not_observable")
    assert verdict.message.endswith(f"target 'lib' declares it unobservable: {why}")
    # evidence, where there is some, is still judged
    assert _route("fused_moe", ["lib::fused_moe"], unobservable={"fused_moe": why}).ok


# -- the exit status -----------------------------------------------------------------------------


def _report(observed, unobservable, **extra) -> dict:
    return {
        "target": "lib",
        "status": "complete",
        "findings": [],
        "routing_observed": observed,
        "routing_not_observable": unobservable,
        **extra,
    }


def test_each_claimed_op_whose_routing_was_never_observed_is_listed_and_exits_3():
    blind = {"op": "fused_moe", "switch": "enabled", "reason": "no events"}
    report = _report(["mm"], [blind])
    assert no_routing_verdict(report) == ["fused_moe"]
    assert exit_status(report) == 3
    # observed once on evidence, or only unobservable with the switch off: a verdict
    assert no_routing_verdict(_report(["mm", "fused_moe"], [blind])) == []
    assert no_routing_verdict(_report(["mm"], [{**blind, "switch": "disabled"}])) == []
    # declared by the target: reported with its reason, no exit 3
    declared = _report(["mm"], [{**blind, "declared": True}])
    assert no_routing_verdict(declared) == [] and exit_status(declared) == 0
    # a report of several targets names the target
    several = _report(["a: mm", "b: fused_moe"], [{**blind, "target": "a"}])
    assert no_routing_verdict(several) == ["a: fused_moe"]
    # reports from before routing_observed was recorded never count
    assert no_routing_verdict({"routing_not_observable": [blind]}) == []


def test_the_reports_name_the_ops_and_the_declared_reason(tmp_path: Path):
    from bi_props.reporting import write_reports
    from bi_props.reporting.data import load
    from bi_props.reporting.verdict import verdict_line

    blind = {"op": "fused_moe", "switch": "enabled", "reason": "routing not observable: x"}
    (tmp_path / "report.json").write_text(json.dumps(_report(["mm"], [blind])))
    write_reports(tmp_path)
    line = verdict_line(load(tmp_path))
    assert line.startswith("NO ROUTING VERDICT (routing never observed with the switch on for 1")
    assert "claimed op(s): fused_moe; exit 3)" in line
    md = (tmp_path / "report.md").read_text()
    assert "NO ROUTING VERDICT for fused_moe" in md

    declared = {**blind, "declared": True, "reason": "routing not observable: declares: graph"}
    (tmp_path / "report.json").write_text(json.dumps(_report(["mm"], [declared])))
    write_reports(tmp_path)
    assert "NO ROUTING VERDICT" not in verdict_line(load(tmp_path))
    md = (tmp_path / "report.md").read_text()
    assert "- lib `fused_moe` [enabled] (declared by the target): routing not observable" in md


def test_the_session_marks_declared_ops_in_the_report(monkeypatch: pytest.MonkeyPatch):
    from bi_props.campaigns.session import Session
    from bi_props.model.case import Case
    from bi_props.model.space import load_profile

    session = Session("cpu", load_profile("dev"))
    hello = Hello("cpu", "enabled", "ready", covered=("mm", "sum"), unobservable={"sum": "why"})
    monkeypatch.setattr(session, "hello", lambda switch="disabled": hello)
    session.runner._hellos = {"enabled": hello}
    blind = properties.Verdict(False, "routing not observable: declares: why", "not_observable")
    session.judge = lambda *args, **kwargs: blind
    case = Case("sum", "torch.sum", "float32", (2, 3), ("contiguous",), "general", 0)
    session.check("sum", "routing", "enabled", case)
    session.check("mm", "routing", "enabled", case)
    entries = session.report()["routing_not_observable"]
    assert {e["op"]: e.get("declared", False) for e in entries} == {"sum": True, "mm": False}
    assert no_routing_verdict(session.report()) == ["mm"]


# -- the module interface ------------------------------------------------------------------------


@pytest.fixture
def library(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Write a module target ``name`` with the given body and put it on sys.path."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(name: str, body: str) -> str:
        (tmp_path / f"{name}.py").write_text(
            'OPS = ["mm", "fused_moe"]\nKERNEL_PREFIX = "lib::"\n'
            "def enable(enabled):\n    pass\n" + body
        )
        return name

    return write


def test_a_module_declares_unobservable_ops_with_a_reason(library):
    from bi_props.targets.base import TargetBroken
    from bi_props.targets.module import ModuleTarget

    target = ModuleTarget(library("declares_moe", 'UNOBSERVABLE = {"fused_moe": " graphs "}\n'))
    target.check()
    assert target.unobservable() == {"fused_moe": "graphs"}
    for name, body, says in (
        ("bad_unclaimed", 'UNOBSERVABLE = {"sum": "why"}\n', "names ops it does not claim"),
        ("bad_reason", 'UNOBSERVABLE = {"fused_moe": ""}\n', "must map claimed op names"),
        ("bad_type", 'UNOBSERVABLE = ["fused_moe"]\n', "must map claimed op names"),
    ):
        with pytest.raises(TargetBroken, match=says):
            ModuleTarget(library(name, body)).check()


def test_a_prefixed_module_counts_only_the_ops_own_aten_ops_running_its_kernel(
    monkeypatch: pytest.MonkeyPatch,
):
    """With the dispatcher's answers faked: aten::mm with the module's kernel is evidence for mm
    (and for linear, whose path it is on), never for fused_moe; a stock kernel is no failure."""
    from bi_props.targets.module import ModuleTarget

    monkeypatch.syspath_prepend(str(PLANTED))
    target = ModuleTarget("planted_foreign_event")
    target.check()
    assert target.dispatch_trace()  # prefixed, but no ROUTES
    own = {"aten::mm": True, "aten::addmm": False}
    monkeypatch.setattr(target, "kernel_is_own", own.get)
    monkeypatch.setattr(target, "_root", lambda: "/lib")
    target._active = True
    mm = {"aten::mm [CPU] is registered from /lib": True}
    assert target.evidence("mm", dispatched=("aten::t", "aten::mm")) == mm
    assert target.evidence("fused_moe", dispatched=("aten::sort", "aten::mm")) == {}
    assert target.evidence("linear", dispatched=("aten::t", "aten::addmm")) == {}
    assert target.evidence("linear", dispatched=("aten::t", "aten::mm")) == mm
    target._active = False
    assert target.evidence("mm", dispatched=("aten::mm",)) == {}


# -- real workers and bi-props fuzz on a planted library -----------------------------------------


@pytest.fixture
def planted_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    paths = [str(PLANTED), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, paths)))


@pytest.mark.slow
def test_a_worker_names_the_foreign_event(planted_on_path):
    from hypothesis import find

    from bi_props.catalogue.strategies import cases
    from bi_props.model.space import load_profile
    from bi_props.runner.controller import Runner

    space = load_profile("cpu")
    runner = Runner("planted_foreign_event", start_timeout_s=120)
    try:
        verdicts = {}
        for op in ("mm", "fused_moe"):
            case = find(cases(space, op, "routing"), lambda c: True)
            for switch in ("enabled", "disabled"):
                observation = runner.observe("routing", case, switch)
                verdicts[op, switch] = properties.routing(observation, runner.hello(switch), op)
    finally:
        runner.close()
    assert verdicts["mm", "enabled"].ok and verdicts["mm", "disabled"].ok
    assert verdicts["fused_moe", "disabled"].ok
    moe = verdicts["fused_moe", "enabled"]
    assert (moe.ok, moe.kind) == (False, "mismatch")
    message = moe.message
    assert "saw planted_foreign_event::mm, which names mm, not fused_moe" in message


@pytest.mark.campaign
@pytest.mark.slow
def test_fuzz_fails_fused_moe_routing_on_a_foreign_event_and_passes_mm(
    planted_on_path, tmp_path: Path
):
    out = tmp_path / "out"
    command = [sys.executable, "-m", "bi_props.cli", "fuzz", "--target",
               "planted_foreign_event", "--ops", "mm,fused_moe", "--budget", "45",
               "--out", str(out), "--seed", "1"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=400, cwd=tmp_path)
    assert done.returncode == 1, done.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    routing = [f for f in report["findings"] if f["property"] == "routing"]
    assert [(f["op"], f["switch"], f["kind"]) for f in routing] == [
        ("fused_moe", "enabled", "mismatch")
    ], report["findings"]
    assert "which names mm, not fused_moe" in routing[0]["message"]
    assert routing[0]["reproduced_in_fresh_process"] is True
    cells = {(c["op"], c["property"], c["switch"]): c for c in report["cells"]}
    assert cells["mm", "routing", "enabled"]["examples"] > 0
    assert "mm" in report["routing_observed"] and "fused_moe" in report["routing_observed"]
