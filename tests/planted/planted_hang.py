"""Planted library, bug class *hang*: the kernel never returns when K == 7 (a spin on a barrier
that one thread never reaches, say). Expected findings: timeout findings in the enabled state, the
minimal case having K == 7."""

from __future__ import annotations

import time

import plantedlib

NAMESPACE = "planted_hang"
OPS = ["mm"]
KERNEL_PREFIX = f"{NAMESPACE}::"
ROUTES = {"mm": (f"{NAMESPACE}::mm",)}
STUCK_K = 7


def mm(a, b):
    plantedlib.check(a, b)
    while a.shape[1] == STUCK_K:  # BUG
        time.sleep(3600)
    return plantedlib.mm_float64(a, b).to(a.dtype)


def enable(enabled: bool) -> None:
    if enabled:
        plantedlib.install(NAMESPACE, mm)
