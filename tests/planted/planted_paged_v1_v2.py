"""Planted library, bug class *a paged decode kernel chosen from the batch's longest context*
(vLLM's paged attention v1 or v2: v2 cuts each context into partitions of 512 tokens and
combines them; which one runs depends on the batch's longest sequence).

Paged decode (``bi_props.ops.paged_decode_attention``'s contract) computed sequence by sequence
in float32: v1 (softmax probabilities first, then P @ V) while the batch's longest context is at
most PARTITION tokens, v2 (unnormalised P @ V per partition of PARTITION tokens, combined, then
divided) past it. Each is batch-invariant and within the reference bound; a needle beside a
companion longer than PARTITION rounds otherwise than alone. The cpu profile's small draws stop
at 512 tokens of context. Expected finding: paged_decode_attention batch_invariance [enabled].
"""

from __future__ import annotations

import math

import torch

import bi_props.ops as ops

NAMESPACE = "planted_paged_v1_v2"
OPS = ["paged_decode_attention"]
KERNEL_PREFIX = f"{NAMESPACE}::"
_STOCK = ops.paged_decode_attention
FLOATS = (torch.float32, torch.bfloat16, torch.float16)
PARTITION = 512


def paged_decode_attention(query, k_cache, v_cache, block_table, seq_lens, scale=None):
    if query.dtype not in FLOATS or k_cache.dtype != query.dtype or v_cache.dtype != query.dtype:
        return _STOCK(query, k_cache, v_cache, block_table, seq_lens, scale)
    lengths = ops.check_paged_args(query, k_cache, v_cache, block_table, seq_lens)
    heads, head_dim = query.shape[1], query.shape[2]
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    group = heads // kv_heads
    v2 = max(lengths, default=0) > PARTITION  # BUG: the kernel chosen by the batch's longest
    out = query.new_zeros((query.shape[0], heads, v_cache.shape[3]))
    for b, n in enumerate(lengths):
        if n == 0:
            continue
        table = block_table[b, : -(-n // block_size)].long()
        keys = k_cache[table].reshape(-1, kv_heads, head_dim)[:n].float()
        values = v_cache[table].reshape(-1, kv_heads, v_cache.shape[3])[:n].float()
        keys = keys.repeat_interleave(group, dim=1).transpose(0, 1)  # (heads, n, D)
        values = values.repeat_interleave(group, dim=1).transpose(0, 1)
        scores = (keys @ query[b].float()[:, :, None])[..., 0] * scale  # (heads, n)
        if not v2:  # v1: probabilities, then P @ V
            p = torch.exp(scores - scores.amax(-1, keepdim=True))
            p = p / p.sum(-1, keepdim=True)
            out[b] = (p[:, None, :] @ values)[:, 0].to(query.dtype)
            continue
        num = den = top = None
        for lo in range(0, n, PARTITION):  # v2: partitions, combined, divided last
            s = scores[:, lo : lo + PARTITION]
            m = s.amax(-1, keepdim=True)
            p = torch.exp(s - m)
            o, norm = (
                (p[:, None, :] @ values[:, lo : lo + PARTITION])[:, 0],
                p.sum(-1, keepdim=True),
            )
            if top is None:
                num, den, top = o, norm, m
                continue
            new = torch.maximum(top, m)
            a, c = torch.exp(top - new), torch.exp(m - new)
            num, den, top = num * a + o * c, den * a + norm * c, new
        out[b] = (num / den).to(query.dtype)
    return out


def evidence(op: str) -> dict[str, bool]:
    return {
        "bi_props.ops.paged_decode_attention swapped": ops.paged_decode_attention
        is paged_decode_attention
    }


def enable(enabled: bool) -> None:
    if enabled:
        ops.paged_decode_attention = paged_decode_attention
