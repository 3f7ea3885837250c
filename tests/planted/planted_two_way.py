"""Planted two-way switch, correct (for the ``switching`` property): thinking-machines' API
(enable/disable/set_batch_invariant_mode/is_batch_invariant_mode_enabled) over an ``aten::mm``
override on CPU, where the context manager restores the state it found, exception or not, nested
or not. Expected: the switching property holds."""

from __future__ import annotations

import contextlib
import warnings

import plantedlib
import torch

OPS = ["mm"]
_LIB: torch.library.Library | None = None


def _mm(a, b):
    plantedlib.check(a, b)
    return plantedlib.mm_float64(a, b).to(a.dtype)


def is_batch_invariant_mode_enabled() -> bool:
    return _LIB is not None


def enable_batch_invariant_mode() -> None:
    global _LIB
    if _LIB is not None:
        return
    _LIB = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _LIB.impl("mm", _mm, "CPU")


def disable_batch_invariant_mode() -> None:
    global _LIB
    if _LIB is not None:
        _LIB._destroy()
    _LIB = None


@contextlib.contextmanager
def set_batch_invariant_mode(enabled: bool = True):
    was = is_batch_invariant_mode_enabled()
    (enable_batch_invariant_mode if enabled else disable_batch_invariant_mode)()
    try:
        yield
    finally:
        (enable_batch_invariant_mode if was else disable_batch_invariant_mode)()
