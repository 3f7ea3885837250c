"""Batches that reach the bugs (issue 21): `bi-props fuzz` at its defaults finds a kernel whose
path depends on the number of sequences in the batch (tests/planted/planted_sequence_count.py,
switching at 10), shrunk to a batch of exactly 10 sequences, and the report shows that the cell's
batches crossed 10 sequences. Batches of at most 8 sequences (bi_props before issue 21) could
never show it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bi_props.model.case import parse_case

PLANTED = Path(__file__).parent / "planted"
BUDGET_S = 120

SPACE = """
[hypothesis]
max_examples = 10
[runner]
example_timeout_s = 30
start_timeout_s = 120
control_examples = 20
[ops]
include = ["attention"]
[dtypes]
choices = ["float32"]
[layouts]
choices = ["contiguous"]
[batch]
max_companions = 3
max_sequences = 33
[attention]
length = { min = 1, max = 16 }
head_dims = [8]
"""


@pytest.mark.campaign
@pytest.mark.slow
def test_fuzz_finds_a_path_chosen_by_the_number_of_sequences(tmp_path: Path) -> None:
    space = tmp_path / "space.toml"
    space.write_text(SPACE)
    out = tmp_path / "out"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(PLANTED), os.environ.get("PYTHONPATH", "")]),
    }
    command = [sys.executable, "-m", "bi_props.cli", "fuzz", "--target", "planted_sequence_count",
               "--ops", "attention", "--budget", str(BUDGET_S), "--out", str(out),
               "--strategies", str(space), "--seed", "7",
               "--max-findings", "1"]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=BUDGET_S * 6)
    log = done.stdout + done.stderr
    assert done.returncode == 1, log[-3000:]
    report = json.loads((out / "report.json").read_text())
    found = [
        f
        for f in report["findings"]
        if (f["op"], f["property"], f["switch"]) == ("attention", "batch_invariance", "enabled")
    ]
    assert found, [(f["op"], f["property"], f["switch"], f["kind"]) for f in report["findings"]]
    case = parse_case(found[0]["case"])
    assert case.batch.size >= 10, case  # beyond the 8 sequences batches held before
    if found[0]["shrink"] == "complete":
        assert case.batch.size == 10, case
    [reach] = [
        r
        for r in report["batch_reach"]
        if (r["op"], r["property"], r["switch"]) == ("attention", "batch_invariance", "enabled")
    ]
    assert reach["largest"]["sequences"] >= 10 and reach["crossed"]["sequences"]["10"] >= 1
    assert "## Batches reached" in (out / "report.md").read_text()
