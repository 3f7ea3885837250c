"""The built-in CPU target: stock PyTorch CPU kernels when disabled, bi_props's own portable
batch-invariant kernels (targets/kernels) when ``VLLM_BATCH_INVARIANT=1``.

It plays the role vllm-ascend plays on an NPU: the switch is read from the environment in a fresh
process, aten ops are re-registered on the CPU dispatch key through custom ops that the profiler
shows (``bi_props_cpu::mm``...), and composite entry points are swapped as module attributes.
"""

from __future__ import annotations

from typing import Any

from .base import Target, switch_requested

NAMESPACE = "bi_props_cpu"

STOCK_PRECISION = {
    "linear": "output",
    "softmax": "output",
    "log_softmax": "output",
    "attention": "output",
    "silu_and_mul": "output",
    "gelu_and_mul": "output",
    "rotary_embedding": "output",  # vLLM's forward_native, in the operands' dtype
}
"""Stock CPU PyTorch's internal precision where it is not float32 (torch 2.13, measured against
the float64 reference over 300 drawn cases per op and dtype): 16-bit linear with a bias and 3-D
input rounds the product before adding the bias; 16-bit softmax over a non-last dim and
log_softmax round intermediates in the input dtype; the stock varlen attention is plain torch ops
in the input dtype; the stock silu_and_mul and gelu_and_mul composites (vLLM's forward_native)
round the activation to the input dtype before the product. Everything else (mm, matmul, bmm,
addmm, sum, mean, rms_norm, add_rms_norm, silu, fused_add_rms_norm, layer_norm, embedding)
computes in float32 and rounds once: bit-exact on integer inputs up to 2^24."""


_SWAPPED = {
    "add_rms_norm": "add_rms_norm",
    "attention": "varlen_attention",
    "silu_and_mul": "silu_and_mul",
    "gelu_and_mul": "gelu_and_mul",
    "fused_add_rms_norm": "fused_add_rms_norm",
    "rotary_embedding": "rotary_embedding",
    "top_k": "top_k",
    "fused_moe": "fused_moe",
    "paged_decode_attention": "paged_decode_attention",
}
"""Catalogue op -> the ``bi_props.ops`` composite the enabled target swaps for its kernel."""


def stock_precision(op: str) -> str:
    """What stock CPU PyTorch computes ``op`` in (``STOCK_PRECISION``, else float32)."""
    return STOCK_PRECISION.get(op, "float32")


class CpuTarget(Target):
    name = "cpu"
    device = "cpu"
    kernel_prefix = f"{NAMESPACE}::"

    def __init__(self) -> None:
        import bi_props.ops as ops

        self._active = False
        self._stock = {name: getattr(ops, name) for name in _SWAPPED.values()}

    def activate(self) -> None:
        if switch_requested():
            from .kernels import install

            install(NAMESPACE)
            self._active = True

    def repro_setup(self, enabled: bool) -> str:
        if not enabled:
            return "# switch off: stock PyTorch CPU kernels"
        return "from bi_props.targets.kernels import install  # the CPU target's kernels\ninstall()"

    def covered(self) -> tuple[str, ...]:
        from .kernels.register import ROUTES

        return tuple(ROUTES)

    def routes(self) -> dict[str, tuple[str, ...]]:
        from .kernels.register import ROUTES

        return dict(ROUTES)

    def switch_state(self) -> dict[str, Any]:
        return {"active": self._active}

    def evidence(self, op: str) -> dict[str, bool]:
        """For the swapped entry points (``_SWAPPED``): is the function in place not the stock
        one?"""
        import bi_props.ops as ops

        attr = _SWAPPED.get(op)
        if attr is None:
            return {}
        return {f"bi_props.ops.{attr} swapped": getattr(ops, attr) is not self._stock[attr]}

    def precision(self, op: str) -> str:
        """Enabled: bi_props's kernels compute in float32 (float64 for exp/log/sqrt) and round
        once. Disabled: stock PyTorch, as measured (``STOCK_PRECISION``)."""
        return "float32" if self._active else stock_precision(op)
