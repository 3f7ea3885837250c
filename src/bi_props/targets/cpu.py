"""The built-in CPU target: stock PyTorch CPU kernels when disabled, bi_props's own portable
batch-invariant kernels (targets/kernels) when ``VLLM_BATCH_INVARIANT=1``.

It plays the role vllm-ascend plays on an NPU: the switch is read from the environment in a fresh
process, aten ops are re-registered on the CPU dispatch key through custom ops that the profiler
shows (``bi_props_cpu::mm``...), and composite entry points are swapped as module attributes.
"""

from __future__ import annotations

from typing import Any

from ..model.target import STOCK_PRECISION, Target, cpu_stock_precision, switch_requested

__all__ = ["NAMESPACE", "STOCK_PRECISION", "CpuTarget", "stock_precision"]

NAMESPACE = "bi_props_cpu"


def stock_precision(op: str) -> str:
    """What stock CPU PyTorch computes ``op`` in (``STOCK_PRECISION``, else float32)."""
    return cpu_stock_precision(op)


class CpuTarget(Target):
    one_way = "registered once at worker start from VLLM_BATCH_INVARIANT; no disable"
    name = "cpu"
    device = "cpu"
    kernel_prefix = f"{NAMESPACE}::"

    def __init__(self) -> None:
        import bi_props.ops as ops

        from .kernels.register import SWAPPED_OPS

        self._active = False
        self._swapped = dict(SWAPPED_OPS)
        self._stock = {name: getattr(ops, name) for name in self._swapped.values()}

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
        """For the swapped entry points (``kernels.register.SWAPPED_OPS``): is the function in
        place not the stock one?"""
        import bi_props.ops as ops

        attr = self._swapped.get(op)
        if attr is None:
            return {}
        return {f"bi_props.ops.{attr} swapped": getattr(ops, attr) is not self._stock[attr]}

    def precision(self, op: str) -> str:
        """Enabled: bi_props's kernels compute in float32 (float64 for exp/log/sqrt) and round
        once. Disabled: stock PyTorch, as measured (``STOCK_PRECISION``)."""
        return "float32" if self._active else stock_precision(op)
