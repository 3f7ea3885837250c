"""The Target contract: the one small interface every system under test implements (the
implementations, worker side only, are in ``bi_props.targets``), its errors and stock precision.

A target knows how to turn its switch on in a fresh process, which device it runs on, which
catalogue ops it claims to make batch-invariant, and what evidence shows that a call reached its
kernels. The core never imports a target's packages: only the worker, after the switch is set,
imports a target.
"""

from __future__ import annotations

import os
from typing import Any

SWITCH_ENV = "VLLM_BATCH_INVARIANT"

BUILTIN_TARGETS = {
    "cpu": "bi_props.targets.cpu:CpuTarget",
    "ascend": "bi_props.targets.ascend:AscendTarget",
    "vllm": "bi_props.targets.vllm:VllmTarget",
    "vllm-engine": "bi_props.targets.vllm_engine:VllmEngineTarget",
    "sglang": "bi_props.targets.sglang:SglangTarget",
    "vllm-ascend-triton": "bi_props.targets.vllm_ascend_triton:VllmAscendTritonTarget",
    "inductor": "bi_props.targets.inductor:InductorTarget",
}
"""The built-in targets' names and where each lives (``targets.resolve`` imports it by name)."""


def builtin_names() -> str:
    """The built-in targets' names, for help texts and messages (one list, never retyped)."""
    return ", ".join(BUILTIN_TARGETS)


class TargetMissing(RuntimeError):
    """The target's stack is not installed here; the message says what and how to install it."""


class TargetBroken(RuntimeError):
    """The stack is installed but fails to load or to switch; the message carries the error."""


def switch_requested() -> bool:
    """The switch as upstream reads it: ``VLLM_BATCH_INVARIANT`` parsed as ``bool(int(value))``."""
    return bool(int(os.environ.get(SWITCH_ENV, "0") or "0"))


STOCK_PRECISION = {  # the CPU target's (targets/cpu.py)
    "linear": "output",
    "sum": "output",
    "softmax": "output",
    "log_softmax": "output",
    "attention": "output",
    "mixed_attention": "output",
    "silu_and_mul": "output",
    "gelu_and_mul": "output",
    "rotary_embedding": "output",  # vLLM's forward_native, in the operands' dtype
}
"""Stock CPU PyTorch's internal precision where it is not float32 (torch 2.13, measured against
the float64 reference over 300 drawn cases per op and dtype): 16-bit linear with a bias and 3-D
input rounds the product before adding the bias; 16-bit softmax over a non-last dim and
log_softmax round intermediates in the input dtype; the stock varlen attention is plain torch ops
in the input dtype; the stock silu_and_mul and gelu_and_mul composites (vLLM's forward_native)
round the activation to the input dtype before the product; a 16-bit sum whose reduction is split
between threads (a whole-tensor sum, or one long reduced dim: from about 32,768 elements on two
threads) rounds each thread's float32 partial to the input dtype before adding them (bi-props fuzz
found it, 2026-12-04: exact bf16 integers summing to -693 gave -696 on two threads, -692 on one).
Everything else (mm, matmul, bmm, addmm, mean, rms_norm, add_rms_norm, silu, fused_add_rms_norm,
layer_norm, embedding) computes in float32 and rounds once: bit-exact on integer inputs up to
2^24."""


def cpu_stock_precision(op: str) -> str:
    """What stock CPU PyTorch computes ``op`` in (``STOCK_PRECISION``, else float32)."""
    return STOCK_PRECISION.get(op, "float32")


def stock_precision(device: str, op: str) -> str:
    """What stock PyTorch computes ``op`` in on ``device``: measured on CPU (STOCK_PRECISION);
    elsewhere "output" (cuBLAS may reduce 16-bit products in 16 bits, NPU kernels are unmeasured),
    the looser bound, so an unswitched kernel is not accused of a precision it never promised."""
    if device == "cpu":
        return cpu_stock_precision(op)
    return "output"


