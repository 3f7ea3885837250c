"""Planted target whose ``enable()`` raises (a driver that is not there): the worker must say
hello with status "broken" and the exception, not crash."""

from __future__ import annotations

OPS = ["mm"]
KERNEL_PREFIX = "planted_broken_enable::"


def enable(enabled: bool) -> None:
    raise RuntimeError(f"planted: no accelerator for enable({enabled})")
