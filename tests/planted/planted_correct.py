"""Planted library: correct. A batch-invariant ``aten::mm`` on CPU, no bug; and the sampler
(``bi_props.ops.sample``, the cpu target's row-by-row kernel), no bug either.

Every output element is summed over K in float64, in order, and rounded once to the input dtype,
so a row's result cannot depend on how many other rows share the call.
"""

from __future__ import annotations

import plantedlib

NAMESPACE = "planted_correct"
OPS = ["mm", "sample"]
KERNEL_PREFIX = f"{NAMESPACE}::"
ROUTES = {"mm": (f"{NAMESPACE}::mm",)}


def mm(a, b):
    plantedlib.check(a, b)
    return plantedlib.mm_float64(a, b).to(a.dtype)


def enable(enabled: bool) -> None:
    if enabled:
        plantedlib.install(NAMESPACE, mm)
        plantedlib.install_sample(NAMESPACE, plantedlib.sample_invariant)
