"""Planted target that exists but imports a missing dependency whose name is a prefix of the
target's own name (``planted_prefix``): it should be "broken" like ``planted_bad_import``."""

from __future__ import annotations

import planted_prefix  # noqa: F401

OPS = ["mm"]
KERNEL_PREFIX = "planted_prefix_dep::"


def enable(enabled: bool) -> None:
    pass
