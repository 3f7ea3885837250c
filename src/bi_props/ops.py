"""Stock (plain torch, not batch-invariant) entry points for catalogue ops that have no aten op.

The catalogue looks these up as attributes of this module at call time, so that switching the
batch-invariant kernels on (``targets.kernels.install``) can swap them for custom-op-backed
versions; nothing here should be imported by name (``from bi_props.ops import ...``).
"""

from __future__ import annotations

import itertools
import math

import torch
import torch.nn.functional as F
from torch import Tensor


def check_varlen_args(q: Tensor, k: Tensor, v: Tensor, cu_seqlens: Tensor) -> list[int]:
    """Validate the packed layout shared by the stock and the kernel version; the boundaries."""
    torch._check(
        q.dim() == 3 and k.dim() == 3 and v.dim() == 3,
        lambda: (
            f"varlen_attention: q, k, v must be (T, heads, head_dim), got {q.dim()}, "
            f"{k.dim()}, {v.dim()} dims"
        ),
    )
    tokens, heads, head_dim = q.shape
    torch._check(
        k.shape[0] == tokens and v.shape[0] == tokens and k.shape[1] == v.shape[1],
        lambda: (
            f"varlen_attention: k {tuple(k.shape)} and v {tuple(v.shape)} do not match q "
            f"{tuple(q.shape)}"
        ),
    )
    torch._check(k.shape[2] == head_dim, lambda: "varlen_attention: q and k head_dim differ")
    kv_heads = k.shape[1]
    torch._check(
        kv_heads > 0 and heads % kv_heads == 0,
        lambda: f"varlen_attention: {heads} query heads not a multiple of {kv_heads} kv heads",
    )
    torch._check(
        cu_seqlens.dim() == 1 and not cu_seqlens.is_floating_point(),
        lambda: "varlen_attention: cu_seqlens must be a 1-D integer tensor",
    )
    bounds = [int(b) for b in cu_seqlens.tolist()]
    torch._check(
        len(bounds) >= 1
        and bounds[0] == 0
        and bounds[-1] == tokens
        and all(a <= b for a, b in itertools.pairwise(bounds)),
        lambda: f"varlen_attention: cu_seqlens must rise from 0 to {tokens}, got {bounds}",
    )
    return bounds


def _cu_bounds(name: str, cu: Tensor, tokens: int, what: str) -> list[int]:
    torch._check(
        cu.dim() == 1 and not cu.is_floating_point(),
        lambda: f"mixed_attention: {name} must be a 1-D integer tensor",
    )
    bounds = [int(b) for b in cu.tolist()]
    torch._check(
        len(bounds) >= 1
        and bounds[0] == 0
        and bounds[-1] == tokens
        and all(a <= b for a, b in itertools.pairwise(bounds)),
        lambda: f"mixed_attention: {name} must rise from 0 to {tokens} ({what}), got {bounds}",
    )
    return bounds


def check_mixed_args(
    q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, causal: bool
) -> tuple[list[int], list[int]]:
    """Validate the mixed layout shared by the stock and the kernel version (as
    ``flash_attn_varlen_func`` takes it): q (Tq, H, D) packed by cu_seqlens_q, k and v (Tk, Hkv,
    D) by cu_seqlens_k, one entry per sequence in both; causal needs each sequence's query
    length at most its key length (its queries are the last of its tokens). The boundaries."""
    torch._check(
        q.dim() == 3 and k.dim() == 3 and v.dim() == 3,
        lambda: (
            f"mixed_attention: q, k, v must be (T, heads, head_dim), got {q.dim()}, "
            f"{k.dim()}, {v.dim()} dims"
        ),
    )
    heads, head_dim = q.shape[1], q.shape[2]
    torch._check(
        v.shape[0] == k.shape[0] and k.shape[1] == v.shape[1] and k.shape[2] == head_dim,
        lambda: (
            f"mixed_attention: k {tuple(k.shape)} and v {tuple(v.shape)} do not match q "
            f"{tuple(q.shape)}"
        ),
    )
    kv_heads = k.shape[1]
    torch._check(
        kv_heads > 0 and heads % kv_heads == 0,
        lambda: f"mixed_attention: {heads} query heads not a multiple of {kv_heads} kv heads",
    )
    bq = _cu_bounds("cu_seqlens_q", cu_seqlens_q, q.shape[0], "query tokens")
    bk = _cu_bounds("cu_seqlens_k", cu_seqlens_k, k.shape[0], "key tokens")
    torch._check(
        len(bq) == len(bk),
        lambda: f"mixed_attention: {len(bq) - 1} query sequences but {len(bk) - 1} key sequences",
    )
    lq = [b - a for a, b in itertools.pairwise(bq)]
    lk = [b - a for a, b in itertools.pairwise(bk)]
    torch._check(
        not causal or all(a <= b for a, b in zip(lq, lk, strict=True)),
        lambda: f"mixed_attention: causal needs query lengths {lq} <= key lengths {lk}",
    )
    return bq, bk


