"""Planted library for the runner tests: the correct kernel, plus a probe of its own process.

When ``BI_PLANTED_PROBE`` names a file, ``enable()`` and every kernel call append one JSON line to
it: the worker's pid, the event, and whether Hypothesis or pytest is imported in the process.
"""

from __future__ import annotations

import json
import os
import sys

import plantedlib

NAMESPACE = "planted_probe"
OPS = ["mm"]
KERNEL_PREFIX = f"{NAMESPACE}::"
ROUTES = {"mm": (f"{NAMESPACE}::mm",)}
PROBE_ENV = "BI_PLANTED_PROBE"


def _imported(package: str) -> bool:
    return any(name == package or name.startswith(package + ".") for name in sys.modules)


def probe(event: str, **extra) -> None:
    path = os.environ.get(PROBE_ENV)
    if not path:
        return
    line = {
        "event": event,
        "pid": os.getpid(),
        "hypothesis": _imported("hypothesis"),
        "pytest": _imported("pytest") or _imported("_pytest"),
        **extra,
    }
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")


def mm(a, b):
    plantedlib.check(a, b)
    probe("mm", rows=a.shape[0])
    return plantedlib.mm_float64(a, b).to(a.dtype)


def enable(enabled: bool) -> None:
    probe("enable", enabled=enabled)
    if enabled:
        plantedlib.install(NAMESPACE, mm)
