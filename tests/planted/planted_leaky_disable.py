"""Planted library in the thinking-machines style, bug class *a disable that leaks*: no bug in
either state as a worker starts it (enabled: a batch-invariant ``aten::mm``; disabled: stock), but
``disable_batch_invariant_mode()`` only clears its flag and leaves ``aten::mm`` overridden. Only
the switch driven as state shows it (property ``switching``, step 1: enable then disable, and
``aten::mm`` still runs this module's kernel). Expected finding: switching, in every campaign and
in the pytest plugin; the cells find nothing."""

from __future__ import annotations

import plantedlib
import torch

OPS = ["mm"]
_LIBRARIES: list = []
_ENABLED = False


def _mm(a, b):
    plantedlib.check(a, b)
    return plantedlib.mm_float64(a, b).to(a.dtype)


def enable_batch_invariant_mode() -> None:
    global _ENABLED
    if not _LIBRARIES:
        lib = torch.library.Library("aten", "IMPL")
        lib.impl("mm", _mm, "CPU")
        _LIBRARIES.append(lib)
    _ENABLED = True


def disable_batch_invariant_mode() -> None:
    global _ENABLED
    _ENABLED = False  # BUG: the aten::mm registration stays in place


def is_batch_invariant_mode_enabled() -> bool:
    return _ENABLED
