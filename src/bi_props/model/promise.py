"""The switch providers' promises, as rules: pure functions of a worker's hello evidence.

What verl promises about the environment it leaves for the rollout (``broken_promises``) and how a
switch was requested (``describe``): the routing judge (``properties.routing``) reads them in the
controller; the providers themselves (``integrations/switches.py``, ``verl_switch.py``) run above.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def broken_promises(evidence: Mapping[str, Any], switch: str) -> list[str]:
    """verl's promises about the environment it leaves for the rollout, broken in this worker.

    Enabled: ``VLLM_BATCH_INVARIANT == "1"`` and ``VERL_FULL_DETERMINISM == "1"`` (run_ppo sets
    them and Ray forwards them), and ``VERL_SEED`` set where verl's server step ran (its
    ``__init__`` sets it). Disabled: ``VLLM_BATCH_INVARIANT`` unset or ``"0"`` (verl writes
    nothing and Ray forwards "0")."""
    if evidence.get("provider") != "verl":
        return []
    env = evidence.get("env")
    if not isinstance(env, Mapping):
        return ["no record of the environment verl left (the provider's evidence has no 'env')"]
    problems = []

    def expect(name: str, ok: bool, expected: str) -> None:
        if not ok:
            problems.append(f"{name} expected {expected}, actual {env.get(name)!r}")

    if switch == "enabled":
        expect("VLLM_BATCH_INVARIANT", env.get("VLLM_BATCH_INVARIANT") == "1", "'1'")
        expect("VERL_FULL_DETERMINISM", env.get("VERL_FULL_DETERMINISM") == "1", "'1'")
        if evidence.get("server_ran"):
            expect("VERL_SEED", bool(env.get("VERL_SEED")), "set (the rollout seed)")
    else:
        expect(
            "VLLM_BATCH_INVARIANT", env.get("VLLM_BATCH_INVARIANT") in (None, "0"), "unset or '0'"
        )
    return problems


def promise_message(evidence: Mapping[str, Any], switch: str, problems: list[str]) -> str:
    """The routing finding's text for broken promises."""
    state = "true" if switch == "enabled" else "false"
    return (
        f"verl promise broken: with rollout.full_determinism={state}, after verl's "
        f"{describe_steps(evidence)}: " + "; ".join(problems)
    )


def describe(evidence: Mapping[str, Any], enabled: bool) -> str:
    """How the switch was requested, for propagation messages."""
    value = "1" if enabled else "0"
    if evidence.get("provider") != "verl":
        return f"VLLM_BATCH_INVARIANT={value}"
    actual = (evidence.get("env") or {}).get("VLLM_BATCH_INVARIANT")
    return (
        f"verl rollout.full_determinism={'true' if enabled else 'false'} "
        f"(VLLM_BATCH_INVARIANT={actual!r} as verl left it)"
    )


def describe_steps(evidence: Mapping[str, Any]) -> str:
    """``driver ran, server ran`` or ``driver ran, server not run (why)``."""
    server = evidence.get("server", "?")
    return f"driver {evidence.get('driver', '?')}, server {server}"
