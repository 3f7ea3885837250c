"""Planted library, bug class *an op claimed on another op's event*.

It claims ``mm`` and ``fused_moe`` but overrides only ``aten::mm`` (a correct kernel under its
prefix: ``planted_foreign_event::mm``), and declares no ``ROUTES``. A stock ``fused_moe`` runs
its expert GEMMs through that ``mm``, so its call shows ``planted_foreign_event::mm``: an event
of the prefix that names mm, not fused_moe. Routing once passed on any event of the prefix.
Expected: fused_moe routing [enabled] fails ("saw planted_foreign_event::mm, which names mm, not
fused_moe"); mm routing passes.
"""

from __future__ import annotations

import plantedlib
import torch

NAMESPACE = "planted_foreign_event"
OPS = ["mm", "fused_moe"]
KERNEL_PREFIX = f"{NAMESPACE}::"


def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    plantedlib.check(a, b)
    return plantedlib.mm_float64(a, b).to(a.dtype)


def enable(enabled: bool) -> None:
    if enabled:
        plantedlib.install(NAMESPACE, mm)  # BUG: nothing of fused_moe's own
