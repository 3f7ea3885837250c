"""Batches that reach the bugs: `bi-props fuzz` at its defaults finds a kernel whose
path depends on the number of sequences in the batch (tests/planted/planted_sequence_count.py,
switching at 10), shrunk to a batch of exactly 10 sequences, and the report shows that the cell's
batches crossed 10 sequences. Batches of at most 8 sequences (bi_props' earlier strategies) could
never show it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bi_props.model.case import parse_case
from planted_fuzz import fuzz_planted

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
    code, log, report, out = fuzz_planted(
        "planted_sequence_count", "attention", SPACE, tmp_path, BUDGET_S, "--max-findings", "1"
    )
    assert code == 1, log[-3000:]
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
