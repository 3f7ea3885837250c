"""Determinism across processes: one determinism example in
``CROSS_PROCESS_EVERY`` is also run in a second, freshly started worker and compared bitwise, so
per-process state (an autotuner's pick made at the first call) is seen. End to end, real
workers: tests/planted/planted_process_choice.py picks its tile size once per process."""

from __future__ import annotations

import os
from pathlib import Path

from bi_props.campaigns.fuzz import Cell, run_slice
from bi_props.campaigns.session import CROSS_PROCESS_EVERY, Session
from bi_props.model.space import parse

PLANTED = str(Path(__file__).resolve().parent / "planted")


def _space(every: int = CROSS_PROCESS_EVERY):
    return parse(
        {
            "ops": {"include": ["mm"]},
            "dtypes": {"choices": ["float32"]},
            "values": {"choices": ["general"]},
            "shapes": {"rows": {"min": 1, "max": 4}, "dim": {"min": 16, "max": 48}},
            "runner": {
                "example_timeout_s": 30,
                "start_timeout_s": 120,
                "cross_process_every": every,
            },
        },
        "test",
        "test",
    )


def test_the_stated_rate_is_small() -> None:
    assert 4 <= CROSS_PROCESS_EVERY <= 20


def test_a_per_process_choice_is_a_determinism_finding(monkeypatch) -> None:
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([PLANTED, os.environ.get("PYTHONPATH", "")]))
    for attempt in range(3):  # two processes pick the same tile once in 64: try new ones
        session = Session("planted_process_choice", _space())
        try:
            cell = Cell("mm", "determinism", "enabled")
            run_slice(session, cell, 8 * CROSS_PROCESS_EVERY, None, seed=attempt)
            checks = session.cross_process_checks
        finally:
            session.close()
        if session.findings:
            break
    [finding] = session.findings
    assert (finding.op, finding.property, finding.switch) == ("mm", "determinism", "enabled")
    assert finding.kind == "mismatch"
    assert "determinism across processes" in finding.message, finding.message
    assert checks >= 1


def test_within_one_worker_the_planted_kernel_is_deterministic(monkeypatch) -> None:
    """Without the second worker (``[runner] cross_process_every = 0``) the bug is invisible:
    within one process the per-process pick is stable."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([PLANTED, os.environ.get("PYTHONPATH", "")]))
    session = Session("planted_process_choice", _space(0))
    try:
        cell = Cell("mm", "determinism", "enabled")
        run_slice(session, cell, 15, None, seed=1)
    finally:
        session.close()
    assert session.findings == [] and session.cross_process_checks == 0
