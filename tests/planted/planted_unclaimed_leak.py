"""Planted library, bug class *the switch changes an op it does not claim*.

It claims ``mm`` only (a correct batch-invariant kernel), but its ``enable`` also re-registers
``aten::_softmax`` on CPU with a kernel that scales the result by 1.01. Softmax is not claimed, so
nothing promised it batch-invariant; but with the switch on it no longer computes what stock
computes. Expected finding: softmax reference [enabled], kind ``leak`` (its result with the switch
on differs from stock's on the same inputs), exit 1.
"""

from __future__ import annotations

import warnings

import plantedlib
import torch

NAMESPACE = "planted_unclaimed_leak"
OPS = ["mm"]
KERNEL_PREFIX = f"{NAMESPACE}::"
ROUTES = {"mm": (f"{NAMESPACE}::mm",)}
_LIBRARIES: list = []


def mm(a, b):
    plantedlib.check(a, b)
    return plantedlib.mm_float64(a, b).to(a.dtype)


def _softmax(x, dim, half_to_float):
    # BUG: an op the library does not claim, changed by its switch
    shifted = torch.exp(x.float() - x.float().amax(dim, keepdim=True))
    out = shifted / shifted.sum(dim, keepdim=True) * 1.01
    return out if half_to_float else out.to(x.dtype)


def enable(enabled: bool) -> None:
    if enabled:
        plantedlib.install(NAMESPACE, mm)
        lib = torch.library.Library("aten", "IMPL")
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="(?s).*previously registered kernel")
            lib.impl("_softmax", _softmax, "CPU")
        _LIBRARIES.append(lib)
