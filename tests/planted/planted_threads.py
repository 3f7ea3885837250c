"""Planted library that starts a thread while loading (as a tokenizer or a runtime would). It is
correct; what it shows is that such a target is never forked (runner/worker.py), because a forked
copy of a process with threads may hang in its first parallel region."""

from __future__ import annotations

import threading

import plantedlib

NAMESPACE = "planted_threads"
OPS = ["mm"]
KERNEL_PREFIX = f"{NAMESPACE}::"
_STOP = threading.Event()
_THREAD = threading.Thread(target=_STOP.wait, name="planted-background", daemon=True)
_THREAD.start()


def mm(a, b):
    plantedlib.check(a, b)
    return plantedlib.mm_float64(a, b).to(a.dtype)


def enable(enabled: bool) -> None:
    if enabled:
        plantedlib.install(NAMESPACE, mm)
