"""The property suite against ``--bi-target sglang``: SGLang 0.5.23's real Triton kernels
under the interpreter, with the stated stand-ins: persistent matmul (mm, addmm) and log_softmax
in the main run (strategies/triton.toml), bmm_kernel_persistent and _rms_norm_kernel in a second,
smaller one (strategies/triton-sglang-more.toml). Each run starts with a few large examples
(large_cases_sglang*.toml: N and K past the 128-wide tiles, rows past the 1024-wide chunks); the
rest is small. SGLang's mean_dim asserts a CUDA tensor: mean runs in the GPU check only."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from lane_suite import SuiteRun, run_suite, suite_file

from bi_props.targets.sglang import REGISTERS
from conftest import LARGE_CASES, REPO, STRATEGIES, largest_shapes, longest_row

TIMEOUT_S = 1200


@pytest.fixture(scope="module")
def lane(tmp_path_factory) -> SuiteRun:
    out = Path(os.environ.get("BI_PROPS_TRITON_OUT", tmp_path_factory.mktemp("sglang"))) / "sglang"
    out.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "pytest", str(suite_file()), "--bi-target", "sglang",
        "--bi-strategies", str(STRATEGIES),
        "--bi-regressions", str(LARGE_CASES / "large_cases_sglang.toml"),
    ]  # fmt: skip
    env = {**os.environ, "BI_PROPS_SWITCHING": "1"}  # judged at the session's end
    return run_suite(out, command, env, TIMEOUT_S, "sglang")


@pytest.fixture(scope="module")
def more(tmp_path_factory) -> SuiteRun:
    base = Path(os.environ.get("BI_PROPS_TRITON_OUT", tmp_path_factory.mktemp("sglang-more")))
    out = base / "sglang-more"
    out.mkdir(parents=True, exist_ok=True)
    command = [
        sys.executable, "-m", "pytest", str(suite_file()), "--bi-target", "sglang",
        "--bi-strategies", str(REPO / "strategies" / "triton-sglang-more.toml"),
        "--bi-regressions", str(LARGE_CASES / "large_cases_sglang_more.toml"),
    ]  # fmt: skip
    env = {**os.environ, "BI_PROPS_SWITCHING": "0"}  # judged once, in the main run
    return run_suite(out, command, env, TIMEOUT_S, "sglang-more")


def test_suite_ran_against_sglang_kernels(lane):
    assert lane.report is not None, lane.log[-3000:]
    assert "INTERNALERROR" not in lane.log
    env = lane.report["environment"]
    assert env["triton_interpret"] is True and env["triton"], env
    assert env["sglang"] == "0.5.23", env
    assert "get_device_core_count() -> " in env["sglang_stand_ins"], env
    assert lane.report["examples"] > 0


# SGLang 0.5.23's host-logic findings (README, docs/examples/sglang-*-issue.md): op -> message.
KNOWN = {
    "addmm": "Currently assuming bias is 1D",
    "log_softmax": "cannot reshape tensor of 0 elements",
}


def test_routing_reaches_sglang_kernels(lane):
    """Disabled: no override anywhere. Enabled: the dispatcher's CPU kernel is SGLang's, or the
    op raised one of the known host-logic errors (then routing cannot be judged)."""
    for op in ("mm", "addmm", "log_softmax"):
        outcome, message = lane.outcomes[f"test_property[{op}-routing-disabled]"]
        assert outcome == "passed", (op, message)
        outcome, message = lane.outcomes[f"test_property[{op}-routing-enabled]"]
        if outcome != "passed":
            assert op in KNOWN and KNOWN[op] in message, (op, message)


def test_what_holds_and_what_was_found(lane):
    """Every failure is a recorded finding, reproduced in a fresh process, and one of the known
    host-logic findings; mm, addmm and log_softmax are batch-invariant and deterministic."""
    regressions = {n: o for n, o in lane.outcomes.items() if n.startswith("test_regression")}
    assert len(regressions) == 5 and set(regressions.values()) == {("passed", "")}, regressions
    failed = {n for n, (o, _) in lane.outcomes.items() if o == "failed"}
    cells = [f for f in lane.report["findings"] if f["property"] != "switching"]
    recorded = {f"test_property[{f['op']}-{f['property']}-{f['switch']}]" for f in cells}
    assert failed == recorded, (failed, recorded)
    for f in cells:
        assert f["op"] in KNOWN and KNOWN[f["op"]] in f["message"], f
        assert f["kind"] == "error" and f["reproduced_in_fresh_process"] is True, f
    assert {f["op"] for f in cells} == set(KNOWN)
    for op in ("mm", "addmm", "log_softmax"):
        for prop in ("batch_invariance", "determinism"):
            outcome, message = lane.outcomes[f"test_property[{op}-{prop}-enabled]"]
            assert outcome == "passed", (op, prop, message)
    seen = {c["op"] for c in lane.report["controls"] if c.get("variance_seen")}
    # The stock kernels' variance is visible: mm's explicit control example (M = 1 alone, 256
    # inside) shows it on MKL; a host whose BLAS keeps one K order at every M shows it on addmm.
    assert seen & {"mm", "addmm"}, lane.report["controls"]
    mm = next(c for c in lane.report["controls"] if c["op"] == "mm")
    assert mm["variance_seen"] or mm["applicable"] is False, mm  # never blind: evidence either way


def test_switching_property_on_sglang(lane):
    """SGLang's set_batch_invariant_mode, as upstream notes say, is not re-entrant: the state
    machine (run by the suite at its end) finds a step sequence after which the registered
    overrides disagree with the switch's documented meaning; report.json records the verdict
    and a finding of property `switching` with the minimal steps."""
    verdict = lane.report["switching"]
    print("sglang switching:", verdict["message"])
    assert verdict["ok"] is False, verdict
    # every registration enable_batch_invariant_mode() makes, and the torch.bmm swap, compared
    assert set(verdict["compared"]) == {*REGISTERS, "torch.bmm"}, verdict["compared"]
    assert verdict["message"].startswith("switch state: the model expects"), verdict
    assert "Failing test case: <state machine>" in verdict["message"], verdict
    found = [f for f in lane.report["findings"] if f["property"] == "switching"]
    assert len(found) == 1 and found[0]["op"] == "(switch)", found
    assert "state." in found[0]["case"], found


def test_matmuls_cross_the_tiles_and_log_softmax_the_chunks(lane):
    """The run reached N and K above SGLang's 128-wide tiles (several K tiles of 32/64) with a
    batch past M = 128, and log_softmax rows past its 1024-wide chunk (twice)."""
    shapes = largest_shapes(lane.out)
    for op in ("mm", "addmm"):
        assert shapes[op]["N"] > 128 and shapes[op]["K"] > 128, (op, shapes[op])
        assert shapes[op]["batch_rows"] > 128, (op, shapes[op])
    assert longest_row(lane.out, "log_softmax") > 2048, shapes.get("log_softmax")


def test_bmm_and_rms_norm_kernels_run_and_hold(more):
    """SGLang's bmm (aten::bmm and the torch.bmm swap) and rms_norm kernels: routed when enabled,
    batch-invariant and deterministic, across bmm's tiles and rms_norm's 1024-wide chunk. One
    finding, host logic: with eps=None SGLang's aten::rms_norm uses finfo(input dtype).eps
    (0.0078 for bf16), stock torch its opmath type's (float32: 1.2e-7), so a 16-bit rms_norm of
    small values differs from the reference (`reference`, enabled; a GPU would show it too)."""
    assert more.report is not None, more.log[-3000:]
    assert "INTERNALERROR" not in more.log
    for f in more.report["findings"]:
        assert (f["op"], f["property"], f["switch"], f["kind"]) == (
            "rms_norm", "reference", "enabled", "mismatch"
        ), f  # fmt: skip
        # eps None: written out, or left out (an explicit known case has no options: the default)
        eps_none = "'eps': None" in f["case"] or "'eps'" not in f["case"]
        assert eps_none and "float16" in f["case"], f  # float16 or bfloat16
    failed = {n for n, (o, _) in more.outcomes.items() if o == "failed"}
    assert failed <= {
        "test_property[rms_norm-reference-enabled]",
        "test_known_cases[rms_norm-reference-enabled]",  # the same cell's known cases
    }, failed
    for op in ("bmm", "rms_norm"):
        for prop in ("routing", "batch_invariance", "determinism"):
            outcome, message = more.outcomes[f"test_property[{op}-{prop}-enabled]"]
            assert outcome == "passed", (op, prop, message)
    assert more.outcomes["test_property[bmm-reference-enabled]"][0] == "passed"
    regressions = [o for n, o in more.outcomes.items() if n.startswith("test_regression")]
    assert regressions == [("passed", "")] * 2, regressions
    shapes = largest_shapes(more.out)
    assert shapes["bmm"]["N"] > 128 and shapes["bmm"]["K"] > 128, shapes["bmm"]
    assert longest_row(more.out, "rms_norm") > 1024, shapes.get("rms_norm")
