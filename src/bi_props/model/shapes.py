"""The built-in ops' shape-and-option strategies: one ``draw_shape(draw, ctx)`` per op.

Each function draws ``(shape, options)`` for one case; the first shape entry is the needle's rows.
``ctx`` is a ``strategies.ShapeContext``: the space-derived strategies (``rows``, ``dim``,
``small``), the property, the space and the helpers (``choice``, ``integers``, ``extents``,
``clip``, ``booleans``, ``option``). The catalogue's specs reference these functions lazily
(this module imports Hypothesis; the catalogue must not). A user op's ``draw_shape`` has the same
signature.

The order of the draws is part of the contract: Hypothesis' shrinking and derandomized CI runs
replay choice sequences, so a reordering changes every drawn case.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from .catalogue import ENGINE_MAX_TOKENS, ENGINE_VOCAB

Shape = tuple[tuple[int, ...], dict[str, Any]]


def _product(draw: Any, ctx: Any, options: dict[str, Any]) -> Shape:
    form = options.get("form", "2d")
    rows, d = ctx.rows, ctx.dim
    if form == "vector":
        return (draw(rows), draw(d)), options
    if form in ("batched", "broadcast", "3d"):
        return (draw(rows), draw(ctx.integers(1, 8)), draw(d), draw(d)), options
    return (draw(rows), draw(d), draw(d)), options


def mm(draw: Any, ctx: Any) -> Shape:
    return _product(draw, ctx, {})


def matmul(draw: Any, ctx: Any) -> Shape:
    return _product(draw, ctx, {"form": draw(ctx.option("form"))})


def addmm(draw: Any, ctx: Any) -> Shape:
    options = {"beta": draw(ctx.option("beta"))}
    options["alpha"] = draw(ctx.option("alpha"))
    options["bias"] = draw(ctx.option("bias"))
    return _product(draw, ctx, options)


def linear(draw: Any, ctx: Any) -> Shape:
    options = {"bias": draw(st.booleans().map(lambda x: not x))}
    options["form"] = draw(ctx.option("form"))
    return _product(draw, ctx, options)


def bmm(draw: Any, ctx: Any) -> Shape:
    return (draw(ctx.rows), draw(ctx.small), draw(ctx.dim), draw(ctx.dim)), {}


def reduction(draw: Any, ctx: Any) -> Shape:
    """sum and mean: rank 1-3 (2-3 for batch invariance: a full sum has no rows), a dim."""
    options: dict[str, Any] = {}
    batch = ctx.prop == "batch_invariance"
    rank = draw(ctx.integers(2 if batch else 1, 3))
    shape = (draw(ctx.rows), *(draw(ctx.small if rank == 3 else ctx.dim) for _ in range(rank - 1)))
    choices: list = [-1, rank - 1]
    if rank == 3:
        choices += [1, (1, 2), (-2,)]
    if not batch:
        choices += [None, 0, tuple(range(rank))]
    options["dim"] = draw(ctx.choice(tuple(choices)))
    if options["dim"] is not None:
        options["keepdim"] = draw(st.booleans())
    options["dtype"] = draw(ctx.choice(tuple([None, "float32"])))
    return shape, options


def softmax(draw: Any, ctx: Any) -> Shape:
    """softmax and log_softmax: rank 2-3, any dim but the rows' for batch invariance."""
    options: dict[str, Any] = {}
    rank = draw(ctx.integers(2, 3))
    shape = (draw(ctx.rows), *(draw(ctx.small if rank == 3 else ctx.dim) for _ in range(rank - 1)))
    dims = [*range(1, rank), -1]
    if ctx.prop != "batch_invariance":
        dims.append(0)
    options["dim"] = draw(ctx.choice(tuple(sorted(set(dims), key=lambda x: (x != -1, x)))))
    options["dtype"] = draw(ctx.choice(tuple([None, "float32"])))
    return shape, options


def rows_by_dim(draw: Any, ctx: Any) -> Shape:
    """(m, n): silu."""
    return (draw(ctx.rows), draw(ctx.dim)), {}


def rms_norm(draw: Any, ctx: Any) -> Shape:
    options = {"eps": draw(ctx.choice(tuple([None, 1e-6])))}
    return (draw(ctx.rows), draw(ctx.extents(ctx.clip(ctx.dim_extent, low=1)))), options


