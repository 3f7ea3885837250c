"""The engine-scenario properties: what a scenario's needle must equal, judged bitwise.

Each property maps a scenario to the scenario its needle is compared against (its *desired*
twin), or to None where the property says nothing about that scenario (prefix caching off: no
hot-vs-cold question). ``judge`` then compares the needle's generated tokens and the float32 bit
patterns of their logprobs in the two results; where the twin differs only in its engine
configuration (prefix_cache, chunked, preemption) every request is compared, the needle first.
Pure: the caller replays both scenarios on an engine (``Replay``) and hands the results in.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, replace

from .scenario import Request, RequestResult, Scenario, ScenarioResult

Replay = Callable[[Scenario], ScenarioResult]
"""An engine: replays a scenario (on a fresh prefix cache) and returns what it produced."""


def _alone(s: Scenario) -> Scenario | None:
    twin = s.alone()
    return None if twin == s else twin


def _cold(s: Scenario) -> Scenario | None:
    return s.with_config(prefix_caching=False) if s.config.prefix_caching else None


def _unchunked(s: Scenario) -> Scenario | None:
    return s.with_config(chunk_budget=None) if s.config.chunk_budget is not None else None


def _roomy(s: Scenario) -> Scenario | None:
    return s.with_config(kv_blocks=None) if s.config.kv_blocks is not None else None


@dataclass(frozen=True)
class ScenarioProperty:
    name: str
    claim: str
    twin: Callable[[Scenario], Scenario | None]


PROPERTIES: dict[str, ScenarioProperty] = {
    p.name: p
    for p in (
        ScenarioProperty(
            "alone",
            "the needle's tokens and logprobs in the scenario equal the needle alone on a plain "
            "engine (a seeded needle: the same sample)",
            _alone,
        ),
        ScenarioProperty(
            "prefix_cache",
            "prefix cache hot (the scenario, prefix caching on) equals cold (caching off)",
            _cold,
        ),
        ScenarioProperty(
            "chunked", "chunked prefill equals the same scenario unchunked", _unchunked
        ),
        ScenarioProperty(
            "preemption",
            "a KV pool small enough to preempt equals a pool that never runs out",
            _roomy,
        ),
        ScenarioProperty(
            "decode_vs_prefill",
            "the logprobs of the needle's generated tokens (decode) equal the prompt logprobs of "
            "the same tokens appended to its prompt, alone on a plain engine (prefill)",
            lambda s: s,  # the twin depends on the tokens generated: see prefill_twin
        ),
    )
}


def prefill_twin(scenario: Scenario, generated: tuple[int, ...]) -> Scenario:
    """The needle's prompt followed by its generated tokens, alone on the plain engine, with
    prompt logprobs: its prefill computes the logprob of each generated token at once."""
    needle = scenario.needle_request
    return Scenario((Request((*needle.prompt, *generated), prompt_logprobs=True),))


def prefill_view(prompt_length: int, twin: RequestResult, generated: tuple[int, ...]):
    """The twin's prompt logprobs of the generated tokens, as a RequestResult to compare."""
    start = prompt_length - 1  # prompt token p sits at index p - 1
    bits = twin.prompt_logprob_bits[start : start + len(generated)]
    return replace(twin, tokens=generated, logprob_bits=bits)


def float_bits(value: float) -> int:
    """The float32 bit pattern of a logprob (vLLM hands float32 logprobs over as Python floats,
    so the round trip is exact)."""
    return struct.unpack("<I", struct.pack("<f", value))[0]


def bits_float(bits: int) -> float:
    return struct.unpack("<f", struct.pack("<I", bits))[0]


def compare(actual: RequestResult, desired: RequestResult) -> str | None:
    """None when the two outputs are bitwise equal, else where and how they first differ."""
    for i, (a, d) in enumerate(zip(actual.tokens, desired.tokens, strict=False)):
        if a != d:
            return f"generated token {i} differs: {a} (actual) vs {d} (desired)"
    if len(actual.tokens) != len(desired.tokens):
        return f"{len(actual.tokens)} tokens generated (actual) vs {len(desired.tokens)} (desired)"
    for i, (a, d) in enumerate(zip(actual.logprob_bits, desired.logprob_bits, strict=False)):
        if a != d:
            return (
                f"logprob of generated token {i} ({actual.tokens[i]}) differs: "
                f"{bits_float(a)!r} (0x{a:08x}, actual) vs {bits_float(d)!r} (0x{d:08x}, desired)"
            )
    if len(actual.logprob_bits) != len(desired.logprob_bits):
        return f"{len(actual.logprob_bits)} logprobs vs {len(desired.logprob_bits)}"
    return None


@dataclass(frozen=True)
class Verdict:
    """A property's judgement of one scenario: ``message`` None means it held."""

    prop: str
    scenario: Scenario
    twin: Scenario
    message: str | None
    actual: ScenarioResult
    desired: ScenarioResult

    @property
    def held(self) -> bool:
        return self.message is None


def judge(prop: str, scenario: Scenario, replay: Replay) -> Verdict | None:
    """Replay the scenario and its twin and compare the needle; None: not applicable."""
    spec = PROPERTIES[prop]
    if prop == "decode_vs_prefill":
        actual = replay(scenario)
        got = actual.requests[scenario.needle]
        twin = prefill_twin(scenario, got.tokens)
        desired = replay(twin)
        view = prefill_view(len(scenario.needle_request.prompt), desired.requests[0], got.tokens)
        return Verdict(prop, scenario, twin, compare(got, view), actual, desired)
    twin = spec.twin(scenario)
    if twin is None:
        return None
    actual = replay(scenario)
    desired = replay(twin)
    if twin.requests == scenario.requests:
        # Only the configuration changed: every request must come out the same, not just the
        # needle (the one the engine preempted, or served from its cache, may be a companion).
        others = (i for i in range(len(scenario.requests)) if i != scenario.needle)
        order = [scenario.needle, *others]
        for i in order:
            message = compare(actual.requests[i], desired.requests[i])
            if message is not None:
                who = "the needle" if i == scenario.needle else f"companion r{i}"
                return Verdict(prop, scenario, twin, f"{who}: {message}", actual, desired)
        return Verdict(prop, scenario, twin, None, actual, desired)
    message = compare(actual.requests[scenario.needle], desired.requests[twin.needle])
    return Verdict(prop, scenario, twin, message, actual, desired)


def train_rollout(
    tokens: tuple[int, ...], engine_bits: tuple[int, ...], trainer: list[float]
) -> dict[str, object]:
    """The trainer's view against the engine's, for one request's generated tokens: the trainer
    (a plain forward of the same model, batch of one) gives the float32 logprob of each generated
    token, the engine gave ``engine_bits``. Bitwise equal or not, the largest |delta logprob|,
    and the first token whose logprob differs (what RL users track as the rollout/train
    mismatch)."""
    if len(trainer) != len(engine_bits):
        raise ValueError(f"{len(trainer)} trainer logprobs for {len(engine_bits)} tokens")
    first = None
    worst = 0.0
    for i, (bits, value) in enumerate(zip(engine_bits, trainer, strict=True)):
        engine = bits_float(bits)
        if float_bits(value) != bits and first is None:
            first = {"index": i, "token": tokens[i], "engine": engine, "trainer": value}
        worst = max(worst, abs(engine - value))
    return {
        "tokens": len(tokens),
        "bitwise": first is None,
        "max_abs_delta": worst,
        "first_diverging": first,
    }
