"""Planted target that exists but imports a dependency that does not: status "broken" (the target
is there, its stack is not complete), naming the missing dependency."""

from __future__ import annotations

import bi_props_planted_absent_dependency  # noqa: F401

OPS = ["mm"]
KERNEL_PREFIX = "planted_bad_import::"


def enable(enabled: bool) -> None:
    pass
