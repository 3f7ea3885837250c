"""Batch-invariant attention over packed variable-length sequences (grouped KV heads)."""

from __future__ import annotations

import itertools
import math

import torch
from torch import Tensor

from ...ops import check_mixed_args, check_varlen_args
from .normalization import softmax_core
from .primitives import compute_dtype, matmul_tree
from .route import KernelRoute


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


@torch.no_grad()
def mixed_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    scale: float | None = None,
    causal: bool = True,
) -> Tensor:
    """Batch-invariant mixed-batch attention (``bi_props.ops.mixed_attention``'s contract): each
    sequence's last Lq tokens attend its Lk keys, the causal mask aligned to the end.

    As ``varlen_attention``: each sequence from its own rows only, ``matmul_tree`` scores (a tree
    over head_dim, per query row), the own softmax over the sequence's keys, P @ V a tree over
    its keys; nothing depends on the other sequences, their kinds or the batch's longest."""
    bq, bk = check_mixed_args(q, k, v, cu_seqlens_q, cu_seqlens_k, causal)
    tokens, heads, head_dim = q.shape
    group = heads // k.shape[1]
    if scale is None:
        scale = 1.0 / math.sqrt(head_dim)
    cd = compute_dtype(q.dtype)
    out = torch.zeros((tokens, heads, v.shape[2]), dtype=cd, device=q.device)
    head_map = torch.arange(heads, device=q.device) // group
    for (qa, qb), (ka, kb) in zip(itertools.pairwise(bq), itertools.pairwise(bk), strict=True):
        lq, lk = qb - qa, kb - ka
        if lq == 0:
            continue
        if lk == 0:  # no key at all (only without causal): nothing to attend, zeros
            continue
        qs = q[qa:qb].to(cd).permute(1, 0, 2)  # (H, Lq, D)
        ks = k[ka:kb].to(cd).index_select(1, head_map).permute(1, 2, 0)  # (H, D, Lk)
        vs = v[ka:kb].to(cd).index_select(1, head_map).permute(1, 0, 2)  # (H, Lk, Dv)
        scores = matmul_tree(qs, ks) * scale  # (H, Lq, Lk)
        if causal:
            i = torch.arange(lq, device=q.device)[:, None]
            j = torch.arange(lk, device=q.device)[None, :]
            future = j > lk - lq + i  # key j after query i's own token
            scores = torch.where(future, torch.full_like(scores, float("-inf")), scores)
        probs = softmax_core(scores, -1)
        out[qa:qb] = matmul_tree(probs, vs).permute(1, 0, 2)
    return out.to(q.dtype)


ROUTES = (
    KernelRoute(
        "varlen_attention(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens, float? scale=None,"
        " bool causal=True) -> Tensor",
        varlen_attention,
        ops=("attention",),
        composite="varlen_attention",
    ),
    KernelRoute(
        "mixed_attention(Tensor q, Tensor k, Tensor v, Tensor cu_seqlens_q, Tensor cu_seqlens_k,"
        " float? scale=None, bool causal=True) -> Tensor",
        mixed_attention,
        ops=("mixed_attention",),
        composite="mixed_attention",
    ),
)
"""The kernels of this module and how the switch routes to them (route.py)."""
