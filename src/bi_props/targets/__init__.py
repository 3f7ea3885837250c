"""Systems under test. ``resolve`` is called in the worker only: it imports the target's packages.

Built-in names: ``model.target.BUILTIN_TARGETS`` (``cpu``, bi_props's own portable kernels, and
the upstream stacks where present). Anything else is a third-party module, ``some.module`` or
``some.module:attr`` (see module.py).
"""

from __future__ import annotations

import importlib

from ..model.target import (
    BUILTIN_TARGETS,
    SWITCH_ENV,
    Target,
    TargetBroken,
    TargetMissing,
    switch_requested,
)

BUILTIN = BUILTIN_TARGETS


def resolve(spec: str) -> Target:
    """The Target object for a ``--bi-target`` value."""
    if spec in BUILTIN:
        module_name, _, attr = BUILTIN[spec].partition(":")
        return getattr(importlib.import_module(module_name), attr)()
    from .module import ModuleTarget

    return ModuleTarget(spec)


__all__ = [
    "BUILTIN",
    "SWITCH_ENV",
    "Target",
    "TargetBroken",
    "TargetMissing",
    "resolve",
    "switch_requested",
]
