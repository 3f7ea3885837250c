"""Planted library, bug class *attention that splits the keys once the batch's longest
sequence passes 512 tokens*.

Varlen attention (``bi_props.ops.varlen_attention``'s contract) computed sequence by sequence
in float32: one pass (max, exp-sum, P @ V) over each sequence's keys, batch-invariant, until the
batch's longest sequence passes LONG tokens; then every sequence's keys are cut into chunks of
CHUNK tokens reduced on their own and combined by their rescaled sums (split-KV), which rounds
otherwise for a query that sees more than one chunk. Both are within the reference bound. The
cpu profile's small draws stop at 32 tokens: only a long needle (past CHUNK keys) beside a
companion past LONG shows it. Expected finding: attention batch_invariance [enabled].
"""

from __future__ import annotations

import itertools

import torch

import bi_props.ops as ops

NAMESPACE = "planted_long_split_attention"
OPS = ["attention"]
KERNEL_PREFIX = f"{NAMESPACE}::"
_STOCK = ops.varlen_attention
FLOATS = (torch.float32, torch.bfloat16, torch.float16)
LONG = 512
CHUNK = 256


def attend(qs, ks, vs, scale: float, causal: bool, chunk: int | None) -> torch.Tensor:
    """One sequence: qs (heads, Lq, D), ks, vs (heads, Lk, D) in float32; keys in chunks of
    ``chunk`` (None: one pass)."""
    lq, lk = qs.shape[1], ks.shape[1]
    scores = qs @ ks.transpose(1, 2) * scale
    if causal:
        future = torch.arange(lk)[None, :] > lk - lq + torch.arange(lq)[:, None]
        scores = scores.masked_fill(future, float("-inf"))
    size = lk if chunk is None else chunk
    parts = []
    for lo in range(0, lk, size):
        s = scores[..., lo : lo + size]
        m = s.amax(-1, keepdim=True)
        safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
        p = torch.exp(s - safe)
        parts.append((m, p.sum(-1, keepdim=True), p @ vs[:, lo : lo + size]))
    if len(parts) == 1:
        _, norm, o = parts[0]
        return o / norm
    top = torch.stack([m for m, _, _ in parts]).amax(0)
    num, den = torch.zeros_like(parts[0][2]), torch.zeros_like(parts[0][1])
    for m, norm, o in parts:
        w = torch.where(torch.isfinite(m), torch.exp(m - top), torch.zeros_like(m))
        num, den = num + w * o, den + w * norm
    return num / den


def varlen_attention(q, k, v, cu_seqlens, scale=None, causal=True):
    if q.dtype not in FLOATS or k.dtype != q.dtype or v.dtype != q.dtype:
        return _STOCK(q, k, v, cu_seqlens, scale, causal)
    bounds = ops.check_varlen_args(q, k, v, cu_seqlens)
    heads, head_dim = q.shape[1], q.shape[2]
    scale = head_dim**-0.5 if scale is None else scale
    group = heads // k.shape[1]
    longest = max((b - a for a, b in itertools.pairwise(bounds)), default=0)
    chunk = CHUNK if longest > LONG else None  # BUG: split-KV chosen by the batch's longest
    out = q.new_zeros((q.shape[0], heads, v.shape[2]))
    for a, b in itertools.pairwise(bounds):
        if b == a:
            continue
        qs = q[a:b].float().transpose(0, 1)
        ks = k[a:b].float().repeat_interleave(group, dim=1).transpose(0, 1)
        vs = v[a:b].float().repeat_interleave(group, dim=1).transpose(0, 1)
        out[a:b] = attend(qs, ks, vs, scale, causal, chunk).transpose(0, 1).to(q.dtype)
    return out


def evidence(op: str) -> dict[str, bool]:
    return {"bi_props.ops.varlen_attention swapped": ops.varlen_attention is varlen_attention}


def enable(enabled: bool) -> None:
    if enabled:
        ops.varlen_attention = varlen_attention
