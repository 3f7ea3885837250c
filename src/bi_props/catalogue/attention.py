"""Attention: packed variable-length attention and paged KV-cache decode attention.

One op's helpers, shape strategy and OpSpec (in ``OPS``) side by side (``bi_props.catalogue``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..model.bounds import (
    LAMBDA,
    _chain_spread,
    _gamma,
    _output_rounding,
)
from ..model.case import Case
from ..model.compare import smallest_normal, unit_roundoff
from ..model.opspec import (
    ControlExample,
    Operand,
    OpSpec,
    Reference,
)
from ._shared import (
    Shape,
    _entry_function,
    _never_exact,
)


def _attention_operands(case: Case) -> tuple[Operand, ...]:
    return (Operand("q", 0), Operand("k", 0), Operand("v", 0))


def _attention_shapes(case: Case, rows: int) -> tuple[tuple[int, ...], ...]:
    _, heads, kv_heads, head_dim = case.shape
    return ((rows, heads, head_dim), (rows, kv_heads, head_dim), (rows, kv_heads, head_dim))


def _attention_call(entry: str, args: Sequence[Any], case: Case, lengths: Sequence[int]) -> Any:
    import torch

    function = _entry_function(entry)  # looked up now: swaps show
    q, k, v = args
    cu = torch.tensor([0, *np.cumsum(lengths).tolist()], dtype=torch.int64)
    return function(q, k, v, cu, 1.0 / math.sqrt(case.shape[3]), True)


def _attention_reference(
    x: Sequence[np.ndarray], case: Case, lengths: Sequence[int], acc: str = "float32"
):
    """Causal attention per sequence (``_causal_reference``, every token a query)."""
    q, k, v = x
    spans, start = [], 0
    for length in lengths:
        spans.append((slice(start, start + length), slice(start, start + length)))
        start += length
    return _causal_reference(q, k, v, q.shape[0], spans, case, acc)


def _causal_reference(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    tokens: int,
    spans: Sequence[tuple[slice, slice]],
    case: Case,
    acc: str,
) -> tuple[Reference, ...]:
    """Causal attention per sequence in float64, ``tokens`` output rows: each span (query rows,
    key rows) is one sequence whose queries are its last Lq tokens, the mask aligned to the end
    (query i sees keys j <= Lk - Lq + i); the output rows are the query rows packed in order.
    The scores carry gamma_D * scale * sum|q||k| of error; softmax turns a score error d into a
    relative weight error of about 2d, and the weighted sum of Lk values adds gamma_Lk; all
    relative to sum_j p_j |v_j| (the worst case; ``softmax_value_error`` the probabilistic
    bound)."""
    heads, kv_heads, head_dim = case.shape[-3:]
    scale = 1.0 / math.sqrt(head_dim)
    group = heads // kv_heads
    u = unit_roundoff(acc)
    shape = (tokens, heads, v.shape[-1])
    value, error, magnitude = np.zeros(shape), np.zeros(shape), np.zeros(shape)
    start = 0
    for q_rows, k_rows in spans:
        qs, ks, vs = q[q_rows], np.repeat(k[k_rows], group, axis=1), np.repeat(v[k_rows], group, 1)
        lq, lk = qs.shape[0], ks.shape[0]
        sl = slice(start, start + lq)
        start += lq
        if lq == 0:
            continue
        with np.errstate(all="ignore"):
            scores = np.einsum("ihd,jhd->hij", qs, ks) * scale
            score_mag = np.einsum("ihd,jhd->hij", np.abs(qs), np.abs(ks)) * scale
            mask = np.triu(np.ones((lq, lk), dtype=bool), 1 + lk - lq)
            scores = np.where(mask, -np.inf, scores)
            m = scores.max(-1, keepdims=True)
            p = np.exp(scores - m)
            p = p / p.sum(-1, keepdims=True)
            out = np.einsum("hij,jhd->ihd", p, vs)
            weighted = np.einsum("hij,jhd->ihd", p, np.abs(vs))
            # d: the error of each score, per (head, query).
            d = _gamma(head_dim + 2, u) * np.where(mask, 0, score_mag).max(-1)
            spread = np.where(mask, 0, np.abs(scores - m)).max(-1)
            rel = 2 * d + u * (2 * spread + 8) + 2 * _gamma(lk + head_dim, u)
            rel = rel.T[:, :, None]  # (I, H, 1)
            # rel * sum p|v| is first order in the score errors: once they reach order 1 (huge
            # scores: wide values, near-ties far apart in float32) any visible key may win, and
            # the one bound that holds is the hull of the values it sees (nonnegative weights
            # summing to 1, each rounded). Query i sees the keys up to lk - lq + i: a prefix.
            seen = lk - lq + np.arange(lq)
            top_v = np.maximum.accumulate(vs, axis=0)[seen]
            low_v = np.minimum.accumulate(vs, axis=0)[seen]
            largest_v = np.maximum(np.abs(top_v), np.abs(low_v))
            hull = np.maximum(top_v - out, out - low_v) * (1 + 4 * u) + 4 * u * largest_v
            worst = np.where(rel < 1, rel * weighted, hull)
            value[sl] = out
            error[sl], linear = softmax_value_error(qs, ks, vs, scale, mask, u, acc, worst)
            magnitude[sl] = np.where(linear, np.abs(out), np.where(rel < 1, weighted, largest_v))
    # softmax_value_error counts the final division's (or reciprocal and product's) roundings.
    bound = _output_rounding(value, error, case.dtype, magnitude, acc, last_counted=True)
    return (Reference(value, bound, case.dtype, acc),)


EXP_ULPS = 2.0
"""An exp in a kernel is allowed this many ulps of relative error (2 u each): vectorised float32
exps (Sleef's u10 variants, PyTorch's and vLLM's CPU paths, GPU ``__expf`` after range reduction)
stay within 1-2; one off by 1e-5 (about 84 ulps) is what the bound must catch."""

COMBINE = 2.0
"""The split-KV combine's weight on spread(c) (``softmax_value_error``)."""

LINEAR_LIMIT = 0.05
"""The probabilistic bound below is first order in the score errors: where a row's largest score
error reaches this (e^0.05 - 1 is 5 % off 0.05), the row falls back to the worst-case bound."""


def softmax_value_error(
    q: np.ndarray,
    ks: np.ndarray,
    vs: np.ndarray,
    scale: float,
    mask: np.ndarray | None,
    u: float,
    acc: str,
    worst_case: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """The allowed error of softmax(scale q k^T) v, per query row, head and output element.

    q (I, H, D); ks, vs (J, H, D) (kv heads already repeated); mask (I, J), True where a key is
    hidden. Every rounding of an honest kernel, in any order and blocking, enters to first order
    as an independent error of at most u (EXP_ULPS ulps for an exp) times a known coefficient, so
    by Azuma-Hoeffding (LAMBDA, as in ``bounds``) the output is within
    LAMBDA u sqrt(V) of softmax's value, where with p_j the weights, c_j = p_j (v_j - out):

    - a score's error moves the output by c_j times it: the dot product's rounding (its chain
      spread, times scale^2), the scale's (or a folded log2 e's) two roundings (2 s_j^2), the
      shift x - max (s_j - m)^2 and the exp (EXP_ULPS^2); the max itself cancels;
    - dividing each weight: (p_j v_j)^2; with 16-bit internals storing it too: 2 (p_j v_j)^2;
    - the normaliser sum l (a chain over the p_j, and its rescales in an online softmax): 2 out^2
      spread(p); the final division or reciprocal and product: 2 out^2;
    - P @ V (a chain over p_j v_j, and the accumulator's rescales): 2 spread(p v);
    - a split-KV combine over splits of at least 16 keys: a split's weight and its division
      (an exp, a product, a division: 6 u^2 of variance) move the output by the split's sum of
      c_j, at most 2 (C_a^2 + C_b^2) of the c-chain's prefix sums at its ends: 24 / 16 of the
      prefix sums' squares, which spread(c) (twice their expectation, the c_j summing to zero)
      covers twice: COMBINE spread(c);

    plus the accumulator's smallest normal per weight times sum_j |v_j| (an exp flushed to zero).
    Rows whose largest score error passes LINEAR_LIMIT, or whose values are not finite, keep
    ``worst_case`` (the previous, worst-case bound), and no row gets more than it. Returns the
    error and where it is the probabilistic one (broadcastable to it).
    """
    visible = np.ones((q.shape[0], ks.shape[0]), dtype=bool) if mask is None else ~mask
    n = visible.sum(-1)[None, :, None]  # (1, I, 1): keys each query sees
    d = q.shape[-1]
    with np.errstate(all="ignore"):
        raw = np.einsum("ihd,jhd->hij", q, ks)
        squares = np.einsum("ihd,jhd->hij", q * q, ks * ks)
        dot_spread = _chain_spread(squares, raw, d) * scale * scale
        s = np.where(visible, raw * scale, -np.inf)
        m = s.max(-1, keepdims=True)
        p = np.exp(s - m)
        p = p / p.sum(-1, keepdims=True)
        shift = np.where(visible, s - m, 0.0)
        s0 = np.where(visible, s, 0.0)
        a = dot_spread + 2 * s0 * s0 + shift * shift + EXP_ULPS**2
        a = np.where(visible, a, 0.0)
        pp = p * p
        out = np.einsum("hij,jhd->ihd", p, vs)
        a0, a1, a2 = (np.einsum("hij,jhd->ihd", pp * a, vs**k) for k in (0, 1, 2))
        c0, c1, c2 = (np.einsum("hij,jhd->ihd", pp, vs**k) for k in (0, 1, 2))
        score_terms = np.maximum(a2 - 2 * out * a1 + out * out * a0, 0.0)
        c_squares = np.maximum(c2 - 2 * out * c1 + out * out * c0, 0.0)
        n_out = np.moveaxis(n, 1, 0)  # (I, 1, 1)
        spread_l = np.transpose(_chain_spread(pp.sum(-1, keepdims=True), 1.0, n), (1, 0, 2))
        spread_pv = _chain_spread(c2, out, n_out)
        spread_c = _chain_spread(c_squares, 0.0, n_out)
        total = (
            score_terms
            + (1 if acc in ("float32", "float64") else 2) * c2
            + 2 * out * out * (1 + spread_l)
            + 2 * spread_pv
            + COMBINE * spread_c
        )
        largest = LAMBDA * u * np.sqrt(np.where(visible, dot_spread, 0.0).max(-1))  # (H, I)
        largest = largest.T[:, :, None]
        flushed = smallest_normal(acc) * np.einsum("ij,jhd->ihd", visible * 1.0, np.abs(vs))
        error = LAMBDA * u * np.sqrt(total) * (1 + largest) + flushed
        linear = (largest <= LINEAR_LIMIT) & np.isfinite(error)
        return np.where(linear, np.minimum(error, worst_case), worst_case), linear


PAGED_STALE_SCALE = 256.0
"""The pool's slots that no sequence owns (spare blocks, the tail of each sequence's last block)
hold finite stale values of this scale, as a reused vLLM cache does: a kernel that reads past a
sequence's length shows in the reference and in batch invariance. Not NaN: a real cache never
holds NaN, and a kernel that masks a score to -inf but still multiplies its (finite) value by the
zero weight is correct (vLLM's CPU kernel does: tests/vllm_lane/lane_vllm_ops.py)."""


PAGED_SPARE_BLOCKS = 2
"""Blocks in the pool beyond those the batch's sequences need (never referenced)."""


ATTENTION_BOUND = (
    "per query row, head and output element, with weights p_j and c_j = p_j (v_j - out): every"
    " rounding of an honest kernel in any order and blocking (naive, online softmax with a"
    " running max, split-KV with a combine) enters to first order as an independent error of at"
    " most u (2 ulps for an exp); Azuma-Hoeffding: lambda u sqrt(V), V = sum_j c_j^2 (scale^2"
    " spread(q.k_j) + 2 s_j^2 + (s_j - max)^2 + 4) + sum_j (p_j v_j)^2 + 2 out^2 (1 + spread(p))"
    " + 2 spread(p v) + 2 spread(c), spread = a chain's squared partial sums as in sum_error"
    " (softmax_value_error); plus the accumulator's smallest normal times sum |v_j|; rows whose"
    " score error passes 0.05 keep the worst case (2 gamma~ score errors relative to sum p |v|,"
    " or once those reach 1 the hull of the values the query sees);"
    " then one rounding to the output dtype unless it is the internals' own, and the smallest"
    " normal"
)

PAGED_DECODE_BOUND = ATTENTION_BOUND + " (the decode row of each sequence, over all its keys)"


def _paged_operands(case: Case) -> tuple[Operand, ...]:
    """query, k, v per sample: one row per KV token of the sequence (the query's last row is the
    decode token's query; the others stand for the prefill's and are unused)."""
    return (Operand("query", 0), Operand("k", 0), Operand("v", 0))


def _paged_shapes(case: Case, rows: int) -> tuple[tuple[int, ...], ...]:
    _, heads, kv_heads, head_dim, _ = case.shape
    return ((rows, heads, head_dim), (rows, kv_heads, head_dim), (rows, kv_heads, head_dim))


def paged_layout(
    lengths: Sequence[int], block_size: int, placement: int
) -> tuple[np.ndarray, np.ndarray, int]:
    """Where the batch's KV tokens live in the paged pool: (block_table, slots, num_blocks).

    Sequence b owns ceil(L_b / block_size) blocks; the pool has those plus PAGED_SPARE_BLOCKS.
    Placement 0 puts the blocks in batch order (the spares last); any other value permutes the
    whole pool with numpy's PCG64 seeded by (placement, pool size): Hypothesis draws it, so each
    sequence's blocks sit at positions it chose (and shrinks toward the plain order).
    ``block_table`` is (B, max blocks) int32, unused entries 0; ``slots`` is each packed token's
    slot, block * block_size + offset (int64)."""
    counts = [-(-int(n) // block_size) for n in lengths]
    total = sum(counts)
    num_blocks = total + PAGED_SPARE_BLOCKS
    order = np.arange(num_blocks)
    if placement:
        order = np.random.default_rng([int(placement), num_blocks]).permutation(num_blocks)
    table = np.zeros((len(lengths), max(counts, default=0) or 1), dtype=np.int32)
    slots = []
    first = 0
    for b, (n, count) in enumerate(zip(lengths, counts, strict=True)):
        blocks = order[first : first + count]
        first += count
        table[b, :count] = blocks
        t = np.arange(int(n))
        slots.append(blocks[t // block_size] * block_size + t % block_size)
    packed = np.concatenate(slots) if slots else np.zeros(0, dtype=np.int64)
    return table, packed.astype(np.int64), num_blocks


def paged_cache(
    k: Any, v: Any, lengths: Sequence[int], block_size: int, placement: int
) -> tuple[Any, Any, Any, Any]:
    """Page packed k, v (tokens, Hkv, D) into pools of blocks: (k_cache, v_cache (num_blocks,
    block_size, Hkv, D), block_table (B, max_blocks) int32, seq_lens (B,) int32), the blocks at
    ``paged_layout``'s positions. Slots no sequence owns hold finite stale values (numpy's PCG64
    seeded by (placement, num_blocks, 1), times PAGED_STALE_SCALE). Data movement only."""
    import torch

    table, slots, num_blocks = paged_layout(lengths, block_size, placement)
    kv_heads, head_dim = k.shape[1], k.shape[2]
    rng = np.random.default_rng([int(placement), num_blocks, 1])
    stale = rng.standard_normal((2, num_blocks * block_size, kv_heads, head_dim))
    pools = torch.from_numpy(stale * PAGED_STALE_SCALE).to(k.dtype)
    index = torch.from_numpy(slots)
    shape = (num_blocks, block_size, kv_heads, head_dim)
    k_cache = pools[0].index_copy(0, index, k).reshape(shape)
    v_cache = pools[1].index_copy(0, index, v).reshape(shape)
    seq_lens = torch.tensor([int(n) for n in lengths], dtype=torch.int32)
    return k_cache, v_cache, torch.from_numpy(table), seq_lens


def paged_decode_call(
    function: Callable[..., Any], args: Sequence[Any], case: Case, lengths: Sequence[int]
) -> Any:
    """Page the packed k, v (``paged_cache``), take each sequence's last query row and call
    ``function`` with vLLM's decode arguments: (query (B, H, D), k_cache, v_cache, block_table,
    seq_lens, scale = 1 / sqrt(D)). The operands' layouts reach only the copies into the cache
    (the cache is what a kernel reads)."""
    import torch

    query, k, v = args
    block_size, head_dim = case.shape[4], case.shape[3]
    caches = paged_cache(k, v, lengths, block_size, case.opt("placement", 0))
    last = torch.from_numpy(np.cumsum(np.asarray(lengths, dtype=np.int64)) - 1)
    return function(query.index_select(0, last), *caches, 1.0 / math.sqrt(head_dim))


def _paged_call(entry: str, args: Sequence[Any], case: Case, lengths: Sequence[int]) -> Any:
    return paged_decode_call(_entry_function(entry), args, case, lengths)


def _paged_reference(
    x: Sequence[np.ndarray], case: Case, lengths: Sequence[int], acc: str = "float32"
):
    """softmax(scale q k^T) v per sequence and query head in float64, q the sequence's last query
    row, over all its L keys (decode: no causal mask); query head h reads kv head h // (H / Hkv).
    The bound is PAGED_DECODE_BOUND (the ``attention`` op's, plus a split-KV combine)."""
    query, k, v = x
    _, heads, kv_heads, head_dim, _ = case.shape
    scale, group, u = 1.0 / math.sqrt(head_dim), heads // kv_heads, unit_roundoff(acc)
    count = len(lengths)
    value = np.zeros((count, heads, head_dim))
    error = np.zeros_like(value)
    magnitude = np.zeros_like(value)
    start = 0
    for b, length in enumerate(lengths):
        sl = slice(start, start + length)
        start += length
        q = query[start - 1]  # (H, D)
        ks, vs = np.repeat(k[sl], group, axis=1), np.repeat(v[sl], group, axis=1)  # (L, H, D)
        with np.errstate(all="ignore"):
            scores = np.einsum("hd,lhd->hl", q, ks) * scale
            score_mag = np.einsum("hd,lhd->hl", np.abs(q), np.abs(ks)) * scale
            m = scores.max(-1, keepdims=True)
            p = np.exp(scores - m)
            p = p / p.sum(-1, keepdims=True)
            value[b] = np.einsum("hl,lhd->hd", p, vs)
            weighted = np.einsum("hl,lhd->hd", p, np.abs(vs))
            d = _gamma(head_dim + 2, u) * score_mag.max(-1)
            spread = np.abs(scores - m).max(-1)
            rel = 2 * d + u * (2 * spread + 12) + 2 * _gamma(length + head_dim, u)
            # rel * sum p|v| is first order in the score errors: once they reach order 1 (huge
            # scores: wide values) any key may win, and the one bound that holds is the hull of
            # the values (an output of nonnegative weights summing to 1, each rounded).
            hull = np.abs(vs - value[b][None]).max(0) * (1 + 4 * u) + 4 * u * np.abs(vs).max(0)
            worst = np.where(rel[:, None] < 1, rel[:, None] * weighted, hull)
            err, linear = softmax_value_error(q[None], ks, vs, scale, None, u, acc, worst[None])
            error[b] = err[0]
            top = np.where(rel[:, None] < 1, weighted, np.abs(vs).max(0))
            magnitude[b] = np.where(linear[0], np.abs(value[b]), top)
    # softmax_value_error counts the final division's (or reciprocal and product's) roundings.
    bound = _output_rounding(value, error, case.dtype, magnitude, acc, last_counted=True)
    return (Reference(value, bound, case.dtype, acc),)


def _paged_output_rows(case: Case, rows: int) -> int:
    """A sample is one sequence; its output is its decode token's: one row."""
    return 1


def _paged_repro(case: Case) -> tuple[str, str]:
    """The reproducer pages the cache exactly as the call does: the source of ``paged_layout``,
    ``paged_cache`` and ``paged_decode_call`` is copied into the script (one definition, and the
    script needs no bi_props for it), then the entry point is called."""
    import inspect

    module, _, attr = case.entry.rpartition(".")
    shape, placement = case.shape, int(case.opt("placement", 0))
    sources = "\n\n".join(
        inspect.getsource(f) for f in (paged_layout, paged_cache, paged_decode_call)
    )
    definition = (
        "import math\nfrom collections.abc import Callable, Sequence\nfrom typing import Any\n"
        "import numpy as np\n"
        f"import {module} as _paged_module  # looked up at call time (a target swaps it)\n"
        "Case = Any\n"
        f"PAGED_SPARE_BLOCKS = {PAGED_SPARE_BLOCKS!r}\nPAGED_STALE_SCALE = {PAGED_STALE_SCALE!r}\n"
        f"\n\n{sources}\n\n"
        "class _Case:  # what paged_decode_call reads of the case\n"
        f"    shape = {tuple(shape)!r}\n"
        "    def opt(self, name, default=None):\n"
        f"        return {placement!r} if name == 'placement' else default\n"
    )
    expr = f"paged_decode_call(_paged_module.{attr}, args, _Case(), lengths)"
    return definition, expr


SHORT_NEEDLE = 8
"""A short batch-invariance needle has at most this many tokens."""


def _short_or_long(draw: Any, ctx: Any, long: Any) -> Any:
    """A batch-invariance needle's length strategy: short (at most ``SHORT_NEEDLE`` tokens) one
    time in three, what shrinking reaches; else ``long``, the space's whole attention length. A
    kernel that splits a sequence's keys by the batch's longest shows only on a needle that
    spans more than one split and is not the longest itself (a long needle beside a longer
    companion), and a long needle costs little beside its batch."""
    space = ctx.space
    if draw(ctx.integers(0, 2)) == 0:
        length = space.attention_length
        return ctx.integers(length.min, min(length.max, SHORT_NEEDLE))
    return long


def _heads(draw: Any, ctx: Any) -> tuple[int, int, int]:
    """(heads, kv_heads, head_dim): GQA groups of 1, 2 or 4; a deployment-size example keeps one
    KV head and the smallest head size (its cost is its length)."""
    if ctx.scaled:
        return draw(ctx.choice((1, 2))), 1, min(ctx.space.head_dims)
    kv_heads = draw(ctx.choice((1, 2)))
    heads = kv_heads * draw(ctx.choice((1, 2, 4)))
    return heads, kv_heads, draw(ctx.choice(tuple(ctx.space.head_dims)))


def long_needle(ctx: Any) -> Any:
    """A deployment-size needle's length: a named size or any, at most what leaves three
    quarters of the example's budget to a longer companion (scores cost length squared: 512
    keys on the cpu profile's budget)."""
    top = max(1, math.isqrt(ctx.space.max_elements // 4))
    return ctx.sizes(1, min(top, ctx.space.attention_length.max))


def draw_attention(draw: Any, ctx: Any) -> Shape:
    space = ctx.space
    length = ctx.extents(space.attention_length)
    if ctx.scaled:
        length = long_needle(ctx)
    elif ctx.prop == "batch_invariance":
        length = _short_or_long(draw, ctx, length)
    heads, kv_heads, head_dim = _heads(draw, ctx)
    return (draw(length), heads, kv_heads, head_dim), {}


def attention_companions(ctx: Any) -> Any:
    if ctx.scaled:  # up to the scale's context; cut to the budget with the batch drawn
        return ctx.sizes(1, ctx.space.attention_length.max)
    return ctx.extents(ctx.space.attention_length)


def attention_cost(case: Case, rows: int) -> int:
    """A sequence of ``rows`` tokens: its causal scores, rows x rows per head (the bound of a
    deployment-size example, ``OpSpec.cost``)."""
    return rows * rows * int(case.shape[-3])


def paged_cost(case: Case, rows: int) -> int:
    """A paged sequence of ``rows`` KV tokens: its keys and values, and one score row per head."""
    heads, kv_heads, head_dim = (int(x) for x in case.shape[1:4])
    return rows * (2 * kv_heads * head_dim + heads)


# -- mixed batches: prefills, prefill chunks over a cached prefix, decode tokens -------------


def sample_queries(rows: int, queries: int) -> int:
    """A sample's query tokens: its last ``queries`` of ``rows`` tokens, clipped to [1, rows];
    0 means all of them (a prefill: ``Companion.queries``' default)."""
    return rows if queries <= 0 else min(queries, rows)


def mixed_queries(case: Case, lengths: Sequence[int]) -> list[int]:
    """The query tokens of each sequence of a ``mixed_attention`` call on ``lengths`` (the key
    tokens per sample): the needle's are ``shape[1]``, a companion's its ``queries``. ``lengths``
    must be the needle alone or the case's whole batch (the only calls the observers make); any
    other list is refused rather than guessed."""
    needle_q = sample_queries(case.shape[0], case.shape[1])
    if list(lengths) == [case.shape[0]]:
        return [needle_q]
    if case.batch is not None:
        order = [sample_queries(c.rows, c.queries) for c in case.batch.companions]
        rows = [c.rows for c in case.batch.companions]
        order.insert(case.batch.position, needle_q)
        rows.insert(case.batch.position, case.shape[0])
        if list(lengths) == rows:
            return order
    raise ValueError(
        f"mixed_attention: lengths {list(lengths)} are neither the needle nor its batch"
    )


def _mixed_operands(case: Case) -> tuple[Operand, ...]:
    return (Operand("q", 0), Operand("k", 0), Operand("v", 0))


def _mixed_shapes(case: Case, rows: int) -> tuple[tuple[int, ...], ...]:
    """Every sample's q, k, v have one row per token of its sequence (``rows`` = its keys); the
    call passes the last Lq rows of q (the earlier ones stand for the cached prefix's queries,
    computed in an earlier step, and are unused)."""
    _, _, heads, kv_heads, head_dim = case.shape
    return ((rows, heads, head_dim), (rows, kv_heads, head_dim), (rows, kv_heads, head_dim))


def mixed_call(
    function: Callable[..., Any],
    args: Sequence[Any],
    lengths: Sequence[int],
    queries: Sequence[int],
) -> Any:
    """Take each sequence's last ``queries[b]`` query rows and call ``function`` as
    ``flash_attn_varlen_func``'s arguments go: (q (sum Lq, H, D), k, v (sum Lk, Hkv, D),
    cu_seqlens_q, cu_seqlens_k, scale = 1 / sqrt(D), causal=True). q's layout reaches only the
    copy of its rows (what a kernel reads)."""
    import torch

    q, k, v = args
    ends = np.cumsum(np.asarray(lengths, dtype=np.int64))
    rows = [np.arange(e - n, e) for e, n in zip(ends, queries, strict=True)]
    index = torch.from_numpy(np.concatenate(rows) if rows else np.zeros(0, dtype=np.int64))
    cu_q = torch.tensor([0, *np.cumsum(queries).tolist()], dtype=torch.int64)
    cu_k = torch.tensor([0, *ends.tolist()], dtype=torch.int64)
    scale = 1.0 / math.sqrt(q.shape[-1])
    return function(q.index_select(0, index.long()), k, v, cu_q, cu_k, scale, True)


def _mixed_call(entry: str, args: Sequence[Any], case: Case, lengths: Sequence[int]) -> Any:
    return mixed_call(_entry_function(entry), args, lengths, mixed_queries(case, lengths))


def _mixed_reference(
    x: Sequence[np.ndarray], case: Case, lengths: Sequence[int], acc: str = "float32"
):
    """Each sequence's last Lq tokens over its Lk keys, the causal mask aligned to the end
    (``_causal_reference``, the attention op's bound)."""
    q, k, v = x
    queries = mixed_queries(case, lengths)
    spans, start = [], 0
    for lk, lq in zip(lengths, queries, strict=True):
        spans.append((slice(start + lk - lq, start + lk), slice(start, start + lk)))
        start += lk
    return _causal_reference(q, k, v, sum(queries), spans, case, acc)


def _mixed_output_rows(case: Case, rows: int) -> int:
    """The needle owns its query tokens' rows."""
    return sample_queries(rows, case.shape[1])


def _mixed_companion_rows(case: Case, companion: Any) -> int:
    return sample_queries(companion.rows, companion.queries)


def _mixed_repro(case: Case) -> tuple[str, str]:
    """The reproducer selects the query rows exactly as the call does: ``mixed_call``'s source is
    copied into the script, with each group's query lengths (the needle alone, the batch)."""
    import inspect

    module, _, attr = case.entry.rpartition(".")
    table = {(case.shape[0],): mixed_queries(case, [case.shape[0]])}
    if case.batch is not None:
        lengths = [rows for _, rows in case.batch.samples(case.seed, case.shape[0])]
        table[tuple(lengths)] = mixed_queries(case, lengths)
    definition = (
        "import math\nfrom collections.abc import Callable, Sequence\nfrom typing import Any\n"
        "import numpy as np\n"
        f"import {module} as _mixed_module  # looked up at call time (a target swaps it)\n"
        f"\n\n{inspect.getsource(mixed_call)}\n\n"
        f"QUERIES = {table!r}  # each group's query tokens per sequence\n"
    )
    expr = f"mixed_call(_mixed_module.{attr}, args, lengths, QUERIES[tuple(lengths)])"
    return definition, expr


MIXED_KINDS = ("prefill", "decode", "chunk")
"""What a needle's new tokens are: all of its tokens (the first, what shrinking reaches), one
decode token over its cached prefix, or a prefill chunk over one."""


def draw_mixed_attention(draw: Any, ctx: Any) -> Shape:
    """(keys, queries, heads, kv_heads, head_dim): a sequence of ``keys`` tokens (the space's
    attention length; for batch invariance short or long, as ``attention``) whose last
    ``queries`` are new: a prefill (queries = keys), a decode token (1) or a chunk (1 <= queries
    < keys, after a cached prefix of keys - queries tokens, tile-edge biased)."""
    space = ctx.space
    keys = ctx.extents(space.attention_length)
    if ctx.scaled:
        keys = long_needle(ctx)
    elif ctx.prop == "batch_invariance":
        keys = _short_or_long(draw, ctx, keys)
    lk = draw(keys)
    kind = draw(ctx.choice(MIXED_KINDS))
    lq = lk
    if kind == "decode":
        lq = min(1, lk)
    elif kind == "chunk" and lk >= 2:  # the cached prefix drawn (shrinks toward 1 token)
        prefix = draw(ctx.extents(ctx.clip(space.attention_length, low=1, high=lk - 1)))
        lq = lk - min(max(prefix, 1), lk - 1)
    heads, kv_heads, head_dim = _heads(draw, ctx)
    return (lk, lq, heads, kv_heads, head_dim), {}


def mixed_companion_queries(ctx: Any) -> Any:
    """A companion's query tokens (``Companion.queries``): 0, a prefill (what shrinking
    reaches); 1, a decode token; else a chunk of that many (clipped below its keys)."""
    from hypothesis import strategies as st

    chunk = ctx.extents(ctx.clip(ctx.space.attention_length, low=2))
    return st.one_of(st.just(0), st.just(1), chunk)


def draw_paged_decode_attention(draw: Any, ctx: Any) -> Shape:
    """(context, heads, kv_heads, head_dim, block_size), option placement.

    The needle's context comes from the space's rows (tile-edge biased, at most the space's
    ``paged_context``; a deployment-size example: a named size up to the scale's context) for every
    property, batch invariance included: a decode kernel that splits the keys only does so past
    some length, so the needle must be able to be long. GQA: heads = kv_heads * (1, 2 or 4);
    head_dim from the space's attention head sizes; block_size 1..16, tile-edge biased (1, 15,
    16, 17 clipped); placement 0 (blocks in batch order, what shrinking reaches) or a seed that
    permutes the pool."""
    from hypothesis import strategies as st

    context_limit = ctx.space.paged_context
    context = ctx.extents(ctx.clip(ctx.space.rows, low=1, high=context_limit))
    if ctx.scaled:  # half of the time a needle of at most a 16th of the scale's context: a
        # kernel chosen by the batch's longest shows on a short needle beside a long companion
        long = draw(ctx.booleans())  # shrinks toward the short needle
        context = ctx.sizes(1, context_limit if long else max(1, context_limit // 16))
    context = draw(context)
    heads, kv_heads, head_dim = _heads(draw, ctx)
    block_size = draw(ctx.extents(ctx.clip(ctx.space.rows, low=1, high=16), (1, 8, 16)))
    placement = draw(st.one_of(st.just(0), st.integers(1, 2**31 - 1)))
    return (context, heads, kv_heads, head_dim, block_size), {"placement": placement}


def paged_decode_companions(ctx: Any) -> Any:
    """The other sequences' contexts: the space's companion rows, at most its
    ``paged_context`` tokens each (a deployment-size example: named sizes up to the scale's)."""
    if ctx.scaled:
        return ctx.sizes(1, ctx.space.paged_context)
    return ctx.extents(ctx.clip(ctx.space.companion_rows, low=1, high=ctx.space.paged_context))


OPS: tuple[OpSpec, ...] = (
    OpSpec(
        name="attention",
        entries=("bi_props.ops.varlen_attention",),
        shape_doc="(length, heads, kv_heads, head_dim): q, k, v packed per sequence (causal)",
        operands=_attention_operands,
        operand_shapes=_attention_shapes,
        call=_attention_call,
        reference=_attention_reference,
        exact_amplitude=_never_exact,
        bound=ATTENTION_BOUND,
        draw_shape=draw_attention,
        companion_rows=attention_companions,
        sequences=True,
        scale="context",
        cost=attention_cost,
        # A sequence of 8 tokens alone vs packed beside one of 255: stock CPU attention's
        # results differ (x86 ATen, 2026-12-04: 13 of 256 values, for every seed tried).
        control_examples=(ControlExample((8, 4, 2, 64), (255,)),),
    ),
    OpSpec(
        name="paged_decode_attention",
        entries=("bi_props.ops.paged_decode_attention",),
        shape_doc="(context, heads, kv_heads, head_dim, block_size): a sample is one sequence"
        " of `context` KV tokens, query (context, heads, head_dim) and k, v (context,"
        " kv_heads, head_dim) per token, of which the query's last row decodes; the call pages"
        " k, v into a pool of blocks of block_size at positions drawn by Hypothesis (option"
        " placement) and passes (query (B, heads, head_dim), k_cache, v_cache (num_blocks,"
        " block_size, kv_heads, head_dim), block_table (B, max_blocks) int32, seq_lens (B,)"
        " int32, scale); returns (B, heads, head_dim): one output row per sequence",
        operands=_paged_operands,
        operand_shapes=_paged_shapes,
        call=_paged_call,
        reference=_paged_reference,
        exact_amplitude=_never_exact,
        output_rows=_paged_output_rows,
        bound=PAGED_DECODE_BOUND,
        notes="the operands' layouts reach only the copy into the cache; unowned cache slots"
        " hold finite stale values (PAGED_STALE_SCALE)",
        draw_shape=draw_paged_decode_attention,
        companion_rows=paged_decode_companions,
        sequences=True,
        scale="context",
        small_size=lambda space: space.paged_context,
        cost=paged_cost,
        # A context of 5 decoded alone vs beside one of 8 (x86 ATen, 2026-12-04: 7-13 of 16).
        control_examples=(ControlExample((5, 2, 1, 8, 1), (8,), {"placement": 0}),),
        repro_call=_paged_repro,
    ),
    OpSpec(
        name="mixed_attention",
        entries=("bi_props.ops.mixed_attention",),
        shape_doc="(keys, queries, heads, kv_heads, head_dim): a sample is one sequence of `keys`"
        " tokens (q, k, v one row per token) whose last `queries` are new: a prefill (queries ="
        " keys), a prefill chunk over a cached prefix (0 < queries < keys) or a decode token"
        " (1); a companion's new tokens are its Companion.queries (0: all). The call passes, as"
        " flash_attn_varlen_func takes them, q (sum queries, heads, head_dim) of each sequence's"
        " last rows, k, v (sum keys, kv_heads, head_dim), cu_seqlens_q, cu_seqlens_k, scale,"
        " causal=True (the mask aligned to the end: query i sees keys j <= keys - queries + i);"
        " returns (sum queries, heads, head_dim)",
        operands=_mixed_operands,
        operand_shapes=_mixed_shapes,
        call=_mixed_call,
        reference=_mixed_reference,
        exact_amplitude=_never_exact,
        output_rows=_mixed_output_rows,
        companion_output_rows=_mixed_companion_rows,
        companion_queries=mixed_companion_queries,
        bound=ATTENTION_BOUND + " (each sequence's query rows over all its keys)",
        notes="q's layout reaches only the copy of each sequence's query rows",
        draw_shape=draw_mixed_attention,
        companion_rows=attention_companions,
        sequences=True,
        scale="context",
        cost=attention_cost,
        # A decode token over 8 keys alone vs beside a 255-token prefill (x86 ATen: see
        # tests/test_mixed_attention.py::test_stock_control_example_is_batch_variant).
        control_examples=(ControlExample((8, 1, 4, 2, 64), (255,)),),
        repro_call=_mixed_repro,
    ),
)
