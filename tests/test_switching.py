"""The ``switching`` property (bi_props.runner.switching) on planted two-way switches, each run
in a spawned interpreter as the property runs: a correct one holds, a non-re-entrant one is caught
with its minimal steps, and one-way targets are "not applicable"."""

from __future__ import annotations

from pathlib import Path

import pytest

from bi_props.runner import switching

PLANTED = Path(__file__).resolve().parent / "planted"


@pytest.fixture
def planted_on_path(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(PLANTED))


def test_correct_two_way_switch_holds(planted_on_path):
    verdict = switching.judge("planted_two_way", max_examples=25)
    assert verdict == {"ok": True, "message": "", "compared": ["aten::mm"]}


SWAP_LEAK = """
import torch

_LIB = None
_STOCK_BMM = torch.bmm


def _bmm(a, b):
    return _STOCK_BMM(a, b)


def _mm(a, b):  # each element from its own row and column: batch-invariant, no aten::mm
    return (a.double().unsqueeze(-1) * b.double().unsqueeze(0)).sum(1).to(a.dtype)


def is_batch_invariant_mode_enabled():
    return _LIB is not None


def enable_batch_invariant_mode():
    global _LIB
    if _LIB is None:
        _LIB = torch.library.Library("aten", "IMPL")
        _LIB.impl("mm", _mm, "CPU")
        _LIB.impl("addmm", lambda c, a, b, beta=1, alpha=1: c + _mm(a, b), "CPU")
    torch.bmm = _bmm


def disable_batch_invariant_mode():
    global _LIB
    if _LIB is not None:
        _LIB._destroy()
    _LIB = None  # BUG: torch.bmm stays swapped
"""


def test_every_registration_and_swapped_function_is_compared(tmp_path, monkeypatch):
    """Not only aten::mm: a disable that restores the registrations but leaves torch.bmm
    swapped is caught, and the verdict lists what was compared."""
    (tmp_path / "swap_leak.py").write_text(SWAP_LEAK)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    verdict = switching.judge("swap_leak", max_examples=25)
    assert verdict["compared"] == ["aten::mm", "aten::addmm", "torch.bmm"], verdict
    assert verdict["ok"] is False, verdict
    assert "torch.bmm is a registered override" in verdict["message"], verdict


def test_non_reentrant_context_manager_is_caught(planted_on_path):
    verdict = switching.judge("planted_non_reentrant", max_examples=25)
    assert verdict["ok"] is False, verdict
    assert verdict["message"].startswith("switch state: the model expects"), verdict
    steps = verdict["message"].split("Failing test case: <state machine>", 1)[1]
    assert "state.raise_inside(" in steps or "state.enter(" in steps, verdict


@pytest.mark.parametrize("target", ["vllm", "ascend", "cpu", "vllm-engine", "vllm-ascend-triton"])
def test_one_way_targets_are_not_applicable(target):
    verdict = switching.judge(target)
    assert verdict["ok"] is None and verdict["message"].startswith("not applicable: "), verdict


def test_a_module_without_disable_is_not_applicable(planted_on_path):
    verdict = switching.judge("planted_correct")
    assert verdict["ok"] is None, verdict
    assert (
        verdict["message"].startswith("not applicable: ")
        and "not a two-way switch" in (verdict["message"])
    ), verdict


def test_session_verdict_one_way_is_not_applicable_without_running(monkeypatch):
    monkeypatch.setenv(switching.SWITCHING_ENV, "1")
    monkeypatch.setattr(switching, "judge", lambda *a, **k: pytest.fail("must not spawn"))
    verdict = switching.session_verdict("cpu")
    assert verdict["ok"] is None and verdict["message"].startswith("not applicable: ")
    assert switching.finding_fields("cpu", verdict) is None


def test_session_verdict_can_be_turned_off(monkeypatch):
    monkeypatch.setenv(switching.SWITCHING_ENV, "0")
    verdict = switching.session_verdict("planted_two_way")
    assert verdict == {"ok": None, "message": "not run: BI_PROPS_SWITCHING=0"}


def test_a_failed_verdict_is_a_switching_finding():
    message = "switch state: the model expects off, but ...\nFailing test case: <state machine>"
    fields = switching.finding_fields("t", {"ok": False, "message": message + "\nstate.enter()"})
    assert fields is not None
    assert (fields["op"], fields["property"], fields["switch"]) == ("(switch)", "switching", "both")
    assert fields["kind"] == "mismatch" and "state.enter()" in fields["case"], fields


SPACE = """
[hypothesis]
max_examples = 2
derandomize = true
database = "none"
[ops]
include = ["mm"]
[dtypes]
choices = ["float32"]
[shapes]
rows = { min = 1, max = 8 }
dim = { min = 1, max = 8 }
"""


def _suite_report(tmp_path, target: str) -> dict:
    """The property suite against ``target`` (one cell), as a user runs it; its report."""
    import json
    import os
    import subprocess
    import sys

    import bi_props.suite

    space = tmp_path / "space.toml"
    space.write_text(SPACE)
    report = tmp_path / "report.json"
    suite = Path(bi_props.suite.__file__).with_name("test_properties.py")
    env = {**os.environ, "PYTHONPATH": str(PLANTED), switching.SWITCHING_ENV: "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", str(suite), "--bi-target", target,
         "--bi-strategies", str(space), "--bi-report", str(report), "-p", "no:cacheprovider",
         "-q", "-k", "mm-routing-enabled"],
        capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert report.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(report.read_text())
    result["_stdout"] = proc.stdout
    return result


def test_report_records_the_switching_finding_of_a_two_way_target(tmp_path):
    report = _suite_report(tmp_path, "planted_non_reentrant")
    assert report["switching"]["ok"] is False, report["switching"]
    found = [f for f in report["findings"] if f["property"] == "switching"]
    assert len(found) == 1 and found[0]["op"] == "(switch)", report["findings"]
    assert "switching: FAILS" in report["_stdout"]


def test_report_says_not_applicable_for_a_one_way_target(tmp_path):
    report = _suite_report(tmp_path, "planted_correct")
    assert report["switching"]["ok"] is None, report["switching"]
    assert report["switching"]["message"].startswith("not applicable: "), report["switching"]
    assert not [f for f in report["findings"] if f["property"] == "switching"]