def add_rms_norm(draw: Any, ctx: Any) -> Shape:
    return (draw(ctx.rows), draw(ctx.extents(ctx.clip(ctx.dim_extent, low=1)))), {}


def attention(draw: Any, ctx: Any) -> Shape:
    space = ctx.space
    length = ctx.extents(space.attention_length)
    if ctx.prop == "batch_invariance":
        length = ctx.integers(space.attention_length.min, min(space.attention_length.max, 8))
    kv_heads = draw(ctx.choice(tuple([1, 2])))
    heads = kv_heads * draw(ctx.choice(tuple([1, 2, 4])))
    head_dim = draw(ctx.choice(tuple(space.head_dims)))
    return (draw(length), heads, kv_heads, head_dim), {}


def attention_companions(ctx: Any) -> Any:
    return ctx.extents(ctx.space.attention_length)


def probe_model(draw: Any, ctx: Any) -> Shape:
    options: dict[str, Any] = {}
    space, prop = ctx.space, ctx.prop
    length = ctx.integers(2 if prop == "decode" else 1, max(2, min(space.attention_length.max, 12)))
    if prop == "decode":
        options["mode"] = "decode"
    kv_heads = draw(ctx.choice((1, 2)))
    heads = kv_heads * draw(ctx.choice((1, 2)))
    head_dim = draw(ctx.choice((8, 16)))
    vocab = draw(ctx.choice((16, 64, 257)))
    return (
        draw(length),
        draw(ctx.choice((1, 2))),
        heads,
        kv_heads,
        head_dim,
        vocab,
        draw(ctx.choice((16, 48))),
    ), options


def probe_model_companions(ctx: Any) -> Any:
    return ctx.integers(1, max(1, min(ctx.space.attention_length.max, 24)))


def small_companions(ctx: Any) -> Any:
    """bmm and matmul: companions of at most 16 rows (each row is a whole matrix or more)."""
    return ctx.integers(1, min(ctx.space.companion_rows.max, 16))


def engine(draw: Any, ctx: Any) -> Shape:
    # One prompt of 1..24 tokens (within the space's rows) of the tiny model's vocabulary.
    tokens = ctx.clip(ctx.space.rows, high=ENGINE_MAX_TOKENS)
    return (draw(ctx.integers(tokens.min, tokens.max)), ENGINE_VOCAB), {}


def engine_companions(ctx: Any) -> Any:
    tokens = ctx.clip(ctx.space.companion_rows, high=ENGINE_MAX_TOKENS)
    return ctx.integers(tokens.min, tokens.max)


def gated(draw: Any, ctx: Any) -> Shape:
    """silu_and_mul: (m, h), x of (m, 2h)."""
    return (draw(ctx.rows), draw(ctx.dim)), {}


def gelu_and_mul(draw: Any, ctx: Any) -> Shape:
    options = {"approximate": draw(ctx.option("approximate"))}
    return (draw(ctx.rows), draw(ctx.dim)), options


def fused_add_rms_norm(draw: Any, ctx: Any) -> Shape:
    options = {"eps": draw(ctx.choice(tuple([1e-6, 1e-5])))}
    return (draw(ctx.rows), draw(ctx.extents(ctx.clip(ctx.dim_extent, low=1)))), options


def layer_norm(draw: Any, ctx: Any) -> Shape:
    options = {"affine": draw(ctx.option("affine")), "eps": draw(ctx.option("eps"))}
    return (draw(ctx.rows), draw(ctx.extents(ctx.clip(ctx.dim_extent, low=1)))), options


def embedding(draw: Any, ctx: Any) -> Shape:
    """(m, vocab, h): a small vocabulary (a tile edge and a prime among them), h from the space."""
    vocab = draw(ctx.choice(tuple([1, 16, 17, 257])))
    return (draw(ctx.rows), vocab, draw(ctx.dim)), {}


# -- inference ops -------------------------------------------------------------------------


