"""A batch-mate's content, end to end (`bi-props fuzz`, the campaign lane): a kernel whose scale is
taken over the whole batch is batch-invariant while every value stays plain, and caught once a
companion holds outliers; the finding's case names that companion's content, shrunk to one
companion.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PLANTED = Path(__file__).parent / "planted"
pytestmark = pytest.mark.campaign
# deployment sizes: tests/test_fuzz_deployment.py; these budgets were measured without them
GENERAL = '[values]\nchoices = ["general"]\n[scale]\nevery = 0\n'


def _fuzz(out: Path, space: Path, budget: int, *extra: str) -> tuple[int, dict, str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(PLANTED),
               os.environ.get("PYTHONPATH")])))  # fmt: skip
    command = [sys.executable, "-m", "bi_props.cli", "fuzz", "--target", "planted_outlier_scale",
               "--ops", "mm", "--strategies", str(space), "--budget", str(budget), "--seed", "1",
               "--out", str(out), *extra]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=budget * 4)
    return done.returncode, json.loads((out / "report.json").read_text()), done.stderr


def test_a_batch_wide_scale_is_caught_by_an_outlier_companion(tmp_path):
    space = tmp_path / "space.toml"
    space.write_text(GENERAL)
    code, report, log = _fuzz(tmp_path / "out", space, 60, "--max-findings", "1")
    assert code == 1, log[-3000:]
    found = [
        f
        for f in report["findings"]
        if (f["op"], f["property"], f["switch"]) == ("mm", "batch_invariance", "enabled")
    ]
    assert found, [(f["op"], f["property"], f["kind"]) for f in report["findings"]]
    case = found[0]["case"]
    assert "content='outlier'" in case or "content='huge'" in case, case
    assert case.count("Companion(") == 1, case  # shrunk to the one companion that moves it
    reach = [e for e in report["batch_reach"] if e["property"] == "batch_invariance"]
    # the batch reach counts the contents the cell's examples held
    assert any(e["contents"]["outlier"] + e["contents"]["huge"] for e in reach), reach


def test_without_companion_content_the_same_search_passes(tmp_path):
    """The contrast: plain companions (the needle's value class) never reach the scale's floor."""
    space = tmp_path / "space.toml"
    space.write_text(GENERAL + '[batch]\ncontents = ["plain"]\n')
    code, report, log = _fuzz(tmp_path / "out", space, 60, "--examples-per-cell", "12")
    assert code == 0, log[-3000:]
    judged = next(o for o in report["evidence"]["ops"] if o["op"] == "mm")["judged"]
    assert judged["batch_invariance"] >= 10, judged
