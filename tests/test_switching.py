"""The ``switching`` property (bi_props.switching) on planted two-way switches, each run in a
spawned interpreter as the property runs: a correct one holds, a non-re-entrant one is caught
with its minimal steps, and one-way targets are "not applicable"."""

from __future__ import annotations

from pathlib import Path

import pytest

from bi_props import switching

PLANTED = Path(__file__).resolve().parent / "planted"


@pytest.fixture
def planted_on_path(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(PLANTED))


def test_correct_two_way_switch_holds(planted_on_path):
    verdict = switching.judge("planted_two_way", max_examples=25)
    assert verdict == {"ok": True, "message": ""}


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


def test_a_module_without_disable_is_refused(planted_on_path):
    verdict = switching.judge("planted_correct")
    assert verdict["ok"] is False
    assert "not a two-way switch" in verdict["message"] or "disable" in verdict["message"]