class Target:
    """Base class with the defaults; subclasses override what differs."""

    name: str = "target"
    device: str = "cpu"
    kernel_prefix: str = ""
    one_way: str = ""
    """Why this target's switch cannot be turned off again in a process (one process per switch
    state), or "" where it is two-way: the ``switching`` property applies only then."""

    def check(self) -> None:
        """Raise TargetMissing/TargetBroken before anything is switched."""

    def activate(self) -> None:
        """Called once in a fresh worker, after the environment holds the switch."""
        raise NotImplementedError

    def covered(self) -> tuple[str, ...]:
        """Catalogue ops this target claims to make batch-invariant."""
        return ()

    def entries(self) -> dict[str, tuple[str, ...]]:
        """Entry points that replace the catalogue's for some ops (e.g. torch_npu functions)."""
        return {}

    def routes(self) -> dict[str, tuple[str, ...]]:
        """Per covered op: profiler events of which at least one must appear when enabled."""
        return {}

    def unobservable(self) -> dict[str, str]:
        """Covered ops whose routing this target cannot show (no event, identity or dispatcher
        evidence exists for them), each with the reason: their "routing not observable" is
        reported with it and does not count as a missing routing verdict (exit 3)."""
        return {}

    def modes(self) -> tuple[str, ...]:
        """How this target's ops may be called (``Case.mode``): "eager" and "compiled"
        (``torch.compile``, Inductor) by default. A mode left out is "not applicable" in every
        report, with ``unsupported_modes()``'s reason; a target whose switch exists only
        under compile (``inductor``) lists "compiled" alone, and every case compiles."""
        return ("eager", "compiled")

    def unsupported_modes(self) -> dict[str, str]:
        """Why each mode missing from ``modes()`` does not apply here ({mode: reason})."""
        return {}

    def switch_state(self) -> dict[str, Any]:
        """Evidence that the switch propagated: what the process itself reports.

        Must contain ``active`` (bool): whether the target's kernels are installed now.
        """
        return {"active": False}

    def evidence(self, op: str) -> dict[str, bool]:
        """Identity checks for ``op`` (name -> whether the swapped function is in place)."""
        return {}

    def observe_routing(self) -> str:
        """How routing is observed: 'profiler' (legacy autograd profiler events) or 'none'."""
        return "profiler"

    def dispatch_trace(self) -> bool:
        """Whether routing reads the aten ops this example's call dispatched (a dispatcher trace,
        ``execution.execute.observe_routing``): True passes them to ``evidence(op,
        dispatched=...)`` as qualified names (``aten::addmm``, ``aten::mean.dim``)."""
        return False

    def repro_setup(self, enabled: bool) -> str:
        """Python lines that put a fresh interpreter (with the switch variable already set) in
        this switch state using only the target's own packages: the head of a reproducer."""
        return ""

    def precision(self, op: str) -> str:
        """The internal (accumulation) precision of ``op``'s kernels in this process' switch
        state: "float32", "bfloat16", "float16" or "output" (the output's own dtype). The
        reference bound is computed for it, and exactness is claimed only within its range.
        Batch-invariant kernels compute in float32: that is the default for the ops the target
        claims while its kernels are active; everything else runs stock PyTorch, which declares
        what it really does on this device (``stock_precision``)."""
        if self.switch_state().get("active") and op in self.covered():
            return "float32"
        return stock_precision(self.device, op)

    def environment(self) -> dict[str, str]:
        """Versions and capabilities recorded in every report."""
        import platform

        import torch

        return {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "device": self.device,
        }

    def promises_inference(self) -> bool:
        """Whether the switch promises batch-invariant inference as a whole (an engine's switch,
        e.g. ``VLLM_BATCH_INVARIANT=1``), not only the listed ops: then the model-level
        properties are judged whatever ops the target swaps."""
        return False

    def routing_note(self) -> str:
        """A warning about how (or whether) routing can be observed, shown once at the start of
        a run and recorded in report.json; empty when the target's own events show routing."""
        return ""
