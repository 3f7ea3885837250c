"""Planted library, bug class *a scale taken over the whole batch* (a batch-mate's outlier).

Like ``planted_correct``, except that mm scales its left operand by a dynamic per-tensor scale
before the product and back after, as a dynamic-quantization GEMM does: ``s = max(amax, FLOOR)
/ 448`` with ``amax`` the largest magnitude in the *whole batch*. Dividing by ``s`` rounds each
element to float32, so a row's bits depend on ``s``. While every value of the batch stays below
FLOOR the scale is the same constant for every batch and the kernel is batch-invariant; one
companion holding outliers (values 10^2 to 10^4 times the others) moves ``s`` and every row's
last bits. Needles and companions of general values never reach FLOOR, so with them only a
batch-mate's content shows it (wide values may reach it in the needle alone: another way in).
Both paths are within the reference bound. Expected finding: mm batch_invariance [enabled], a
companion with ``content='outlier'``.
"""

from __future__ import annotations

import plantedlib
import torch

NAMESPACE = "planted_outlier_scale"
OPS = ["mm"]
KERNEL_PREFIX = f"{NAMESPACE}::"
ROUTES = {"mm": (f"{NAMESPACE}::mm",)}
FLOOR = 64.0  # the scale's floor: no plain value of the needle's classes reaches it


def mm(a, b):
    plantedlib.check(a, b)
    if a.numel() == 0 or not a.is_floating_point():
        return plantedlib.mm_float64(a, b).to(a.dtype)
    finite = a[torch.isfinite(a)]
    amax = float(finite.abs().max()) if finite.numel() else 0.0
    # BUG: a per-tensor scale over the whole batch (per-token would be batch-invariant)
    scale = torch.tensor(max(amax, FLOOR) / 448.0, dtype=torch.float32)
    scaled = a.to(torch.float32) / scale  # each element rounded to float32 at this scale
    return (plantedlib.mm_float64(scaled, b) * float(scale)).to(a.dtype)


def enable(enabled: bool) -> None:
    if enabled:
        plantedlib.install(NAMESPACE, mm)
