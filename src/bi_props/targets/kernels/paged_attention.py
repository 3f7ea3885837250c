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

from ...ops import check_paged_args
from .normalization import softmax_core
from .primitives import compute_dtype, matmul_tree
from .route import KernelRoute


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


ROUTES = (
    KernelRoute(
        "paged_decode_attention(Tensor query, Tensor k_cache, Tensor v_cache, Tensor block_table,"
        " Tensor seq_lens, float? scale=None) -> Tensor",
        paged_decode_attention,
        ops=("paged_decode_attention",),
        composite="paged_decode_attention",
    ),
)
"""The kernels of this module and how the switch routes to them (route.py)."""
