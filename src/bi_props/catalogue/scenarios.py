"""The Hypothesis strategy for engine scenarios (bi_props.model.scenario), from a ScenarioSpace.

Every choice shrinks toward the plain form: no engine feature on (each configuration knob is
``None`` or off first), one request, arrival 0, greedy sampling, one generated token, the shortest
prompt and the lowest token id. Companions may copy whole KV blocks of the needle's prompt (a
shared prefix), so that prefix caching actually hits when it is on; a companion arriving before
the needle warms the cache for it. A prompt length is drawn plain or, in the second branch (which
shrinks away), just under the end of a KV block, so that decoding crosses into a new block: with
a small pool that is what preempts a running request.
"""

from __future__ import annotations

from dataclasses import replace

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


def capture_sizes(space: ScenarioSpace) -> st.SearchStrategy[tuple[int, ...] | None]:
    """None (eager) first, else a non-empty subset of the space's CUDA-graph capture sizes
    (shrinking toward fewer and smaller sizes, then to eager)."""
    if not space.cuda_graph_sizes:
        return st.none()
    subsets = st.lists(st.sampled_from(space.cuda_graph_sizes), min_size=1, unique=True).map(
        lambda sizes: tuple(sorted(sizes))
    )
    return st.one_of(st.none(), subsets)


def configs(space: ScenarioSpace) -> st.SearchStrategy[EngineConfig]:
    return st.builds(
        EngineConfig,
        prefix_caching=st.booleans(),
        chunk_budget=_maybe(space.chunk_budgets),
        kv_blocks=_maybe(space.kv_blocks),
        max_num_seqs=_maybe(space.max_num_seqs),
        cuda_graph_sizes=capture_sizes(space),
    ).map(lambda c: replace(c, cuda_graph_mode=space.cuda_graph_mode) if c.cuda_graph_sizes else c)


def edge_lengths(space: ScenarioSpace, low: int, high: int) -> list[int]:
    """Prompt lengths in [low, high] a few tokens (up to ``max_tokens``) short of a block's end:
    decoding from there crosses into a new KV block."""
    return sorted(
        {
            end - k
            for end in range(BLOCK_SIZE, high + space.max_tokens + 1, BLOCK_SIZE)
            for k in range(1, space.max_tokens + 1)
        }
        & set(range(low, high + 1))
    )


def lengths(space: ScenarioSpace, low: int, high: int) -> st.SearchStrategy[int]:
    """A prompt length in [low, high]: plain, or a few tokens short of a block's end."""
    plain = st.integers(low, high)
    edges = edge_lengths(space, low, high)
    # Two plain branches to one edge branch: a third of the lengths aim at an edge, and shared
    # prefixes (prompts longer than a block) stay common.
    return st.one_of(plain, plain, st.sampled_from(edges)) if edges else plain


def _prompt(draw: st.DrawFn, length: int) -> tuple[int, ...]:
    return tuple(draw(st.lists(TOKENS, min_size=length, max_size=length)))


def _sampling(draw: st.DrawFn, space: ScenarioSpace) -> dict:
    if space.seeded and draw(st.booleans()):
        return {"temperature": draw(st.sampled_from(TEMPERATURES)), "seed": draw(SEEDS)}
    return {}


@st.composite
def scenarios(draw: st.DrawFn, space: ScenarioSpace) -> Scenario:
    config = draw(configs(space))
    # With a small KV pool, a crowded scenario (the second branch: shrinks away): two requests
    # or more, all arriving at once, each a few tokens short of a block's end and generating the
    # most tokens, so that their decodes need new blocks together and the pool runs out: the
    # engine preempts one. Drawn plainly, too few scenarios preempt to judge the property.
    crowded = config.kv_blocks is not None and space.max_requests > 1 and draw(st.booleans())
    companions = draw(st.integers(1 if crowded else 0, space.max_requests - 1))
    arrival = st.just(0) if crowded else st.integers(0, space.max_arrival)
    generated = st.just(space.max_tokens) if crowded else st.integers(1, space.max_tokens)

    def length(low: int) -> st.SearchStrategy[int]:
        edges = edge_lengths(space, low, space.prompt_max) if crowded else []
        return st.sampled_from(edges) if edges else lengths(space, low, space.prompt_max)

    # A prefix of whole KV blocks that the needle starts with and companions may copy; the
    # needle has at least one token after it (a prompt served whole from the cache has none).
    most = 0 if crowded else min(space.shared_blocks, (space.prompt_max - 1) // BLOCK_SIZE)
    blocks = draw(st.integers(0, most)) if most > 0 else 0
    prefix = _prompt(draw, blocks * BLOCK_SIZE)
    total = draw(length(max(space.prompt_min, len(prefix) + 1)))
    needle_prompt = prefix + _prompt(draw, total - len(prefix))
    needle = Request(
        needle_prompt,
        max_tokens=draw(generated),
        arrival=draw(arrival),
        **_sampling(draw, space),
    )
    others = []
    for _ in range(companions):
        # Copying is the first choice (no feature is added by it: ``blocks`` shrinks the prefix
        # away); a companion with a prefix of its own is the other.
        shared = prefix if prefix and not draw(st.booleans()) else ()
        total = draw(length(max(space.prompt_min, len(shared))))
        others.append(
            Request(
                shared + _prompt(draw, total - len(shared)),
                max_tokens=draw(generated),
                arrival=draw(arrival),
                **_sampling(draw, space),
            )
        )
    position = draw(st.integers(0, companions))
    others.insert(position, needle)
    return Scenario(tuple(others), config, needle=position)
