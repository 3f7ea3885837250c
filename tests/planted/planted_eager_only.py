"""A correct library that declares compiled mode unsupported (not a bug).

``planted_correct``'s batch-invariant ``aten::mm``, and ``MODES = ["eager"]`` with the reason in
``UNSUPPORTED_MODES``: a run whose space asks for compiled cases reports compiled mode "not
applicable" with that reason (report.json ``modes.not_applicable``, report.md, the console),
never silently skipped, and draws eager cases only.
"""

from __future__ import annotations

import plantedlib

NAMESPACE = "planted_eager_only"
OPS = ["mm"]
KERNEL_PREFIX = f"{NAMESPACE}::"
ROUTES = {"mm": (f"{NAMESPACE}::mm",)}
MODES = ["eager"]
UNSUPPORTED_MODES = {
    "compiled": "its kernel is a Python loop registered for aten::mm only, with no fake "
    "(meta) implementation: it is not meant to run under torch.compile"
}


def mm(a, b):
    plantedlib.check(a, b)
    return plantedlib.mm_float64(a, b).to(a.dtype)


def enable(enabled: bool) -> None:
    if enabled:
        plantedlib.install(NAMESPACE, mm)
