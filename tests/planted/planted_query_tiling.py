"""Planted library, bug class *a path switch when any sequence in the batch has >= 10 query
tokens* (FlashAttention-3's tiling flip in vLLM: once the batch's longest query reaches 10
tokens, every row is reduced in another, equally correct, order).

A mixed-batch attention (``bi_props.ops.mixed_attention``'s contract) that computes each sequence
on its own rows, in float64 while every sequence of the call has fewer than THRESHOLD query
tokens and in float32 from then on. A decode token alone and the same token beside a 10-token
prefill then differ in their last bits. Expected finding: mixed_attention batch_invariance
[enabled], shrunk to a batch whose longest query has exactly THRESHOLD tokens.
"""

from __future__ import annotations

import itertools

import torch

import bi_props.ops as ops

NAMESPACE = "planted_query_tiling"
OPS = ["mixed_attention"]
KERNEL_PREFIX = f"{NAMESPACE}::"
_STOCK = ops.mixed_attention
FLOATS = (torch.float32, torch.bfloat16, torch.float16)
"""Other dtypes (parity draws float64, integers, complex) go to the stock composite: the planted
bug is the batch variance, not a changed contract."""
THRESHOLD = 10


def mixed_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, scale=None, causal=True):
    if q.dtype not in FLOATS or k.dtype != q.dtype or v.dtype != q.dtype:
        return _STOCK(q, k, v, cu_seqlens_q, cu_seqlens_k, scale, causal)
    bq, bk = ops.check_mixed_args(q, k, v, cu_seqlens_q, cu_seqlens_k, causal)
    heads, head_dim = q.shape[1], q.shape[2]
    scale = head_dim**-0.5 if scale is None else scale
    group = heads // k.shape[1]
    longest_q = max((b - a for a, b in itertools.pairwise(bq)), default=0)
    # BUG: the whole batch's path depends on its longest query
    acc = torch.float32 if longest_q >= THRESHOLD else torch.float64
    out = q.new_zeros((q.shape[0], heads, v.shape[2]))
    for (qa, qb), (ka, kb) in zip(itertools.pairwise(bq), itertools.pairwise(bk), strict=True):
        lq, lk = qb - qa, kb - ka
        if lq == 0 or lk == 0:
            continue
        qs = q[qa:qb].to(acc).transpose(0, 1)  # (heads, Lq, D)
        ks = k[ka:kb].to(acc).repeat_interleave(group, dim=1).transpose(0, 1)
        vs = v[ka:kb].to(acc).repeat_interleave(group, dim=1).transpose(0, 1)
        scores = qs @ ks.transpose(1, 2) * scale
        if causal:
            future = torch.arange(lk)[None, :] > lk - lq + torch.arange(lq)[:, None]
            scores = scores.masked_fill(future, float("-inf"))
        out[qa:qb] = (scores.softmax(dim=-1) @ vs).transpose(0, 1).to(q.dtype)
    return out


def evidence(op: str) -> dict[str, bool]:
    return {"bi_props.ops.mixed_attention swapped": ops.mixed_attention is mixed_attention}


def enable(enabled: bool) -> None:
    if enabled:
        ops.mixed_attention = mixed_attention
