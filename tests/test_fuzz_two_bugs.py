"""Every distinct bug in a cell: `bi-props fuzz` on a library whose mm has two bugs of
different kinds in one cell (tests/planted/planted_two_bugs.py: wrong values for K == 3, a
ValueError for more than 50 rows) reports both in `mm reference [enabled]`, each shrunk. Before,
a cell retired at its first finding and the second bug stayed hidden behind it.

The ValueError is one failure class of the op (the same exception from every enabled cell that
meets it: routing, parity, batch invariance too), shrunk and confirmed once, in whichever cell met
it first; the other cells record it as "the same failure" at their first failing example
(docs/campaigns.md, "Findings do not starve the campaign"). So the reference cell's error is
either shrunk there or points to a finding of its class that was: both are checked.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bi_props.model.case import parse_case
from planted_fuzz import fuzz_planted

BUDGET_S = 40  # both bugs were in by 20 s on loaded cores
LIMIT, BAD_K = 50, 3  # planted_two_bugs.py's

SPACE = """
[hypothesis]
max_examples = 10
[runner]
example_timeout_s = 30
start_timeout_s = 120
control_examples = 20
[ops]
include = ["mm"]
[dtypes]
choices = ["float32"]
[shapes]
rows = { min = 1, max = 128 }
dim = { min = 0, max = 16 }
boundaries = [16, 64]
[batch]
max_companions = 3
companion_rows = { min = 1, max = 128 }
[scale]
every = 0  # deployment sizes: tests/test_fuzz_deployment.py; this budget was measured without them
"""


def _rows(case: str) -> int:
    """Rows in the call: the needle's and its companions'."""
    parsed = parse_case(case)
    return parsed.shape[0] + sum(c.rows for c in (parsed.batch.companions if parsed.batch else ()))


@pytest.mark.campaign
@pytest.mark.slow
def test_fuzz_reports_two_bugs_of_different_kinds_in_one_cell(tmp_path: Path) -> None:
    code, log, report, out = fuzz_planted("planted_two_bugs", "mm", SPACE, tmp_path, BUDGET_S)
    assert code == 1, log[-3000:]
    assert "Traceback" not in log, log[-3000:]
    described = [
        (f["property"], f["switch"], f["kind"], f["shrink"][:50]) for f in report["findings"]
    ]
    cell = [
        f
        for f in report["findings"]
        if (f["op"], f["property"], f["switch"]) == ("mm", "reference", "enabled")
    ]
    kinds = {f["kind"]: f for f in cell}
    assert set(kinds) == {"mismatch", "error"}, described
    for finding in cell:
        assert finding["reproduced_in_fresh_process"] is True, finding["confirmation"]

    # The mismatch: shrunk in this cell (complete, or cut by a bound: scheduler.py) to K == 3.
    mismatch = kinds["mismatch"]
    complete = mismatch["shrink"] == "complete"
    assert complete or mismatch["shrink"].startswith("stopped "), mismatch["shrink"]
    assert parse_case(mismatch["case"]).shape[1] == BAD_K, mismatch["case"]
    assert _rows(mismatch["case"]) <= LIMIT, mismatch["case"]

    # The error: shrunk here, or recorded as the same failure as a finding of its class that was.
    error = kinds["error"]
    assert error["error_type"] == "ValueError" and _rows(error["case"]) > LIMIT, error
    shrunk = error
    if error["shrink"].startswith("not shrunk again: the same failure as "):
        shrunk = next(
            f
            for f in report["findings"]
            if f["kind"] == "error" and not f["shrink"].startswith("not shrunk again")
        )
    # (first met on a drawn case, or on the batch-invariance cell's deployment-size example,
    # past LIMIT rows by construction: shrunk by Hypothesis from it)
    complete = shrunk["shrink"] == "complete" or shrunk["shrink"].startswith(
        "shrunk by Hypothesis from an explicit example"
    )
    assert complete or shrunk["shrink"].startswith("stopped "), described
    assert _rows(shrunk["case"]) == LIMIT + 1 or not complete, shrunk["case"]

    # Both listed in report.md under the cell, and the progress line said the cell went on.
    text = (out / "report.md").read_text()
    assert "### " in text and text.count("mm reference [enabled] on planted_two_bugs") == 2, text
    assert "the cell keeps exploring for other bugs" in log
    [stats] = [
        c
        for c in report["cells"]
        if (c["op"], c["property"], c["switch"]) == ("mm", "reference", "enabled")
    ]
    assert not stats["retired"] or stats["retired_why"], stats