def check_paged_args(
    query: Tensor, k_cache: Tensor, v_cache: Tensor, block_table: Tensor, seq_lens: Tensor
) -> list[int]:
    """Validate the paged decode layout shared by the stock and the kernel version; the
    sequences' lengths. Every length is >= 1 (a decode step attends at least its own key) and
    fits the sequence's row of the block table; block ids must lie in the pool."""
    name = "paged_decode_attention"
    torch._check(
        query.dim() == 3 and k_cache.dim() == 4 and v_cache.dim() == 4,
        lambda: (
            f"{name}: query must be (B, heads, head_dim) and the caches (num_blocks,"
            f" block_size, kv_heads, head_dim), got {query.dim()}, {k_cache.dim()},"
            f" {v_cache.dim()} dims"
        ),
    )
    batch, heads, head_dim = query.shape
    num_blocks, block_size, kv_heads, _ = k_cache.shape
    torch._check(
        tuple(v_cache.shape[:3]) == tuple(k_cache.shape[:3]) and k_cache.shape[3] == head_dim,
        lambda: (
            f"{name}: k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} do not"
            f" match query {tuple(query.shape)}"
        ),
    )
    torch._check(
        kv_heads > 0 and heads % kv_heads == 0,
        lambda: f"{name}: {heads} query heads not a multiple of {kv_heads} kv heads",
    )
    torch._check(
        block_table.dim() == 2 and block_table.shape[0] == batch and seq_lens.shape == (batch,),
        lambda: (
            f"{name}: block_table must be (B, max_blocks) and seq_lens (B,) for B = {batch},"
            f" got {tuple(block_table.shape)} and {tuple(seq_lens.shape)}"
        ),
    )
    torch._check(
        not block_table.is_floating_point() and not seq_lens.is_floating_point(),
        lambda: f"{name}: block_table and seq_lens must be integer tensors",
    )
    lengths = [int(n) for n in seq_lens.tolist()]
    capacity = block_table.shape[1] * block_size
    torch._check(
        all(1 <= n <= capacity for n in lengths),
        lambda: f"{name}: seq_lens {lengths} must lie in [1, {capacity}] (max_blocks * block_size)",
    )
    used = [
        int(b)
        for row, n in zip(block_table.tolist(), lengths, strict=True)
        for b in row[: -(-n // block_size)]
    ]
    torch._check(
        all(0 <= b < num_blocks for b in used),
        lambda: f"{name}: block ids must lie in [0, {num_blocks}), got {sorted(set(used))}",
    )
    return lengths


def add_rms_norm(
    x: Tensor, residual: Tensor, weight: Tensor, eps: float | None = None
) -> tuple[Tensor, Tensor]:
    """Fused residual add + rms_norm as models call it: ``(rms_norm(x + residual) * weight,
    x + residual)``, with stock ``F.rms_norm`` (weight applied inside it, before its rounding)."""
    total = x + residual
    return F.rms_norm(total, tuple(weight.shape), weight, eps), total


def silu_and_mul(x: Tensor) -> Tensor:
    """vLLM's SwiGLU activation as its ``SiluAndMul.forward_native`` writes it:
    ``silu(x[..., :h]) * x[..., h:]`` with ``h = x.shape[-1] // 2`` (16-bit: silu rounded to the
    input dtype before the product)."""
    h = x.shape[-1] // 2
    return F.silu(x[..., :h]) * x[..., h:]


def gelu_and_mul(x: Tensor, approximate: str = "none") -> Tensor:
    """vLLM's GeGLU activation (``GeluAndMul.forward_native``):
    ``gelu(x[..., :h]) * x[..., h:]``."""
    h = x.shape[-1] // 2
    return F.gelu(x[..., :h], approximate=approximate) * x[..., h:]


def fused_add_rms_norm(
    x: Tensor, residual: Tensor, weight: Tensor, eps: float = 1e-6
) -> tuple[Tensor, Tensor]:
    """vLLM's ``fused_add_rms_norm``, in place: ``residual <- x + residual``, then
    ``x <- rms_norm(residual) * weight``; returns the two mutated tensors ``(x, residual)``."""
    residual.add_(x)
    x.copy_(F.rms_norm(residual, tuple(weight.shape), weight, eps))
    return x, residual


def varlen_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens: Tensor,
    scale: float | None = None,
    causal: bool = True,
) -> Tensor:
    """Attention over sequences packed by ``cu_seqlens``; q (T, H, D), k/v (T, Hkv, D).

    Deliberately the shape of real varlen kernels: every sequence is padded to the longest one and
    one ``scaled_dot_product_attention`` call runs with a boolean mask, so the tiling (and thus the
    rounding) is chosen by the longest sequence in the batch. Query head h reads kv head
    h // (H // Hkv). Output (T, H, Dv) in q's dtype.
    """
    bounds = check_varlen_args(q, k, v, cu_seqlens)
    tokens, heads, _ = q.shape
    lengths = [b - a for a, b in itertools.pairwise(bounds)]
    longest = max(lengths, default=0)
    if tokens == 0 or longest == 0:
        return q.new_zeros((tokens, heads, v.shape[2]))
    count = len(lengths)
    seq = torch.repeat_interleave(torch.arange(count), torch.tensor(lengths))
    pos = torch.arange(tokens) - torch.tensor(bounds[:-1])[seq]

    def pad(t: Tensor) -> Tensor:
        padded = t.new_zeros((count, longest, *t.shape[1:]))
        padded[seq, pos] = t
        return padded.transpose(1, 2)  # (B, heads, L, D)

    group = heads // k.shape[1]
    qp = pad(q)
    kp = pad(k).repeat_interleave(group, dim=1)
    vp = pad(v).repeat_interleave(group, dim=1)
    index = torch.arange(longest)
    valid = index[None, :] < torch.tensor(lengths)[:, None]  # (B, L) real keys
    mask = valid[:, None, None, :].expand(count, 1, longest, longest)
    if causal:
        mask = mask & (index[None, :] <= index[:, None])
    # A padded query row of an empty sequence would have no key: give it one, its output is dropped.
    mask = mask | ~valid.any(dim=1)[:, None, None, None]
    out = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=mask, scale=scale)
    return out.transpose(1, 2)[seq, pos].to(q.dtype)


