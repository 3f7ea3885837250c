"""Batch-invariant attention over packed variable-length sequences (grouped KV heads)."""

from __future__ import annotations

import itertools
import math

import torch
from torch import Tensor

from ...ops import check_varlen_args
from .normalization import softmax_core
from .primitives import compute_dtype, matmul_tree


@torch.no_grad()
def varlen_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens: Tensor,
    scale: float | None = None,
    causal: bool = True,
) -> Tensor:
    """Batch-invariant attention: q (T, H, D), k/v (T, Hkv, D), sequences packed by cu_seqlens.

    Each sequence is computed from its own rows only: scores are ``matmul_tree`` products (a tree
    over head_dim), softmax uses the own tree_max/exp/tree_sum over that sequence's keys, and P @ V
    is a tree over the sequence length. Those trees depend on the sequence's length and head_dim,
    never on the other sequences, their number or the padded maximum length.
    """
    bounds = check_varlen_args(q, k, v, cu_seqlens)
    tokens, heads, head_dim = q.shape
    group = heads // k.shape[1]
    if scale is None:
        scale = 1.0 / math.sqrt(head_dim)
    cd = compute_dtype(q.dtype)
    out = torch.zeros((tokens, heads, v.shape[2]), dtype=cd, device=q.device)
    head_map = torch.arange(heads, device=q.device) // group  # query head h reads kv head h // g
    for start, end in itertools.pairwise(bounds):
        length = end - start
        if length == 0:
            continue
        qs = q[start:end].to(cd).permute(1, 0, 2)  # (H, L, D)
        ks = k[start:end].to(cd).index_select(1, head_map).permute(1, 2, 0)  # (H, D, L)
        vs = v[start:end].to(cd).index_select(1, head_map).permute(1, 0, 2)  # (H, L, Dv)
        scores = matmul_tree(qs, ks) * scale  # (H, L, L)
        if causal:
            pos = torch.arange(length, device=q.device)
            future = pos[None, :] > pos[:, None]  # key j after query i
            scores = torch.where(future, torch.full_like(scores, float("-inf")), scores)
        probs = softmax_core(scores, -1)
        out[start:end] = matmul_tree(probs, vs).permute(1, 0, 2)
    return out.to(q.dtype)
