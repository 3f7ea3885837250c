"""Planted library, bug class *bypassed under compile*.

Its ``aten::mm`` kernel is correct and batch-invariant (``planted_correct``'s: every output
element summed over K in float64, in order, rounded once), and eagerly every ``torch.mm`` reaches
it. But it re-registers only ``aten::mm`` itself on the CPU key, as most batch-invariant
libraries do (vLLM's, thinking-machines'). Once the op is compiled (``torch.compile``, as vLLM and
trainers run a model), Inductor does not call ``aten::mm``: it lowers the graph's mm to its own
extern call ``extern_kernels.mm(a, b, out=buf)`` (``aten::mm.out``, stock), or to a pointwise
product where K is 1. The library's kernel is never reached, and the stock kernel's batch
variance is back (vLLM's tests/v1/determinism/test_awq_batch_invariant.py: "Inductor lowers
torch.matmul itself, bypassing the aten overrides").

Expected findings, compiled cases only (``[modes] choices = ["eager", "compiled"]``, or
``bi-props fuzz --modes eager,compiled``): mm routing [enabled] (no ``planted_compile_bypass::mm``
event in the compiled call), and mm batch_invariance [enabled] where stock mm is batch-variant
(a needle of one row: stock CPU mm takes another path for M = 1). Eager cases hold.
"""

from __future__ import annotations

import plantedlib

NAMESPACE = "planted_compile_bypass"
OPS = ["mm"]
KERNEL_PREFIX = f"{NAMESPACE}::"
ROUTES = {"mm": (f"{NAMESPACE}::mm",)}


def mm(a, b):
    plantedlib.check(a, b)
    return plantedlib.mm_float64(a, b).to(a.dtype)


def enable(enabled: bool) -> None:
    if enabled:  # BUG: aten::mm only; a compiled graph calls aten::mm.out (or no mm at all)
        plantedlib.install(NAMESPACE, mm)
