"""Padded layouts: `bi-props fuzz` at its defaults finds a kernel whose reduction
depends on the padded length of a (B, L, H) input (tests/planted/planted_padded_length.py,
switching at L = 32), and shrinks it to a needle shorter than 32 rows against a batch padded to
32 or more. A packed batch never reaches that path, whatever its rows: before the padded layout
this library was out of reach.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bi_props.model.case import parse_case
from planted_fuzz import fuzz_planted

BUDGET_S = 30
THRESHOLD = 32  # planted_padded_length.THRESHOLD

SPACE = """
[hypothesis]
max_examples = 10
[runner]
example_timeout_s = 30
start_timeout_s = 120
control_examples = 20
[ops]
include = ["rms_norm"]
[dtypes]
choices = ["float32"]
[layouts]
choices = ["contiguous"]
[batch]
max_companions = 3
"""


@pytest.mark.campaign
@pytest.mark.slow
def test_fuzz_finds_a_padded_length_dependent_kernel(tmp_path: Path) -> None:
    code, log, report, _ = fuzz_planted(
        "planted_padded_length", "rms_norm", SPACE, tmp_path, BUDGET_S, "--max-findings", "1"
    )
    assert code == 1, log[-3000:]
    found = [
        f
        for f in report["findings"]
        if (f["op"], f["property"], f["switch"]) == ("rms_norm", "batch_invariance", "enabled")
    ]
    assert found, [(f["op"], f["property"], f["switch"], f["kind"]) for f in report["findings"]]
    case = parse_case(found[0]["case"])
    # The class: the needle alone is shorter than the threshold, the batch padded past it.
    assert case.padded >= THRESHOLD > case.shape[0], case
    assert found[0]["shrink"] in ("complete", "partial", "budget"), found[0]["shrink"]
