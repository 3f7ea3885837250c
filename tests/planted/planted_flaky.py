"""Planted library, bug class *right only when replayed* (a warm-up path, a cache, a race).

The first call for each distinct input (by the bytes of both operands) goes a "cold" path that
adds one unit to every output; any later call with the same input is right. So every property
that calls mm fails on a case's first run and passes when Hypothesis replays the same case in the
same worker: Hypothesis' Flaky. Expected finding: kind ``flaky`` (e.g. mm reference [enabled]),
reproduced in a fresh worker process (which has seen no input yet).
"""

from __future__ import annotations

import hashlib

import plantedlib

NAMESPACE = "planted_flaky"
OPS = ["mm"]
KERNEL_PREFIX = f"{NAMESPACE}::"
ROUTES = {"mm": (f"{NAMESPACE}::mm",)}

_seen: set[str] = set()


def _key(a, b) -> str:
    digest = hashlib.sha256()
    for t in (a, b):
        digest.update(repr((tuple(t.shape), str(t.dtype))).encode())
        digest.update(t.contiguous().view(-1).view(__import__("torch").uint8).numpy().tobytes())
    return digest.hexdigest()


def mm(a, b):
    plantedlib.check(a, b)
    out = plantedlib.mm_float64(a, b).to(a.dtype)
    key = _key(a, b)
    if key not in _seen:  # BUG: the cold path is off by one
        _seen.add(key)
        return out + 1
    return out


def enable(enabled: bool) -> None:
    if enabled:
        plantedlib.install(NAMESPACE, mm)
