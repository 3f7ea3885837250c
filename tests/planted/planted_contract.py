"""Planted library, bug class *contract change*.

Correct values, but for bfloat16 inputs it returns the float32 accumulator instead of rounding it
to bfloat16 (stock ``torch.mm`` returns the input dtype). Expected findings: mm parity [both] and
mm reference [enabled] ("contract changed"), the minimal case being bfloat16.
"""

from __future__ import annotations

import plantedlib
import torch

NAMESPACE = "planted_contract"
OPS = ["mm"]
KERNEL_PREFIX = f"{NAMESPACE}::"
ROUTES = {"mm": (f"{NAMESPACE}::mm",)}


def mm(a, b):
    plantedlib.check(a, b)
    out = plantedlib.mm_float64(a, b)
    # BUG: bfloat16 inputs give a float32 result
    return out.to(torch.float32 if a.dtype == torch.bfloat16 else a.dtype)


def enable(enabled: bool) -> None:
    if enabled:
        plantedlib.install(NAMESPACE, mm)
