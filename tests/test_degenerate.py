"""No pass without evidence (the campaign part): a verdict records how many elements
it compared; an example that compared none that could depend on the property (N = 0: an empty
output; K = 0: all zeros), or where both calls raised the same error, is *degenerate*: counted
apart, shown in the headline, never counted as a pass."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from bi_props.campaigns.fuzz import Cell, run_slice
from bi_props.campaigns.session import Session
from bi_props.model import properties
from bi_props.model.case import Case
from bi_props.model.observation import Call, Observation, TensorBits
from bi_props.model.properties import Verdict
from bi_props.model.space import parse
from bi_props.reporting.verdict import degenerate_line


def bits(values, dtype: str = "float32") -> TensorBits:
    array = np.asarray(values, dtype=np.float32)
    return TensorBits(dtype, array.shape, "cpu", array.view(np.uint32))


def pair(alone: Call, in_batch: Call) -> Observation:
    return Observation("batch_invariance", "disabled", {"alone": alone, "in_batch": in_batch})


def test_a_judged_verdict_records_the_elements_it_compared() -> None:
    out = Call(outputs=(bits([[1.5, 2.0], [3.0, 4.0]]),))
    verdict = properties.batch_invariance(pair(out, out))
    assert verdict.ok and verdict.compared == 4 and verdict.degenerate == ""


def test_zero_elements_compared_is_degenerate_not_a_pass() -> None:
    empty = Call(outputs=(bits(np.zeros((3, 0))),))  # N = 0
    verdict = properties.batch_invariance(pair(empty, empty))
    assert verdict.ok and verdict.compared == 0
    assert "zero elements" in verdict.degenerate


def test_all_zero_outputs_are_degenerate() -> None:
    zeros = Call(outputs=(bits(np.zeros((2, 5))),))  # K = 0: mm gives zeros, whatever the order
    verdict = properties.determinism(
        Observation("determinism", "enabled", {"first": zeros, "second": zeros})
    )
    assert verdict.ok and verdict.compared == 10 and "+0.0" in verdict.degenerate


def test_both_calls_raising_the_same_error_is_not_judged() -> None:
    raised = Call(error_type="RuntimeError", error_message="shape mismatch")
    verdict = properties.batch_invariance(pair(raised, raised))
    assert verdict.ok and verdict.compared == 0
    assert verdict.degenerate == "not judged: both calls raised RuntimeError"


def _case(m: int, k: int) -> Case:
    return Case("mm", "torch.mm", "float32", (m, k, 2), ("contiguous",) * 2, "general", 0)


def test_degenerate_examples_are_counted_apart_and_never_pass() -> None:
    def judge(case: Case) -> Verdict:
        if case.shape[1] == 0:
            return Verdict(True, compared=0, degenerate="compared zero elements")
        return Verdict(True, compared=4)

    session = Session("cpu", parse({"ops": {"include": ["mm"]}}, "test", "test"))
    session.judge = lambda op, prop, switch, case, fresh=False, patience=1.0: judge(case)
    session.strategy = lambda op, prop: st.builds(_case, st.integers(1, 4), st.integers(0, 3))
    session.covered = lambda op: True
    assert session._check("mm", "batch_invariance", "enabled", _case(2, 0)) is False
    assert session._check("mm", "batch_invariance", "enabled", _case(2, 3)) is True
    run_slice(session, Cell("mm", "batch_invariance", "enabled"), 30, None, seed=3)
    summary = session.degenerate_summary()
    assert 0 < summary["examples"] < summary["of"], summary
    [cell] = summary["cells"]
    assert (cell["op"], cell["property"], cell["switch"]) == ("mm", "batch_invariance", "enabled")
    outcomes = [line["outcome"] for line in session.examples_log]
    assert outcomes.count("degenerate") == summary["examples"] and "ok" in outcomes
    assert session.report()["degenerate"] == summary


def test_the_headline_counts_degenerate_examples() -> None:
    from bi_props.reporting import markdown
    from bi_props.reporting.data import ReportData

    report = {
        "targets": ["cpu"],
        "examples": 5300,
        "degenerate": {"examples": 812, "of": 5300, "cells": []},
        "campaign": {"cells_total": 1},
        "cells": [
            {
                "target": "cpu",
                "op": "mm",
                "property": "reference",
                "switch": "enabled",
                "examples": 5300,
            }
        ],
    }
    line = degenerate_line(report)
    assert line.startswith("degenerate: 812 of 5,300 examples"), line
    data = ReportData(None, report, [], {}, {}, [], report["cells"])
    text = markdown.render(data)
    assert "degenerate: 812 of 5,300" in text.splitlines()[0]
    assert "degenerate: 812 of 5,300 examples" in text