def mixed_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    scale: float | None = None,
    causal: bool = True,
) -> Tensor:
    """Attention over a mixed batch, as ``flash_attn_varlen_func`` takes it: sequence b has
    ``Lk_b`` keys (a cached prefix plus its new tokens) and its last ``Lq_b`` tokens as queries
    (a prefill: Lq = Lk; a prefill chunk: 0 < Lq < Lk; a decode step: Lq = 1). q (Tq, H, D),
    k/v (Tk, Hkv, D); causal aligns the mask to the end: query i sees keys j <= Lk - Lq + i.

    Deliberately the shape of real varlen kernels, like ``varlen_attention``: queries and keys
    are padded to the batch's longest and one ``scaled_dot_product_attention`` call runs with a
    boolean mask, so the tiling is chosen by the longest sequences. Output (Tq, H, Dv) in q's
    dtype."""
    bq, bk = check_mixed_args(q, k, v, cu_seqlens_q, cu_seqlens_k, causal)
    tokens, heads, _ = q.shape
    lq = [b - a for a, b in itertools.pairwise(bq)]
    lk = [b - a for a, b in itertools.pairwise(bk)]
    count, long_q, long_k = len(lq), max(lq, default=0), max(lk, default=0)
    if tokens == 0 or long_k == 0:
        return q.new_zeros((tokens, heads, v.shape[2]))

    def pad(t: Tensor, bounds: list[int], lengths: list[int], longest: int) -> Tensor:
        seq = torch.repeat_interleave(torch.arange(count), torch.tensor(lengths))
        pos = torch.arange(t.shape[0]) - torch.tensor(bounds[:-1])[seq]
        padded = t.new_zeros((count, longest, *t.shape[1:]))
        padded[seq, pos] = t
        return padded.transpose(1, 2)  # (B, heads, L, D)

    group = heads // k.shape[1]
    qp = pad(q, bq, lq, long_q)
    kp = pad(k, bk, lk, long_k).repeat_interleave(group, dim=1)
    vp = pad(v, bk, lk, long_k).repeat_interleave(group, dim=1)
    i, j = torch.arange(long_q)[:, None], torch.arange(long_k)[None, :]
    kl, ql = torch.tensor(lk)[:, None, None], torch.tensor(lq)[:, None, None]
    mask = j[None] < kl  # (B, Lq, Lk) real keys
    if causal:
        mask = mask & (j[None] <= kl - ql + i[None])
    mask = mask | ~mask.any(-1, keepdim=True)  # a padded query row: one key, its output dropped
    out = F.scaled_dot_product_attention(qp, kp, vp, attn_mask=mask[:, None], scale=scale)
    seq = torch.repeat_interleave(torch.arange(count), torch.tensor(lq))
    pos = torch.arange(tokens) - torch.tensor(bq[:-1])[seq]
    return out.transpose(1, 2)[seq, pos].to(q.dtype)


