"""Batch-invariant decode attention over a paged KV cache (block table, grouped KV heads).

Each sequence is computed from its own keys only: its blocks are gathered by ``index_select``
(data movement) and cut to its length, so no other sequence, no batch size and no longest context
can reach its arithmetic, and slots it does not own are never read. Scores are ``matmul_tree``
products (a tree over head_dim), softmax is ``softmax_core`` (tree max, the package's exp, a tree
sum over the sequence's length) and P @ V a tree over that length: every tree is a function of the
sequence's own length and head_dim. Where its blocks sit in the pool changes nothing either.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .normalization import softmax_core
from .primitives import compute_dtype, matmul_tree


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


@torch.no_grad()
def paged_decode_attention(
    query: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    block_table: Tensor,
    seq_lens: Tensor,
    scale: float | None = None,
) -> Tensor:
    """softmax(scale q k^T) v for each sequence's decode query over its own keys, gathered from
    its blocks; query (B, H, D), caches (num_blocks, block_size, Hkv, D); output (B, H, D)."""
    lengths = check_paged_args(query, k_cache, v_cache, block_table, seq_lens)
    batch, heads, head_dim = query.shape
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = heads // kv_heads
    if scale is None:
        scale = 1.0 / math.sqrt(head_dim)
    cd = compute_dtype(query.dtype)
    out = torch.zeros((batch, heads, v_cache.shape[3]), dtype=cd, device=query.device)
    head_map = torch.arange(heads, device=query.device) // group  # head h reads kv head h // g
    for b, length in enumerate(lengths):
        blocks = block_table[b, : -(-length // block_size)].long()

        def own(cache: Tensor, blocks: Tensor = blocks, length: int = length) -> Tensor:
            """This sequence's keys (or values), (length, H, D) in the compute dtype."""
            tokens = cache.index_select(0, blocks).reshape(-1, kv_heads, cache.shape[3])
            return tokens[:length].to(cd).index_select(1, head_map)

        q = query[b].to(cd).unsqueeze(1)  # (H, 1, D)
        keys = own(k_cache).permute(1, 2, 0)  # (H, D, L)
        values = own(v_cache).permute(1, 0, 2)  # (H, L, Dv)
        scores = matmul_tree(q, keys) * scale  # (H, 1, L)
        probs = softmax_core(scores, -1)
        out[b] = matmul_tree(probs, values).squeeze(1)
    return out.to(query.dtype)
