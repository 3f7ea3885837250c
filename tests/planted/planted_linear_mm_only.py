"""Planted library in the thinking-machines style, bug class *routing through a stock path op*, with
no profiler prefix and no ROUTES: it claims ``linear`` but overrides only ``aten::mm`` on CPU
(``torch.library``, as batch_invariant_ops does).

``F.linear`` without a bias dispatches ``aten::mm`` (the module's kernel); with a bias it
dispatches stock ``aten::addmm``, which the module never overrides. Expected finding: linear
routing [enabled] with a bias, naming ``aten::addmm``; no finding without a bias, nor disabled.
"""

from __future__ import annotations

import plantedlib
import torch

OPS = ["linear"]
_LIBRARIES: list = []


def _mm(a, b):
    plantedlib.check(a, b)
    return plantedlib.mm_float64(a, b).to(a.dtype)


def enable_batch_invariant_mode() -> None:
    lib = torch.library.Library("aten", "IMPL")
    lib.impl("mm", _mm, "CPU")  # BUG: aten::addmm (linear with a bias) stays stock
    _LIBRARIES.append(lib)


def disable_batch_invariant_mode() -> None:
    _LIBRARIES.clear()


def is_batch_invariant_mode_enabled() -> bool:
    return bool(_LIBRARIES)
