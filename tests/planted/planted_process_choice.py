"""Planted library, bug class *per-process state* (an autotuner's pick made at the first call).

At its first call in a process the kernel picks a tile size at random (like an autotuner timing
candidates once per process) and keeps it: it accumulates K in float32 tile by tile, then adds
the tiles' partial sums. Within one process every call agrees bit for bit (deterministic, and
row-wise, so batch-invariant); in another process the pick, and so the rounding, may differ.
Expected finding: mm determinism [enabled] across processes, and nothing else (two processes
pick the same tile once in 64).
"""

from __future__ import annotations

import random

import plantedlib
import torch

NAMESPACE = "planted_process_choice"
OPS = ["mm"]
KERNEL_PREFIX = f"{NAMESPACE}::"
ROUTES = {"mm": (f"{NAMESPACE}::mm",)}

_tile: int | None = None  # BUG: chosen once per process, at the first call


def mm(a, b):
    global _tile
    plantedlib.check(a, b)
    if _tile is None:
        _tile = random.SystemRandom().randrange(1, 65)
    m, k = a.shape
    a32, b32 = a.to(torch.float32), b.to(torch.float32)
    total = torch.zeros((m, b.shape[1]), dtype=torch.float32)
    for start in range(0, k, _tile):
        part = torch.zeros((m, b.shape[1]), dtype=torch.float32)
        for i in range(start, min(start + _tile, k)):
            part += a32[:, i : i + 1] * b32[i : i + 1, :]
        total += part
    return total.to(a.dtype)


def enable(enabled: bool) -> None:
    if enabled:
        plantedlib.install(NAMESPACE, mm)
