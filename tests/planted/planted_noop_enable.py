"""Planted library, bug class *no-op switch*.

It claims ``mm``, names its kernels' profiler prefix, and its ``enable(True)`` installs nothing
(the registration was lost in a refactor): every call still runs the stock kernel. Nothing fails
numerically with an honest stock mm on small inputs, so only routing can see it. Expected finding:
mm routing [enabled], "no evidence" naming the events looked for.
"""

from __future__ import annotations

NAMESPACE = "planted_noop_enable"
OPS = ["mm"]
KERNEL_PREFIX = f"{NAMESPACE}::"


def enable(enabled: bool) -> None:
    """BUG: the kernels are never registered."""
