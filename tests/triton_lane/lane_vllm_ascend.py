"""The property suite against ``--bi-target vllm-ascend-triton``: vllm-ascend 0.23.0's
batch-invariant Triton kernels (matmul_persistent, linear_persistent, its softmax) from the
unpacked wheel, registered as vllm-ascend registers them without its AscendC ops, under the
interpreter with the stated stand-ins (bi_props.targets.vllm_ascend_triton)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from lane_suite import SuiteRun, run_suite, suite_file

from conftest import LARGE_CASES, REPO, largest_shapes

STRATEGIES = REPO / "strategies" / "triton-ascend.toml"
TIMEOUT_S = 1500
OPS = ("mm", "matmul", "linear", "addmm", "bmm", "softmax")
# vllm-ascend 0.23.0's host-logic findings (README; docs/examples/vllm-ascend-*-issue.md):
# op -> what the override raises where stock torch returns a result.
KNOWN = {
    "matmul": "matmul_batch_invariant currently only supports 2D x 2D",
    "linear": "x must be a 2D tensor",
    "addmm": "bias must be a 1D tensor",
    "softmax": "Expected reduction dim -1 to have non-zero size",
}
# Its precision findings in 16-bit dtypes (reference cells: the stock op computes in float32
# and rounds once): linear rounds x @ W^T to the input dtype before adding the bias (3 bf16 ulps
# where they cancel), softmax runs max, exp, sum and division in bfloat16.
KNOWN_PRECISION = {"linear", "softmax"}


@pytest.fixture(scope="module")
def lane(tmp_path_factory) -> SuiteRun:
    if not os.environ.get("BI_PROPS_VLLM_ASCEND_SRC"):
        pytest.fail(
            "BI_PROPS_VLLM_ASCEND_SRC must name the unpacked vllm-ascend 0.23.0 wheel "
            "(scripts/ci_triton_lane.sh fetches it)",
            pytrace=False,
        )
    base = Path(os.environ.get("BI_PROPS_TRITON_OUT", tmp_path_factory.mktemp("ascend")))
    out = base / "vllm-ascend-triton"
    out.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "pytest", str(suite_file()), "--bi-target", "vllm-ascend-triton",
        "--bi-strategies", str(STRATEGIES),
        "--bi-regressions", str(LARGE_CASES / "large_cases_ascend.toml"),
    ]  # fmt: skip
    return run_suite(out, command, dict(os.environ), TIMEOUT_S, "vllm-ascend-triton")


def test_suite_ran_against_the_wheels_kernels(lane):
    assert lane.report is not None, lane.log[-3000:]
    assert "INTERNALERROR" not in lane.log
    env = lane.report["environment"]
    assert env["vllm_ascend"] == "0.23.0", env
    assert env["triton_interpret"] is True and env["triton"] == "3.9.0", env
    assert "relaxed_block_shape" in env["triton_compat"].split(","), env
    assert env["vllm_ascend_HAS_ASCENDC_BATCH_INVARIANT"] == "False", env
    assert "num_vectorcore 48" in env["vllm_ascend_stand_ins"], env
    for name in ("aten::mm", "aten::matmul", "aten::linear", "aten::addmm", "aten::bmm"):
        assert name in env["vllm_ascend_predicted"], env  # read from the source (disabled)
    assert lane.report["examples"] > 0


def test_routing_reaches_the_wheels_kernels(lane):
    """Disabled: no override. Enabled: the CPU kernel is the one registered from the wheel's
    batch_invariant.py, or the op raised a known host-logic error first."""
    for op in OPS:
        outcome, message = lane.outcomes[f"test_property[{op}-routing-disabled]"]
        assert outcome == "passed", (op, message)
        outcome, message = lane.outcomes[f"test_property[{op}-routing-enabled]"]
        if outcome != "passed":
            assert op in KNOWN and KNOWN[op] in message, (op, message)


def test_what_holds_and_what_was_found(lane):
    """Every failure is a recorded, reproduced, known finding (host logic, or 16-bit precision
    below the stock op's); every op is batch-invariant and deterministic where it returns."""
    regressions = [o for n, o in lane.outcomes.items() if n.startswith("test_regression")]
    assert regressions == [("passed", "")] * 5, regressions
    # a cell's known cases (test_known_cases) are its examples too: the same cell
    failed = {
        n.replace("test_known_cases[", "test_property[", 1)
        for n, (o, _) in lane.outcomes.items()
        if o == "failed"
    }
    recorded = {
        f"test_property[{f['op']}-{f['property']}-{f['switch']}]" for f in lane.report["findings"]
    }
    assert failed == recorded, (failed, recorded)
    assert lane.report["switching"]["message"].startswith("not applicable: "), lane.report
    for f in lane.report["findings"]:
        assert f["reproduced_in_fresh_process"] is True, f
        if f["kind"] == "mismatch":
            assert f["op"] in KNOWN_PRECISION and f["property"] == "reference", f
            assert f["case_class"].split("/")[0] in ("bfloat16", "float16"), f
            continue
        assert f["op"] in KNOWN and KNOWN[f["op"]] in f["message"], f
        assert f["kind"] == "error", f
    for op in OPS:
        for prop in ("batch_invariance", "determinism"):
            outcome, message = lane.outcomes[f"test_property[{op}-{prop}-enabled]"]
            assert outcome == "passed", (op, prop, message)
    seen = {c["op"] for c in lane.report["controls"] if c.get("variance_seen")}
    # mm's explicit control example shows stock variance on MKL; on a host whose BLAS keeps one
    # K order at every M, matmul or linear must (the CI host of 2026-12-02 saw only those two).
    assert seen & {"mm", "matmul", "linear"}, lane.report["controls"]
    mm = next(c for c in lane.report["controls"] if c["op"] == "mm")
    assert mm["variance_seen"] or mm["applicable"] is False, mm  # never blind: evidence either way


def test_matmuls_cross_the_tiles(lane):
    """The run reached N and K above matmul_persistent's 128-wide tiles (BLOCK_K 64) and bf16
    linear_persistent's BLOCK_K 256, with a batch past M = 128 (large_cases_ascend.toml)."""
    shapes = largest_shapes(lane.out)
    for op in ("mm", "matmul", "linear", "addmm"):
        assert shapes[op]["N"] > 128 and shapes[op]["K"] > 128, (op, shapes[op])
    assert shapes["linear"]["K"] > 256, shapes["linear"]
    assert shapes["mm"]["batch_rows"] > 128, shapes["mm"]
    assert shapes["bmm"]["N"] > 128 and shapes["bmm"]["K"] > 128, shapes["bmm"]
