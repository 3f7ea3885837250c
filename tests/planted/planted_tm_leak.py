"""Planted library in the thinking-machines style, bug class *switch leak*, with no profiler
prefix and no ROUTES: only the dispatcher can show where ``aten::mm`` goes.

``enable_batch_invariant_mode()`` / ``disable_batch_invariant_mode()`` /
``is_batch_invariant_mode_enabled()``, as in batch_invariant_ops. BUG: the kernel is registered at
import time (not in enable), so it is in place in the disabled state too. Expected finding: mm
routing [disabled], "switch leak" naming the dispatcher entry.
"""

from __future__ import annotations

import plantedlib
import torch

OPS = ["mm"]  # optional for this style (default: what batch_invariant_ops overrides)
_ENABLED = False


def _mm(a, b):
    plantedlib.check(a, b)
    return plantedlib.mm_float64(a, b).to(a.dtype)


_LIB = torch.library.Library("aten", "IMPL")
_LIB.impl("mm", _mm, "CPU")  # BUG: at import, whatever the mode


def enable_batch_invariant_mode() -> None:
    global _ENABLED
    _ENABLED = True


def disable_batch_invariant_mode() -> None:
    global _ENABLED
    _ENABLED = False


def is_batch_invariant_mode_enabled() -> bool:
    return _ENABLED
