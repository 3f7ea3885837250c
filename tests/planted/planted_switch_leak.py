"""Planted library, bug class *switch leak*.

A correct kernel, but ``enable(False)`` installs it too (the flag is read as a truthy string, so
"0" counts as on): with the switch off, calls still reach ``planted_switch_leak::mm``. Expected
finding: mm routing [disabled], "switch leak".
"""

from __future__ import annotations

import plantedlib

NAMESPACE = "planted_switch_leak"
OPS = ["mm"]
KERNEL_PREFIX = f"{NAMESPACE}::"
ROUTES = {"mm": (f"{NAMESPACE}::mm",)}


def mm(a, b):
    plantedlib.check(a, b)
    return plantedlib.mm_float64(a, b).to(a.dtype)


def enable(enabled: bool) -> None:
    if str(int(enabled)):  # BUG: "0" is a non-empty string, so this is always true
        plantedlib.install(NAMESPACE, mm)
