"""Planted library, bug class *a split of each sequence's keys chosen from the batch's longest
sequence* (split-KV / flash-decoding: the number of key splits comes from the longest context
in the batch, so how a sequence's keys are grouped depends on its companions).

A mixed-batch attention (``bi_props.ops.mixed_attention``'s contract) in float32 that cuts every
sequence's keys into chunks of ``chunk(longest)`` tokens, ``splits(longest) = min(MAX_SPLITS,
ceil(longest / SPLIT_MIN))`` of them across the batch's longest key length, reduces each chunk
on its own (max, exp-sum, P @ V) and combines the chunks by their rescaled sums: correct in any
split, but a sequence whose keys span more chunks inside the batch than alone is rounded
otherwise. Expected finding: mixed_attention batch_invariance [enabled], shrunk to a needle of
more than ``chunk(longest)`` keys beside a companion longer than SPLIT_MIN.
"""

from __future__ import annotations

import itertools

import torch

import bi_props.ops as ops

NAMESPACE = "planted_split_by_longest"
OPS = ["mixed_attention"]
KERNEL_PREFIX = f"{NAMESPACE}::"
_STOCK = ops.mixed_attention
FLOATS = (torch.float32, torch.bfloat16, torch.float16)
"""Other dtypes (parity draws float64, integers, complex) go to the stock composite: the planted
bug is the batch variance, not a changed contract."""
SPLIT_MIN = 8
MAX_SPLITS = 8


def splits(longest: int) -> int:
    return max(1, min(MAX_SPLITS, -(-longest // SPLIT_MIN)))


def chunk(longest: int) -> int:
    """Keys per split for a batch whose longest sequence has ``longest`` keys."""
    return max(1, -(-longest // splits(longest)))


def mixed_attention(q, k, v, cu_seqlens_q, cu_seqlens_k, scale=None, causal=True):
    if q.dtype not in FLOATS or k.dtype != q.dtype or v.dtype != q.dtype:
        return _STOCK(q, k, v, cu_seqlens_q, cu_seqlens_k, scale, causal)
    bq, bk = ops.check_mixed_args(q, k, v, cu_seqlens_q, cu_seqlens_k, causal)
    heads, head_dim = q.shape[1], q.shape[2]
    scale = head_dim**-0.5 if scale is None else scale
    group = heads // k.shape[1]
    # BUG: the split size comes from the batch's longest sequence
    size = chunk(max((b - a for a, b in itertools.pairwise(bk)), default=0))
    out = q.new_zeros((q.shape[0], heads, v.shape[2]))
    for (qa, qb), (ka, kb) in zip(itertools.pairwise(bq), itertools.pairwise(bk), strict=True):
        lq, lk = qb - qa, kb - ka
        if lq == 0 or lk == 0:
            continue
        qs = q[qa:qb].float().transpose(0, 1)  # (heads, Lq, D)
        ks = k[ka:kb].float().repeat_interleave(group, dim=1).transpose(0, 1)
        vs = v[ka:kb].float().repeat_interleave(group, dim=1).transpose(0, 1)
        scores = qs @ ks.transpose(1, 2) * scale  # (heads, Lq, Lk)
        if causal:
            future = torch.arange(lk)[None, :] > lk - lq + torch.arange(lq)[:, None]
            scores = scores.masked_fill(future, float("-inf"))
        parts = []
        for lo in range(0, lk, size):
            s = scores[..., lo : lo + size]
            m = s.amax(-1, keepdim=True)
            safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
            p = torch.exp(s - safe)
            parts.append((m, p.sum(-1, keepdim=True), p @ vs[:, lo : lo + size]))
        top = torch.stack([m for m, _, _ in parts]).amax(0)
        num = torch.zeros_like(parts[0][2])
        den = torch.zeros_like(parts[0][1])
        for m, norm, o in parts:
            w = torch.where(torch.isfinite(m), torch.exp(m - top), torch.zeros_like(m))
            num = num + w * o
            den = den + w * norm
        out[qa:qb] = (num / den).transpose(0, 1).to(q.dtype)
    return out


def evidence(op: str) -> dict[str, bool]:
    return {"bi_props.ops.mixed_attention swapped": ops.mixed_attention is mixed_attention}


def enable(enabled: bool) -> None:
    if enabled:
        ops.mixed_attention = mixed_attention
