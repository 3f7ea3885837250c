"""Planted target that claims an op the catalogue does not have: status "broken", naming it."""

from __future__ import annotations

OPS = ["mm", "flash_mm"]
KERNEL_PREFIX = "planted_unknown_op::"


def enable(enabled: bool) -> None:
    pass
