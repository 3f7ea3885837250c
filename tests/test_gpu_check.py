"""scripts/gpu_check.sh without a GPU: its syntax, argument handling and the plan of its parts.
It is run for real (on CPU, ``--interpret``) by hand; on a GPU by whoever has one (README)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.sh"


def _run(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
    )


def test_syntax():
    proc = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_help_describes_the_parts():
    proc = _run("--help")
    assert proc.returncode == 0, proc.stderr
    for word in ("OUT_DIR", "--wheels", "controls", "sglang", "vllm", "--interpret"):
        assert word in proc.stdout, word


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "missing OUT_DIR"),
        (("out", "--bogus"), "unknown option '--bogus'"),
        (("out", "other"), "one OUT_DIR only"),
        (("out", "--wheels"), "--wheels needs a folder"),
        (("out", "--wheels", "/nonexistent/wheels"), "is not a folder"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(args, message):
    proc = _run(*args)
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert message in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_bad_interpret_variable_is_refused():
    proc = _run("out", "--plan", BI_PROPS_GPU_CHECK_INTERPRET="yes")
    assert proc.returncode == 2 and "must be 0 or 1" in proc.stderr, proc.stderr


def test_plan_on_a_gpu_lists_three_timed_parts_writing_into_out(tmp_path):
    proc = _run(str(tmp_path / "out"), "--plan", BI_PROPS_GPU_CHECK_INTERPRET="0")
    assert proc.returncode == 0, proc.stderr
    lines = [ln.strip() for ln in proc.stdout.splitlines()[1:]]
    assert [ln.split()[0] for ln in lines] == ["controls", "sglang", "vllm"], proc.stdout
    for line, part in zip(lines, ("controls", "sglang", "vllm"), strict=True):
        assert "timeout 140 " in line, line
        assert f"{tmp_path}/out/{part}/report.json" in line, line
    assert "--hypothesis-profile=cuda" in lines[0] and "test_batch_variance_control" in lines[0]
    assert "gpu-check.toml" in lines[1] and "--bi-target vllm" in lines[2]
    assert not (tmp_path / "out").exists(), "--plan must not create anything"


def test_interpret_plan_uses_the_tiny_space(tmp_path):
    proc = _run(str(tmp_path), "--plan", "--interpret")
    assert proc.returncode == 0, proc.stderr
    assert "interpret=1" in proc.stdout
    assert proc.stdout.count("gpu-check-interpret.toml") == 3, proc.stdout
    assert "--hypothesis-profile=cuda" not in proc.stdout
