"""``bi-props doctor``: what a target needs and what is there, ending in one verdict and an exit
status. On this machine the ascend target cannot run (no torch_npu, no NPU), and doctor must say
so and why; the built-in CPU target must be ready, and each state says how workers are replaced."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bi_props import cli

pytestmark = pytest.mark.slow

PLANTED = Path(__file__).resolve().parent / "planted"


def test_doctor_says_the_ascend_target_cannot_run_here_and_why(capsys) -> None:
    assert cli.main(["doctor", "--target", "ascend"]) == 1
    out = capsys.readouterr().out
    assert "contract: vllm_ascend is not installed" in out
    assert out.count("status: missing") == 2  # both switch states, each in its own worker
    assert "torch_npu: ModuleNotFoundError" in out
    assert "install: pip install the torch-npu release matching the installed torch" in out
    assert out.rstrip().endswith("verdict: CANNOT RUN here (see above)")


def test_doctor_on_the_cpu_target_is_ready_and_forks_its_workers(capsys) -> None:
    assert cli.main(["doctor", "--target", "cpu"]) == 0
    out = capsys.readouterr().out
    assert out.count("status: ready") == 2
    assert out.count("new workers: forked from a loaded process") == 2
    assert "[enabled] worker with VLLM_BATCH_INVARIANT=1" in out
    assert out.rstrip().endswith("verdict: ready")


def test_doctor_says_why_a_target_is_not_forked(capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    paths = [str(PLANTED), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, paths)))
    assert cli.main(["doctor", "--target", "planted_threads"]) == 0
    out = capsys.readouterr().out
    assert "new workers: spawned (not forked: loading the target started 1 thread(s))" in out