def rotary_embedding(draw: Any, ctx: Any) -> Shape:
    """(tokens, heads, kv_heads, head_size, rot_dim, max_position), option is_neox.

    head_size is even, from the space's extent halved (tile-edge biased: 2 * (16 +- 1) ...),
    at most 256; rot_dim is the whole head, or (partial rotary) an even part of it; the cache
    has 1..4096 positions (tile-edge biased)."""
    options = {"is_neox": draw(ctx.option("is_neox"))}
    tokens = draw(ctx.rows)
    kv_heads = draw(ctx.choice((1, 2)))
    heads = kv_heads * draw(ctx.choice((1, 2, 4)))
    half = draw(ctx.extents(ctx.clip(ctx.dim_extent, low=1, high=128)))
    head_size = 2 * half
    rot_dim = head_size
    if draw(st.booleans()):  # partial rotary (shrinks toward the full head)
        rot_dim = 2 * draw(ctx.integers(1, half))
    max_position = draw(ctx.extents(ctx.clip(ctx.space.rows, low=1, high=4096)))
    return (tokens, heads, kv_heads, head_size, rot_dim, max_position), options


def logits(draw: Any, ctx: Any) -> Shape:
    """(m, vocab): greedy_argmax (and top_k's rows); vocab >= 1, from the space's extent."""
    return (draw(ctx.rows), draw(ctx.extents(ctx.clip(ctx.dim_extent, low=1)))), {}


def top_k(draw: Any, ctx: Any) -> Shape:
    """(m, vocab), option k in 1..vocab (tile-edge biased, shrinks toward 1)."""
    shape, _ = logits(draw, ctx)
    k = draw(ctx.extents(ctx.clip(ctx.dim_extent, low=1, high=shape[1])))
    return shape, {"k": min(k, shape[1])}


def fused_moe(draw: Any, ctx: Any) -> Shape:
    """(tokens, hidden, intermediate, experts, topk), option renormalize.

    hidden and intermediate from the space's extent (tile-edge biased, 1..128: a block's cost is
    3 E I H); experts 1..16 (a power of two or a prime); topk in 1..experts (shrinks toward 1)."""
    options = {"renormalize": draw(ctx.option("renormalize"))}
    tokens = draw(ctx.rows)
    extent = ctx.clip(ctx.dim_extent, low=1, high=128)
    hidden, inter = draw(ctx.extents(extent)), draw(ctx.extents(extent))
    experts = draw(ctx.choice((1, 2, 3, 4, 8, 16)))
    topk = draw(ctx.integers(1, experts))
    return (tokens, hidden, inter, experts, topk), options


# -- paged KV-cache decode attention ---------------------------------------------------------------

PAGED_MAX_CONTEXT = 512
"""A sequence's context (the needle's and each companion's) is at most this many KV tokens."""


def paged_decode_attention(draw: Any, ctx: Any) -> Shape:
    """(context, heads, kv_heads, head_dim, block_size), option placement.

    The needle's context comes from the space's rows (tile-edge biased, at most 512) for every
    property, batch invariance included: a decode kernel that splits the keys only does so past
    some length, so the needle must be able to be long. GQA: heads = kv_heads * (1, 2 or 4);
    head_dim from the space's attention head sizes; block_size 1..16, tile-edge biased (1, 15,
    16, 17 clipped); placement 0 (blocks in batch order, what shrinking reaches) or a seed that
    permutes the pool."""
    context = draw(ctx.extents(ctx.clip(ctx.space.rows, low=1, high=PAGED_MAX_CONTEXT)))
    kv_heads = draw(ctx.choice((1, 2)))
    heads = kv_heads * draw(ctx.choice((1, 2, 4)))
    head_dim = draw(ctx.choice(tuple(ctx.space.head_dims)))
    block_size = draw(ctx.extents(ctx.clip(ctx.space.rows, low=1, high=16), (1, 8, 16)))
    placement = draw(st.one_of(st.just(0), st.integers(1, 2**31 - 1)))
    return (context, heads, kv_heads, head_dim, block_size), {"placement": placement}


def paged_decode_companions(ctx: Any) -> Any:
    """The other sequences' contexts: the space's companion rows, at most 512 tokens each."""
    return ctx.extents(ctx.clip(ctx.space.companion_rows, low=1, high=PAGED_MAX_CONTEXT))
