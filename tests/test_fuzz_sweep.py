"""The exhaustive 16-bit sweep: `bi-props fuzz` at its defaults runs every bf16 and
fp16 bit pattern through silu once per switch state, finds a kernel wrong on the single bf16
pattern 0x4B80 (tests/planted/planted_rare_pattern.py) and shrinks the finding to that pattern
alone; with the sweep off (``[values] exhaustive = false``) the same budget of random examples
finds nothing (no value class draws 2^24)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bi_props.model.case import BIT_PATTERNS, parse_case
from planted_fuzz import fuzz_planted

BUDGET_S = 30
RARE = 0x4B80  # planted_rare_pattern.RARE

SPACE = """
[hypothesis]
max_examples = 10
[runner]
example_timeout_s = 30
start_timeout_s = 120
control_examples = 20
[ops]
include = ["silu"]
[dtypes]
choices = ["bfloat16", "float16"]
"""


@pytest.mark.campaign
@pytest.mark.slow
def test_fuzz_sweep_finds_a_kernel_wrong_on_one_rare_pattern(tmp_path: Path) -> None:
    code, log, report, out = fuzz_planted(
        "planted_rare_pattern", "silu", SPACE, tmp_path, BUDGET_S, "--max-findings", "1"
    )
    assert code == 1, log[-3000:]
    found = [
        f
        for f in report["findings"]
        if (f["op"], f["property"], f["switch"]) == ("silu", "reference", "enabled")
    ]
    assert found, [(f["op"], f["property"], f["switch"], f["kind"]) for f in report["findings"]]
    case = parse_case(found[0]["case"])
    assert (case.values, case.dtype, case.shape, case.seed) == (
        BIT_PATTERNS, "bfloat16", (1, 1), RARE
    ), case  # fmt: skip
    [failed] = [s for s in report["sweeps"] if not s["ok"]]
    assert (failed["switch"], failed["dtype"], failed["patterns"]) == ("enabled", "bfloat16", 65536)
    assert failed["failing_pattern"] == "0x4b80"
    assert "## Exhaustive 16-bit sweeps" in (out / "report.md").read_text()


@pytest.mark.campaign
@pytest.mark.slow
def test_random_examples_alone_miss_the_rare_pattern(tmp_path: Path) -> None:
    space = SPACE + "[values]\nexhaustive = false\n"
    code, log, report, _ = fuzz_planted(
        "planted_rare_pattern", "silu", space, tmp_path, BUDGET_S, "--max-findings", "1"
    )
    assert code == 0, log[-3000:]
    assert report["findings"] == [] and report["sweeps"] == []
    assert report["examples"] > 100, report["examples"]  # the budget ran random examples
