"""Planted library, bug class *rotary embedding rescaled from the batch's largest position*
(dynamic NTK and long-context rope variants rescale once a position passes the model's original
context; a kernel that reads that position from the whole batch couples the samples).

vLLM's rotary embedding (``bi_props.ops.rotary_embedding``'s contract) computed in float32 and
rounded once to the operands' dtype, batch-invariant, while every position of the batch is below
ORIGINAL; past it the cache's cos and sin are rescaled by a factor read from the batch's largest
position and the rotation divided by it again. Within the reference bound, but the rounding
depends on the largest position in the batch. The cpu profile's small draws keep positions below
4,096: only a deployment-size draw (positions past ORIGINAL) shows it. Expected finding:
rotary_embedding batch_invariance [enabled].
"""

from __future__ import annotations

import math

import torch

import bi_props.ops as ops

NAMESPACE = "planted_rope_rescaled"
OPS = ["rotary_embedding"]
KERNEL_PREFIX = f"{NAMESPACE}::"
_STOCK = ops.rotary_embedding
FLOATS = (torch.float32, torch.bfloat16, torch.float16)
ORIGINAL = 4096


def rotary_embedding(positions, query, key, head_size, cos_sin_cache, is_neox=True):
    if query.dtype not in FLOATS or positions.numel() == 0:
        return _STOCK(positions, query, key, head_size, cos_sin_cache, is_neox)
    largest = int(positions.max())
    # BUG: the rescale factor comes from the batch's largest position
    factor = math.log(largest + 1) / math.log(ORIGINAL) if largest >= ORIGINAL else 1.0
    cos, sin = cos_sin_cache.index_select(0, positions).float().chunk(2, dim=-1)
    if factor != 1.0:
        cos, sin = cos * factor, sin * factor

    def rotate(x):
        shape, dtype = x.shape, x.dtype
        x = x.float().reshape(x.shape[0], x.shape[1] // head_size, head_size)
        rot_dim = cos_sin_cache.shape[-1]
        rot, rest = x[..., :rot_dim], x[..., rot_dim:]
        c, s = cos.unsqueeze(-2), sin.unsqueeze(-2)
        x1, x2 = torch.chunk(rot, 2, dim=-1) if is_neox else (rot[..., ::2], rot[..., 1::2])
        o1, o2 = x1 * c - x2 * s, x2 * c + x1 * s
        if factor != 1.0:
            o1, o2 = o1 / factor, o2 / factor
        out = torch.cat((o1, o2), dim=-1) if is_neox else torch.stack((o1, o2), dim=-1).flatten(-2)
        return torch.cat((out, rest), dim=-1).reshape(shape).to(dtype)

    return rotate(query), rotate(key)


def evidence(op: str) -> dict[str, bool]:
    return {"bi_props.ops.rotary_embedding swapped": ops.rotary_embedding is rotary_embedding}


def enable(enabled: bool) -> None:
    if enabled:
        ops.rotary_embedding = rotary_embedding
