"""Planted library, bug class *crash*: the kernel segfaults when M > 100 (an out-of-bounds tile
index, say). Expected findings: crash (SIGSEGV) findings in the enabled state, each minimal case
having exactly 101 rows in the call."""

from __future__ import annotations

import os
import signal

import plantedlib

NAMESPACE = "planted_crash"
OPS = ["mm"]
KERNEL_PREFIX = f"{NAMESPACE}::"
ROUTES = {"mm": (f"{NAMESPACE}::mm",)}
LIMIT = 100


def mm(a, b):
    plantedlib.check(a, b)
    if a.shape[0] > LIMIT:  # BUG
        os.kill(os.getpid(), signal.SIGSEGV)
    return plantedlib.mm_float64(a, b).to(a.dtype)


def enable(enabled: bool) -> None:
    if enabled:
        plantedlib.install(NAMESPACE, mm)
