"""Batch-invariant rotary embedding (vLLM's ``rotary_embedding`` semantics, not in place).

Each output element is ``x1 * cos - x2 * sin`` (or ``x2 * cos + x1 * sin``) of its own token's
elements and its own position's cache row: two products and one subtraction, each a separate
correctly rounded float32 operation (no fused multiply-add in any path), then one rounding to the
output dtype. The cache row is gathered by ``index_select`` (data movement). So no element can see
the number of tokens or its place among them.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .primitives import compute_dtype
from .route import KernelRoute


def _check(positions: Tensor, query: Tensor, key: Tensor, head_size: int, cache: Tensor) -> int:
    torch._check(positions.dim() == 1, lambda: f"positions must be 1-D, got {positions.dim()}-D")
    torch._check(not positions.is_floating_point(), lambda: "positions must be an integer tensor")
    rot_dim = cache.shape[-1]
    torch._check(cache.dim() == 2, lambda: f"cos_sin_cache must be 2-D, got {cache.dim()}-D")
    torch._check(head_size > 0, lambda: f"head_size must be positive, got {head_size}")
    torch._check(
        rot_dim % 2 == 0 and rot_dim <= head_size,
        lambda: f"rot_dim {rot_dim} must be even and at most head_size {head_size}",
    )
    for name, x in (("query", query), ("key", key)):
        torch._check(
            x.dim() == 2 and x.shape[0] == positions.shape[0] and x.shape[1] % head_size == 0,
            lambda name=name, x=x: (
                f"{name} must be (tokens, heads * head_size), got"
                f" {list(x.shape)} for {positions.shape[0]} tokens and head_size {head_size}"
            ),
        )
    return rot_dim


def _rotate(x: Tensor, cos: Tensor, sin: Tensor, head_size: int, rot_dim: int, neox: bool):
    cd = compute_dtype(x.dtype)
    h = x.to(cd).reshape(x.shape[0], x.shape[1] // head_size, head_size)
    out = h.clone()
    c, s = cos.to(cd).unsqueeze(-2), sin.to(cd).unsqueeze(-2)
    half = rot_dim // 2
    if neox:
        x1, x2 = h[..., :half], h[..., half:rot_dim]
        out[..., :half] = x1 * c - x2 * s
        out[..., half:rot_dim] = x2 * c + x1 * s
    else:
        x1, x2 = h[..., 0:rot_dim:2], h[..., 1:rot_dim:2]
        out[..., 0:rot_dim:2] = x1 * c - x2 * s
        out[..., 1:rot_dim:2] = x2 * c + x1 * s
    return out.reshape(x.shape).to(x.dtype)


@torch.no_grad()
def rotary_embedding(
    positions: Tensor,
    query: Tensor,
    key: Tensor,
    head_size: int,
    cos_sin_cache: Tensor,
    is_neox: bool = True,
) -> tuple[Tensor, Tensor]:
    """(query, key) rotated per token by cos_sin_cache[positions]: cos in the cache's first
    rot_dim / 2 columns, sin in the rest; neox rotates the halves of each head's first rot_dim
    elements, gpt-j interleaved pairs; the rest of the head passes through unchanged."""
    rot_dim = _check(positions, query, key, head_size, cos_sin_cache)
    picked = cos_sin_cache.index_select(0, positions)
    cos, sin = picked[:, : rot_dim // 2], picked[:, rot_dim // 2 :]
    return (
        _rotate(query, cos, sin, head_size, rot_dim, is_neox),
        _rotate(key, cos, sin, head_size, rot_dim, is_neox),
    )


ROUTES = (
    KernelRoute(
        "rotary_embedding(Tensor positions, Tensor query, Tensor key, int head_size,"
        " Tensor cos_sin_cache, bool is_neox=True) -> (Tensor, Tensor)",
        rotary_embedding,
        ops=("rotary_embedding",),
        composite="rotary_embedding",
        data_argument=1,  # (positions, query, ...): the query decides
    ),
)
"""The kernels of this module and how the switch routes to them (route.py)."""
