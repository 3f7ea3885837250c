"""Hypothesis strategies for cases, built from a validated Space.

Hypothesis draws only small integers and choices (shapes, dtype, layouts, a value class, seeds, a
batch composition); tensors are materialised from seeds in the worker. So drawing is cheap and
shrinking works on meaningful knobs: fewer rows, smaller dims, fewer companions, the first choice of
each list. Extents are biased toward tile boundaries (powers of two and their neighbours, multiples
of 16 +- 1), where batch-variant kernels switch algorithms.
"""

from __future__ import annotations

from functools import lru_cache

from hypothesis import strategies as st

from .case import Batch, Case, Companion
from .catalogue import ENGINE_VOCAB, OPS, OpInfo, out_dtype
from .space import Extent, Space

PROPERTIES = (
    "routing",
    "reference",
    "batch_invariance",
    "determinism",
    "parity",
    "logprobs",
    "decode",
)
BATCHED = ("batch_invariance", "determinism", "logprobs")

# Value classes per property, simplest first (Hypothesis shrinks toward the first).
_VALUES_FOR = {
    "routing": ("general",),
    "reference": ("exact", "general", "wide"),
    "batch_invariance": ("general", "wide", "exact"),
    "determinism": ("general", "wide", "special"),
    "parity": ("general", "exact", "special"),
    "logprobs": ("general",),
    "decode": ("general",),
}

SEEDS = st.integers(min_value=0, max_value=2**32 - 1)
# The engine op: prompts of 1..24 tokens, a needle and at most 7 companion prompts (the engine is
# built with max_num_seqs=16 and max_model_len=128).
ENGINE_MAX_TOKENS = 24
ENGINE_MAX_COMPANIONS = 7


def boundary_values(extent: Extent, boundaries: tuple[int, ...]) -> list[int]:
    """Tile edges inside the extent: each boundary b and b +- 1, and multiples of 16 +- 1."""
    marks: set[int] = set()
    for b in boundaries:
        marks.update((b - 1, b, b + 1))
    top = max(boundaries, default=16)
    for m in range(16, top + 1, 16):
        marks.update((m - 1, m + 1))
    return sorted(v for v in marks if extent.min <= v <= extent.max)


@lru_cache(maxsize=4096)
def choice(options: tuple) -> st.SearchStrategy:
    """``sampled_from``, built once per option tuple: drawing a case must cost microseconds, and
    Hypothesis validates every new strategy object."""
    return st.sampled_from(options)


@lru_cache(maxsize=4096)
def integers(low: int, high: int) -> st.SearchStrategy[int]:
    return st.integers(low, high)


@lru_cache(maxsize=4096)
def extents(extent: Extent, boundaries: tuple[int, ...]) -> st.SearchStrategy[int]:
    """An integer in the extent, half of the time snapped onto a tile edge; shrinks toward ``min``.

    Drawn as (v, snap, offset): with ``snap`` the value is the largest tile centre <= v (a
    boundary or a multiple of 16) plus ``offset`` in {0, -1, +1}. Shrinking ``snap`` to False
    leaves plain v, so a failure at "K >= 20" shrinks to exactly 20, not to the edge 31."""
    plain = integers(extent.min, extent.max)
    centres = sorted({b for b in boundaries} | set(range(16, max(boundaries, default=16) + 1, 16)))
    centres = [c for c in centres if extent.min - 1 <= c <= extent.max + 1]
    if not centres:
        return plain

    def place(drawn: tuple[int, bool, int]) -> int:
        v, snap, offset = drawn
        below = [c for c in centres if c <= v]
        if not snap or not below:
            return v
        return min(max(below[-1] + offset, extent.min), extent.max)

    return st.tuples(plain, st.booleans(), st.sampled_from((0, -1, 1))).map(place)


def _clip(extent: Extent, low: int | None = None, high: int | None = None) -> Extent:
    lo = extent.min if low is None else max(extent.min, low)
    hi = extent.max if high is None else min(extent.max, high)
    return Extent(lo, max(lo, hi))


