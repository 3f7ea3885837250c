"""Planted library in the thinking-machines style, no bug, no profiler prefix and no ROUTES:
``enable_batch_invariant_mode()`` registers a batch-invariant ``aten::mm`` on CPU directly (no
custom op, so no profiler event of its own), as batch_invariant_ops does. Routing is judged from
the dispatcher: enabled, ``aten::mm``'s CPU kernel is registered from this module's directory;
disabled, it is not."""

from __future__ import annotations

import plantedlib
import torch

OPS = ["mm"]  # optional for this style (default: what batch_invariant_ops overrides)
_LIBRARIES: list = []


def _mm(a, b):
    plantedlib.check(a, b)
    return plantedlib.mm_float64(a, b).to(a.dtype)


def enable_batch_invariant_mode() -> None:
    lib = torch.library.Library("aten", "IMPL")
    lib.impl("mm", _mm, "CPU")
    _LIBRARIES.append(lib)


def disable_batch_invariant_mode() -> None:
    _LIBRARIES.clear()


def is_batch_invariant_mode_enabled() -> bool:
    return bool(_LIBRARIES)
