"""Planted library, bug class *a path chosen from the number of sequences in the batch*.

The shape of split-KV heuristics keyed on batch x heads against the SM count, and of samplers
that change with the number of co-resident sequences: a varlen attention that computes each
sequence on its own (batch-invariant) while the batch holds fewer than THRESHOLD sequences, and
switches to a float32 path from THRESHOLD on. A sequence alone and the same sequence among nine
others then differ in their last bits. Expected finding: attention batch_invariance [enabled], the
minimal batch holding exactly THRESHOLD sequences. bi_props' batches held at most 8 sequences
before they aimed their number at thresholds: this library was out of reach.
"""

from __future__ import annotations

import itertools

import torch

import bi_props.ops as ops

NAMESPACE = "planted_sequence_count"
OPS = ["attention"]
KERNEL_PREFIX = f"{NAMESPACE}::"
THRESHOLD = 10


def varlen_attention(q, k, v, cu_seqlens, scale=None, causal=True):
    bounds = ops.check_varlen_args(q, k, v, cu_seqlens)
    tokens, heads, head_dim = q.shape
    scale = head_dim**-0.5 if scale is None else scale
    group = heads // k.shape[1]
    # BUG: the path depends on how many sequences share the call
    acc = torch.float32 if len(bounds) - 1 >= THRESHOLD else torch.float64
    out = q.new_zeros((tokens, heads, v.shape[2]))
    for start, end in itertools.pairwise(bounds):
        if end == start:
            continue
        qs = q[start:end].to(acc).transpose(0, 1)  # (heads, L, D)
        ks = k[start:end].to(acc).repeat_interleave(group, dim=1).transpose(0, 1)
        vs = v[start:end].to(acc).repeat_interleave(group, dim=1).transpose(0, 1)
        scores = qs @ ks.transpose(1, 2) * scale
        if causal:
            length = end - start
            future = torch.ones(length, length, dtype=torch.bool).triu(1)
            scores = scores.masked_fill(future, float("-inf"))
        out[start:end] = (scores.softmax(dim=-1) @ vs).transpose(0, 1).to(q.dtype)
    return out


def evidence(op: str) -> dict[str, bool]:
    return {"bi_props.ops.varlen_attention swapped": ops.varlen_attention is varlen_attention}


def enable(enabled: bool) -> None:
    if enabled:
        ops.varlen_attention = varlen_attention
