"""The Hypothesis strategy for engine scenarios (bi_props.model.scenario), from a ScenarioSpace.

Every choice shrinks toward the plain form: no engine feature on (each configuration knob is
``None`` or off first), one request, arrival 0, greedy sampling, one generated token, the shortest
prompt and the lowest token id. Companions may copy whole KV blocks of the needle's prompt (a
shared prefix), so that prefix caching actually hits when it is on; a companion arriving before
the needle warms the cache for it.
"""

from __future__ import annotations

from hypothesis import strategies as st

from ..model.scenario import BLOCK_SIZE, EngineConfig, Request, Scenario, ScenarioSpace
from .models import ENGINE_SPECIAL_TOKENS, ENGINE_VOCAB

TEMPERATURES = (1.0, 0.5)
"""Temperatures of seeded requests: 1.0 (the distribution itself) first, then a sharper one."""
SEEDS = st.integers(0, 2**16 - 1)
TOKENS = st.integers(ENGINE_SPECIAL_TOKENS, ENGINE_VOCAB - 1)


def _maybe(options: tuple[int, ...]) -> st.SearchStrategy[int | None]:
    """None (the feature off) first, else one of ``options``."""
    if not options:
        return st.none()
    return st.one_of(st.none(), st.sampled_from(options))


def configs(space: ScenarioSpace) -> st.SearchStrategy[EngineConfig]:
    return st.builds(
        EngineConfig,
        prefix_caching=st.booleans(),
        chunk_budget=_maybe(space.chunk_budgets),
        kv_blocks=_maybe(space.kv_blocks),
        max_num_seqs=_maybe(space.max_num_seqs),
    )


def _prompt(draw: st.DrawFn, length: int) -> tuple[int, ...]:
    return tuple(draw(st.lists(TOKENS, min_size=length, max_size=length)))


def _sampling(draw: st.DrawFn, space: ScenarioSpace) -> dict:
    if space.seeded and draw(st.booleans()):
        return {"temperature": draw(st.sampled_from(TEMPERATURES)), "seed": draw(SEEDS)}
    return {}


@st.composite
def scenarios(draw: st.DrawFn, space: ScenarioSpace) -> Scenario:
    config = draw(configs(space))
    companions = draw(st.integers(0, space.max_requests - 1))
    arrival = st.integers(0, space.max_arrival)
    needle_prompt = _prompt(draw, draw(st.integers(space.prompt_min, space.prompt_max)))
    needle = Request(
        needle_prompt,
        max_tokens=draw(st.integers(1, space.max_tokens)),
        arrival=draw(arrival),
        **_sampling(draw, space),
    )
    others = []
    for _ in range(companions):
        shared = needle_prompt[: draw(st.integers(0, space.shared_blocks)) * BLOCK_SIZE]
        low = max(space.prompt_min - len(shared), 0 if shared else 1)
        own = _prompt(draw, draw(st.integers(low, max(low, space.prompt_max - len(shared)))))
        others.append(
            Request(
                shared + own,
                max_tokens=draw(st.integers(1, space.max_tokens)),
                arrival=draw(arrival),
                **_sampling(draw, space),
            )
        )
    position = draw(st.integers(0, companions))
    others.insert(position, needle)
    return Scenario(tuple(others), config, needle=position)