# -- inference ops -------------------------------------------------------------------------


def rotary_embedding(
    positions: Tensor,
    query: Tensor,
    key: Tensor,
    head_size: int,
    cos_sin_cache: Tensor,
    is_neox: bool = True,
) -> tuple[Tensor, Tensor]:
    """vLLM's rotary embedding (``RotaryEmbedding.forward_native``), returning new tensors.

    positions (T,) int64; query (T, H * head_size), key (T, Hkv * head_size); cos_sin_cache
    (max_position, rot_dim) holds cos in its first rot_dim / 2 columns and sin in the rest. The
    first rot_dim elements of each head are rotated (neox: the two halves; gpt-j: interleaved
    pairs), the rest pass through. As in vLLM, the arithmetic runs in the operands' dtype (a
    16-bit query rounds each product in 16 bits)."""
    cos_sin = cos_sin_cache.index_select(0, positions)
    cos, sin = cos_sin.chunk(2, dim=-1)

    def rotate(x: Tensor) -> Tensor:
        shape = x.shape
        x = x.reshape(x.shape[0], x.shape[1] // head_size, head_size)
        rot_dim = cos_sin_cache.shape[-1]
        rot, rest = x[..., :rot_dim], x[..., rot_dim:]
        c, s = cos.unsqueeze(-2).to(x.dtype), sin.unsqueeze(-2).to(x.dtype)
        if is_neox:
            x1, x2 = torch.chunk(rot, 2, dim=-1)
        else:
            x1, x2 = rot[..., ::2], rot[..., 1::2]
        o1 = x1 * c - x2 * s
        o2 = x2 * c + x1 * s
        out = torch.cat((o1, o2), dim=-1) if is_neox else torch.stack((o1, o2), dim=-1).flatten(-2)
        return torch.cat((out, rest), dim=-1).reshape(shape)

    return rotate(query), rotate(key)


def top_k(logits: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The k largest logits of each row and their indices, descending (``torch.topk`` with
    sorted=True), ties to the lowest index: a stable descending sort, then the first k.
    ``torch.topk`` itself is not the stock entry point because its CPU kernel orders ties
    otherwise (measured, torch 2.13: not by index)."""
    values, indices = torch.sort(logits, dim=-1, descending=True, stable=True)
    return values[..., :k], indices[..., :k]


def fused_moe(
    hidden_states: Tensor,
    w1: Tensor,
    w2: Tensor,
    gating_output: Tensor,
    topk: int,
    renormalize: bool = True,
) -> Tensor:
    """A fused MoE block as engines compose it from torch ops (vLLM's ``fused_moe`` contract).

    hidden_states (T, H); w1 (E, 2I, H) holds each expert's gate and up projections, w2 (E, H, I)
    its down projection; gating_output (T, E) the router logits. Each token goes to the topk
    experts with the largest logits (selected on the logits themselves, as vLLM's CPU router does;
    ties to the lowest expert index: a stable descending sort), weighted by the softmax of its
    logits (renormalize: over the selected ones; else over all E, then picked). An expert computes
    ``w2[e] @ silu_and_mul(w1[e] @ x)``; the block returns the weighted sum, in x's dtype.

    As in engines, tokens are grouped by expert and each expert runs one GEMM over its tokens: the
    M of every GEMM depends on the whole batch (the batch variance of stock ``mm``). Everything
    runs in float32 (16-bit operands upcast exactly, as vLLM's CPU kernels accumulate; a 16-bit
    intermediate would overflow float16 at ordinary sizes) and is rounded once to x's dtype; each
    token's expert outputs are added in ascending expert order."""
    tokens = hidden_states.shape[0]
    inter = w2.shape[-1]
    cd = torch.promote_types(hidden_states.dtype, torch.float32)
    logits = gating_output.to(cd)
    ranked, order = torch.sort(logits, dim=-1, descending=True, stable=True)
    ids = order[:, :topk]
    if renormalize:
        weights = torch.softmax(ranked[:, :topk], dim=-1)
    else:
        weights = torch.softmax(logits, dim=-1).gather(1, ids)
    out = torch.zeros((tokens, hidden_states.shape[1]), dtype=cd)
    for expert in range(w1.shape[0]):
        token, slot = (ids == expert).nonzero(as_tuple=True)
        if token.numel() == 0:
            continue
        h = hidden_states[token].to(cd) @ w1[expert].to(cd).t()
        act = F.silu(h[:, :inter]) * h[:, inter:]
        y = act @ w2[expert].to(cd).t()
        out.index_add_(0, token, y * weights[token, slot].unsqueeze(-1))
    return out.to(hidden_states.dtype)


# -- quantized linear (dynamic per-token activation scales) --------------------------------------

QUANT_QMAX = {"int8": 127.0, "float8_e4m3fn": 448.0}
"""The largest quantized magnitude of each ``qdtype`` (int8 symmetric: 127; e4m3fn: 448)."""
QUANT_SCALE_FLOOR = 2.0**-126
"""The smallest scale (float32's smallest normal): a zero row (or one so small that amax / QMAX
underflows) is quantized with it, to zeros (or exact multiples of it), never divided by 0."""
QUANT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def check_quant_args(x: Tensor, weight: Tensor, qdtype: str) -> None:
    """The contract shared by the stock composite and the kernel: x (M, K) and weight (N, K) of
    one dtype among float32, bfloat16 and float16, qdtype int8 or float8_e4m3fn."""
    torch._check(
        qdtype in QUANT_QMAX,
        lambda: f"quant_linear: qdtype must be one of {list(QUANT_QMAX)}, got {qdtype!r}",
    )
    torch._check(
        x.dim() == 2 and weight.dim() == 2 and x.shape[1] == weight.shape[1],
        lambda: (
            f"quant_linear: x must be (M, K) and weight (N, K), got {tuple(x.shape)} and"
            f" {tuple(weight.shape)}"
        ),
    )
    torch._check(
        x.dtype == weight.dtype and x.dtype in QUANT_DTYPES,
        lambda: (
            f"quant_linear: x and weight must share a dtype among float32, bfloat16, float16,"
            f" got {x.dtype} and {weight.dtype}"
        ),
    )


def quantize_rows(x: Tensor, qdtype: str) -> tuple[Tensor, Tensor]:
    """Dynamic symmetric quantization of each row on its own: (q, scale), q float32 holding the
    quantized values, scale (rows, 1) float32. scale = max(amax(|row|) / QMAX, 2^-126) in float32;
    q = x / scale in float32 (one correctly rounded division), then int8: rounded half to even and
    clamped to [-127, 127]; e4m3fn: clamped to [-448, 448] (saturating) and cast to
    float8_e4m3fn (round to nearest even). Every step is per row: batch-invariant."""
    qmax = QUANT_QMAX[qdtype]
    x32 = x.to(torch.float32)
    if x32.shape[-1] == 0:
        amax = x32.new_zeros((x32.shape[0], 1))
    else:
        amax = x32.abs().amax(dim=-1, keepdim=True)
    scale = torch.clamp_min(amax / qmax, QUANT_SCALE_FLOOR)  # NaN stays NaN
    scaled = x32 / scale
    if qdtype == "int8":
        q = torch.clamp(torch.round(scaled), -qmax, qmax)
    else:
        q = torch.clamp(scaled, -qmax, qmax).to(torch.float8_e4m3fn).to(torch.float32)
    return q, scale


def quant_linear(x: Tensor, weight: Tensor, qdtype: str = "int8") -> Tensor:
    """A W8A8 linear as engines compose it from torch ops: x (M, K) quantized per token
    (``quantize_rows``: a dynamic scale per row), weight (N, K) per output channel the same way,
    then the dequantized operands multiplied with ``torch.mm`` in float32,
    ``(q_x s_x) @ (q_w s_w)^T``, rounded to x's dtype. The scales are per row, so the
    quantization is batch-invariant; the float32 GEMM is not (its blocking depends on M, as stock
    ``mm``'s). A per-tensor activation scale (amax over the whole batch) would make the
    quantization itself batch-variant: that is the bug class, not this composite."""
    check_quant_args(x, weight, qdtype)
    qx, sx = quantize_rows(x, qdtype)
    qw, sw = quantize_rows(weight, qdtype)
    return torch.mm(qx * sx, (qw * sw).t()).to(x.dtype)


# -- paged KV-cache decode attention ------------------------------------------------------------

SPLIT_MIN_TOKENS = 16
"""The stock split-KV decode splits the keys once the batch's longest context exceeds this."""
MAX_SPLITS = 8


def paged_decode_attention(
    query: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_table: Tensor,
    seq_lens: Tensor,
    scale: float | None = None,
) -> Tensor:
    """One decode step of attention over a paged KV cache, flash-decoding style (split-KV).

    query (B, H, D): each sequence's decode token; k_cache, v_cache (num_blocks, block_size,
    Hkv, D); block_table (B, max_blocks): sequence b's i-th block of keys is pool block
    block_table[b, i]; seq_lens (B,): its number of keys. Query head h reads kv head
    h // (H // Hkv). Returns (B, H, D) in query's dtype, computed in float32.

    Deliberately the shape of real decode kernels: the keys are cut into
    ``min(MAX_SPLITS, ceil(max_len / SPLIT_MIN_TOKENS))`` splits of ``ceil(max_len / splits)``
    tokens, where max_len is the batch's longest context; each split gets its own max, exp-sum
    and partial P @ V, and the splits are combined by rescaling with exp(m_split - m). So how a
    sequence's keys are grouped (and its rounding) depends on the longest sequence it is
    batched with.
    """
    lengths = check_paged_args(query, k_cache, v_cache, block_table, seq_lens)
    batch, heads, head_dim = query.shape
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    if scale is None:
        scale = 1.0 / math.sqrt(head_dim)
    longest = max(lengths, default=0)
    if batch == 0 or longest == 0:
        return query.new_zeros((batch, heads, v_cache.shape[3]))
    splits = min(MAX_SPLITS, -(-longest // SPLIT_MIN_TOKENS))
    chunk = -(-longest // splits)
    padded = splits * chunk
    blocks = -(-padded // block_size)
    table = block_table[:, : min(blocks, block_table.shape[1])].long()
    if table.shape[1] < blocks:  # the padding reads block 0: masked below
        table = torch.cat((table, table.new_zeros((batch, blocks - table.shape[1]))), dim=1)
    group = heads // kv_heads

    def gather(cache: Tensor) -> Tensor:  # (B, H, splits, chunk, D), float32
        t = cache[table].reshape(batch, blocks * block_size, kv_heads, -1)[:, :padded]
        t = t.float().repeat_interleave(group, dim=2).permute(0, 2, 1, 3)
        return t.reshape(batch, heads, splits, chunk, t.shape[-1])

    keys, values = gather(k_cache), gather(v_cache)
    q = query.float()[:, :, None, None, :]
    scores = (q * keys).sum(-1) * scale  # (B, H, splits, chunk)
    position = torch.arange(padded).reshape(splits, chunk)
    valid = position[None] < torch.tensor(lengths)[:, None, None]  # (B, splits, chunk)
    scores = torch.where(valid[:, None], scores, float("-inf"))
    m_split = scores.amax(-1)  # -inf for a split past the sequence's end
    safe = torch.where(torch.isfinite(m_split), m_split, 0.0)
    p = torch.exp(scores - safe[..., None])  # exactly 0 where masked
    l_split = p.sum(-1)
    o_split = torch.einsum("bhsc,bhscd->bhsd", p, values)
    m = m_split.amax(-1, keepdim=True)
    w = torch.where(torch.isfinite(m_split), torch.exp(m_split - m), 0.0)
    out = (w[..., None] * o_split).sum(2) / (w * l_split).sum(2)[..., None]
    return out.to(query.dtype)


# -- sampling ------------------------------------------------------------------------------------


def sample(
    logits: Tensor,
    temperature: Tensor,
    top_k: Tensor,
    top_p: Tensor,
    min_p: Tensor,
    greedy: Tensor,
    noise: Tensor,
) -> tuple[Tensor, Tensor]:
    """A seeded sampler as engines compose it from batched torch ops, per-row parameters.

    logits (R, V); temperature, top_p, min_p float32 (R,); top_k int64 (R,) (0 or >= V: off);
    greedy bool (R,); noise float32 (R, V) uniforms in (0, 1). Greedy rows: the first index of
    the largest logit, logprobs log_softmax(logits). Sampled rows: z = logits / T; top-k keeps
    every logit >= the k-th largest (ties kept); top-p keeps a logit when the probability of the
    logits strictly above it is < p (a sort and a cumsum over the whole batch); min-p keeps
    probabilities >= min_p times the largest; logprobs the log_softmax over the kept set (-inf
    elsewhere); the id the exponential race argmax(probs / -log(u)) over the kept set (vLLM's
    random_sample). Returns (ids int64 (R,), logprobs float32 (R, V))."""
    x = logits.float()
    rows, vocab = x.shape
    if rows == 0 or vocab == 0:
        return torch.zeros(rows, dtype=torch.int64), torch.zeros((rows, vocab))
    z = x / temperature.float()[:, None]
    ranked, order = torch.sort(x, dim=-1, descending=True, stable=True)
    k = top_k.clamp(min=1, max=vocab)
    kth = ranked.gather(1, (k - 1)[:, None])
    keep = (x >= kth) | ((top_k <= 0) | (top_k >= vocab))[:, None]
    probs = torch.softmax(z.masked_fill(~keep, float("-inf")), dim=-1)
    sorted_probs = probs.gather(1, order)
    before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    starts = torch.ones_like(ranked, dtype=torch.bool)
    starts[:, 1:] = ranked[:, 1:] != ranked[:, :-1]
    index = torch.arange(vocab).expand(rows, vocab)
    first = torch.cummax(torch.where(starts, index, torch.zeros_like(index)), dim=1).values
    mass = torch.empty_like(before).scatter_(1, order, before.gather(1, first))
    keep &= (mass < top_p[:, None]) | (top_p >= 1.0)[:, None]
    top = probs.amax(dim=-1, keepdim=True)
    keep &= (probs >= min_p[:, None] * top) | (min_p <= 0.0)[:, None]
    kept = z.masked_fill(~keep, float("-inf"))
    logprobs = torch.log_softmax(kept, dim=-1)
    race = torch.softmax(kept, dim=-1) / -torch.log(noise)
    ids = torch.where(greedy, x.argmax(dim=-1), race.argmax(dim=-1))
    logprobs = torch.where(greedy[:, None], torch.log_softmax(x, dim=-1), logprobs)
    return ids, logprobs
