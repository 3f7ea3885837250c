"""Two planted batch-wide switch classes, each found and shrunk by `bi-props fuzz` at its defaults:

- a reduction switch at 256 rows (tests/planted/planted_reduction_switch.py: rms_norm reduces in
  float64 below 256 rows, in float32 from 256 on; vLLM's own test compares 255 against 300 rows):
  batch invariance finds it, and the shrunk batch holds exactly 256 rows;
- expert slots assigned by arrival order (tests/planted/planted_arrival_order.py: fused_moe adds
  a token's expert outputs slot by slot, a slot being its arrival rank among the expert's
  tokens): batch invariance or row permutation finds it, in a case that needs the class: topk of
  at least 3 (two terms add the same in either order) and, for batch invariance, a token of
  another sample arriving before the needle's.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bi_props.model.case import parse_case
from planted_fuzz import fuzz_planted

COMMON = """
[hypothesis]
max_examples = 10
[runner]
example_timeout_s = 30
start_timeout_s = 120
control_examples = 20
[dtypes]
choices = ["float32"]
[layouts]
choices = ["contiguous"]
"""

REDUCTION_SPACE = (
    COMMON
    + """
[ops]
include = ["rms_norm"]
[shapes]
dim = { min = 1, max = 64 }
[batch]
max_companions = 3
"""
)

MOE_SPACE = (
    COMMON
    + """
[ops]
include = ["fused_moe"]
[shapes]
dim = { min = 1, max = 32 }
[batch]
max_companions = 3
companion_rows = { min = 1, max = 64 }
"""
)


def _findings(report: dict, op: str, properties: tuple[str, ...]) -> list[dict]:
    return [
        f
        for f in report["findings"]
        if f["op"] == op and f["property"] in properties and f["switch"] == "enabled"
    ]


@pytest.mark.campaign
@pytest.mark.slow
def test_fuzz_finds_a_reduction_switch_at_256_rows(tmp_path: Path) -> None:
    code, log, report, _ = fuzz_planted(
        "planted_reduction_switch", "rms_norm", REDUCTION_SPACE, tmp_path, 60, "--max-findings", "1"
    )
    assert code == 1, log[-3000:]
    found = _findings(report, "rms_norm", ("batch_invariance",))
    assert found, [(f["op"], f["property"], f["switch"], f["kind"]) for f in report["findings"]]
    case = parse_case(found[0]["case"])
    rows = case.shape[0] + sum(c.rows for c in case.batch.companions)
    assert rows >= 256, case  # below 256 rows the kernel is invariant: the class itself
    if found[0]["shrink"] == "complete":
        assert rows == 256, case


@pytest.mark.campaign
@pytest.mark.slow
def test_fuzz_finds_expert_slots_assigned_by_arrival_order(tmp_path: Path) -> None:
    code, log, report, _ = fuzz_planted(
        "planted_arrival_order", "fused_moe", MOE_SPACE, tmp_path, 90, "--max-findings", "1"
    )
    assert code == 1, log[-3000:]
    found = _findings(report, "fused_moe", ("batch_invariance", "row_permutation"))
    assert found, [(f["op"], f["property"], f["switch"], f["kind"]) for f in report["findings"]]
    finding = found[0]
    case = parse_case(finding["case"])
    assert case.shape[4] >= 3, case  # topk: k >= 3 expert outputs, summed in arrival order
    if finding["property"] == "batch_invariance":
        before = case.batch.companions[: case.batch.position]
        assert sum(c.rows for c in before) >= 1, case  # a token arrived before the needle's
    else:
        assert case.shape[0] + sum(c.rows for c in case.batch.companions) >= 2, case