def _op_shape_and_options(draw: st.DrawFn, space: Space, op: OpInfo, prop: str) -> tuple:
    """Draw ``(shape, options)`` for one op. The first shape entry is the needle's rows."""
    dim = space.dim_for(op.name)
    b = space.boundaries
    rows = extents(space.rows, b)
    if prop == "batch_invariance":
        # A needle is a few rows; the batch's companions supply the large M.
        rows = integers(space.rows.min, min(space.rows.max, max(space.rows.min, 4)))
    d = extents(dim, b)
    small = extents(_clip(dim, high=64), b)
    options: dict = {}
    name = op.name
    if name in ("mm", "addmm", "linear") or (name == "matmul"):
        if name == "matmul":
            options["form"] = draw(choice(tuple(op.option_choices["form"])))
        if name == "addmm":
            options["beta"] = draw(choice(tuple(op.option_choices["beta"])))
            options["alpha"] = draw(choice(tuple(op.option_choices["alpha"])))
            options["bias"] = draw(choice(tuple(op.option_choices["bias"])))
        if name == "linear":
            options["bias"] = draw(st.booleans().map(lambda x: not x))
            options["form"] = draw(choice(tuple(op.option_choices["form"])))
        form = options.get("form", "2d")
        if form == "vector":
            return (draw(rows), draw(d)), options
        if form in ("batched", "broadcast"):
            return (draw(rows), draw(integers(1, 8)), draw(d), draw(d)), options
        if form == "3d":
            return (draw(rows), draw(integers(1, 8)), draw(d), draw(d)), options
        return (draw(rows), draw(d), draw(d)), options
    if name == "bmm":
        return (draw(rows), draw(small), draw(d), draw(d)), options
    if name in ("sum", "mean"):
        batch = prop == "batch_invariance"
        rank = draw(integers(2 if batch else 1, 3))
        shape = (draw(rows), *(draw(small if rank == 3 else d) for _ in range(rank - 1)))
        choices: list = [-1, rank - 1]
        if rank == 3:
            choices += [1, (1, 2), (-2,)]
        if not batch:
            choices += [None, 0, tuple(range(rank))]
        options["dim"] = draw(choice(tuple(choices)))
        if options["dim"] is not None:
            options["keepdim"] = draw(st.booleans())
        options["dtype"] = draw(choice(tuple([None, "float32"])))
        return shape, options
    if name in ("softmax", "log_softmax"):
        rank = draw(integers(2, 3))
        shape = (draw(rows), *(draw(small if rank == 3 else d) for _ in range(rank - 1)))
        dims = [*range(1, rank), -1]
        if prop != "batch_invariance":
            dims.append(0)
        options["dim"] = draw(choice(tuple(sorted(set(dims), key=lambda x: (x != -1, x)))))
        options["dtype"] = draw(choice(tuple([None, "float32"])))
        return shape, options
    if name == "silu":
        return (draw(rows), draw(d)), options
    if name == "probe_model":
        length = integers(2 if prop == "decode" else 1, max(2, min(space.attention_length.max, 12)))
        if prop == "decode":
            options["mode"] = "decode"
        kv_heads = draw(choice((1, 2)))
        heads = kv_heads * draw(choice((1, 2)))
        head_dim = draw(choice((8, 16)))
        vocab = draw(choice((16, 64, 257)))
        return (
            draw(length),
            draw(choice((1, 2))),
            heads,
            kv_heads,
            head_dim,
            vocab,
            draw(choice((16, 48))),
        ), options
    if name == "engine":
        # One prompt of 1..24 tokens (within the space's rows) of the tiny model's vocabulary.
        tokens = _clip(space.rows, high=ENGINE_MAX_TOKENS)
        return (draw(integers(tokens.min, tokens.max)), ENGINE_VOCAB), options
    if name in ("rms_norm", "add_rms_norm"):
        if name == "rms_norm":
            options["eps"] = draw(choice(tuple([None, 1e-6])))
        return (draw(rows), draw(extents(_clip(dim, low=1), b))), options
    if name == "attention":
        length = extents(space.attention_length, b)
        if prop == "batch_invariance":
            length = integers(space.attention_length.min, min(space.attention_length.max, 8))
        kv_heads = draw(choice(tuple([1, 2])))
        heads = kv_heads * draw(choice(tuple([1, 2, 4])))
        head_dim = draw(choice(tuple(space.head_dims)))
        return (draw(length), heads, kv_heads, head_dim), options
    raise AssertionError(f"no shape strategy for op {name!r}")  # pragma: no cover


@lru_cache(maxsize=1024)
def _companions(rows: st.SearchStrategy[int], max_companions: int) -> st.SearchStrategy:
    return st.lists(
        st.builds(Companion, seed=SEEDS, rows=rows), min_size=1, max_size=max_companions
    )


def _batch(draw: st.DrawFn, space: Space, op: OpInfo) -> Batch:
    if op.name == "attention":
        rows = extents(space.attention_length, space.boundaries)
    elif op.name == "probe_model":
        rows = integers(1, max(1, min(space.attention_length.max, 24)))
    elif op.name == "bmm" or (op.name == "matmul"):
        rows = integers(1, min(space.companion_rows.max, 16))
    elif op.name == "engine":
        tokens = _clip(space.companion_rows, high=ENGINE_MAX_TOKENS)
        rows = integers(tokens.min, tokens.max)
    else:
        rows = extents(space.companion_rows, space.boundaries)
    most = space.max_companions
    if op.name == "engine":
        most = min(most, ENGINE_MAX_COMPANIONS)
    companions = draw(_companions(rows, most))
    position = draw(integers(0, len(companions)))
    return Batch(position=position, companions=tuple(companions))


@st.composite
def cases(
    draw: st.DrawFn,
    space: Space,
    op: str,
    prop: str,
    entries: tuple[str, ...] | None = None,
) -> Case:
    """One Case for ``op`` under property ``prop``; ``entries`` may replace the op's entry points
    (a target whose users call another function, e.g. torch_npu's)."""
    info = OPS[op]
    shape, options = _op_shape_and_options(draw, space, info, prop)
    provisional = Case(op, "", space.dtypes[0], shape, (), "general", 0, options)
    n_operands = len(info.operands(provisional))
    entry = draw(choice(tuple(entries or info.entries)))
    dtype = draw(choice(tuple(space.dtypes)))
    layouts = tuple(draw(choice(tuple(space.layouts))) for _ in range(n_operands))
    allowed = [v for v in _VALUES_FOR[prop] if v in space.values] or ["general"]
    values = draw(choice(tuple(allowed)))
    seed = draw(SEEDS)
    case = Case(op, entry, dtype, shape, layouts, values, seed, options)
    if values == "exact" and info.exact_amplitude(case) < 1:
        # No integer range keeps every partial result exact here: fall back, deterministically.
        case = Case(op, entry, dtype, shape, layouts, "general", seed, options)
    if prop in BATCHED:
        batch = _batch(draw, space, info)
        case = case.with_batch(batch)
    return case


__all__ = ["PROPERTIES", "boundary_values", "cases", "extents", "out_dtype"]
