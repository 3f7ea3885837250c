"""Systems under test. ``resolve`` is called in the worker only: it imports the target's packages.

Built-in names: ``cpu`` (bi_props's own portable kernels), ``vllm`` and ``ascend`` (where present).
Anything else is a third-party module, ``some.module`` or ``some.module:attr`` (see module.py).
"""

from __future__ import annotations

import importlib

from .base import SWITCH_ENV, Target, TargetBroken, TargetMissing, switch_requested

BUILTIN = {
    "cpu": "bi_props.targets.cpu:CpuTarget",
    "ascend": "bi_props.targets.ascend:AscendTarget",
    "vllm": "bi_props.targets.vllm:VllmTarget",
    "vllm-engine": "bi_props.targets.vllm_engine:VllmEngineTarget",
    "sglang": "bi_props.targets.sglang:SglangTarget",
    "vllm-ascend-triton": "bi_props.targets.vllm_ascend_triton:VllmAscendTritonTarget",
}


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
