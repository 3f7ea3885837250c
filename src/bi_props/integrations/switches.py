"""Switch providers: whose code turns the batch-invariant switch on in a worker.

- ``env`` (the default): the controller puts ``VLLM_BATCH_INVARIANT=1|0`` into the worker's
  environment and the target reads it, as vLLM and vllm-ascend do.
- ``verl``: the controller leaves ``VLLM_BATCH_INVARIANT`` out; in the worker, before the target
  is imported, verl's own code sets it from ``rollout.full_determinism`` (verl_switch.py). The
  routing property then first checks what verl promises (``broken_promises``), so a verl release
  that stops forwarding the switch is a finding, not a silently disabled test.

This module is imported by the controller (selection, usage errors, promises, report rows) and by
the worker (``provide``); it imports neither torch nor verl.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ..model.promise import broken_promises, describe, describe_steps, promise_message
from ..model.target import BUILTIN_TARGETS as BUILTIN
from .verl_switch import WATCHED

PROVIDER_ENV = "BI_PROPS_SWITCH_PROVIDER"  # how the choice reaches the workers
PROVIDERS = ("env", "verl")
DEFAULT = "env"

# The built-in targets read their switch from VLLM_BATCH_INVARIANT, as upstream does
# (targets/base.py, switch_requested): verl's switch can reach them. A third-party module target
# is switched by its own enable(), which verl never calls.
READS_SWITCH_ENV = tuple(BUILTIN)


class SwitchUsageError(ValueError):
    """An unknown provider, or a provider that cannot reach the chosen target."""


def selected(environ: Mapping[str, str] = os.environ) -> str:
    """The provider named by ``BI_PROPS_SWITCH_PROVIDER`` (default ``env``)."""
    provider = environ.get(PROVIDER_ENV, "") or DEFAULT
    if provider not in PROVIDERS:
        raise SwitchUsageError(
            f"{PROVIDER_ENV}={provider!r}: unknown switch provider; choose one of "
            f"{', '.join(PROVIDERS)}"
        )
    return provider


def usage_error(provider: str, target: str) -> str | None:
    """Why ``provider`` cannot switch ``target`` (one message for the user), or None."""
    if provider not in PROVIDERS:
        return f"unknown switch provider {provider!r}; choose one of {', '.join(PROVIDERS)}"
    if provider == "verl" and target not in READS_SWITCH_ENV:
        return (
            f"the verl switch provider cannot switch target {target!r}: verl's "
            f"rollout.full_determinism reaches a target only through VLLM_BATCH_INVARIANT, and a "
            f"third-party module target is switched by its own enable(). Use --switch verl "
            f"(--bi-switch verl) with one of {', '.join(READS_SWITCH_ENV)}, or the default env "
            f"provider."
        )
    return None


def provide(provider: str, target: str, switch: str) -> dict[str, Any]:
    """Worker side, before the target is imported: put the switch in place; return the evidence
    of what was done (empty for ``env``). Raises TargetMissing/TargetBroken, which the worker
    turns into a hello with that status."""
    from ..model.target import TargetBroken

    problem = usage_error(provider, target)
    if problem is not None:
        raise TargetBroken(problem)
    if provider == "env":
        return {}
    from .verl_switch import run  # imports verl's code: only where the provider is verl

    return run(switch == "enabled")


# What verl promises (judged by properties.routing): the pure rules live in model/promise.py.


def rows(evidence: Mapping[str, Any]) -> dict[str, str]:
    """Evidence as report rows (Hello.environment, report.json, doctor); empty for ``env``."""
    if evidence.get("provider") != "verl":
        return {}
    state = "enabled" if evidence.get("full_determinism") else "disabled"
    env = evidence.get("env") or {}
    values = " ".join(
        f"{name}={env[name]}" if env.get(name) is not None else f"{name} unset" for name in WATCHED
    )
    out = {
        "switch_provider": "verl",
        "verl": str(evidence.get("verl", "?")),
        f"verl_{state}": (
            f"rollout.full_determinism={str(bool(evidence.get('full_determinism'))).lower()} "
            f"seed={evidence.get('seed')}; {describe_steps(evidence)}; then {values}"
        ),
    }
    if evidence.get("vllm_alias"):
        out["verl_vllm_alias"] = str(evidence["vllm_alias"])
    return out


__all__ = [
    "DEFAULT",
    "PROVIDERS",
    "PROVIDER_ENV",
    "READS_SWITCH_ENV",
    "SwitchUsageError",
    "broken_promises",
    "describe",
    "describe_steps",
    "promise_message",
    "provide",
    "rows",
    "selected",
    "usage_error",
]
