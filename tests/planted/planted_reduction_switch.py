"""Planted library, bug class *a reduction switch at 256 rows*.

vLLM's own rms_norm test compares a batch of 255 rows against one of 300: kernels pick another
reduction (another block size, a split across warps) once the batch has enough rows. Here
``F.rms_norm`` computes each row's mean of squares in float64 (one rounding at the end: row-
and batch-invariant) while the batch holds fewer than THRESHOLD rows, and in float32 from
THRESHOLD rows on. Both are honest (the reference bound holds), so only batch invariance can see
it: a needle alone and the same needle inside a batch of 256 rows differ in their last bits.
Expected finding: rms_norm batch_invariance [enabled], shrunk to a batch of exactly THRESHOLD
rows. Row permutation cannot see it (permuting keeps the total).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

NAMESPACE = "planted_reduction_switch"
OPS = ["rms_norm"]
KERNEL_PREFIX = f"{NAMESPACE}::"
THRESHOLD = 256

_STOCK = F.rms_norm


def rms_norm(x, normalized_shape, weight=None, eps=None):
    h = x.shape[-1]
    rows = x.numel() // max(h, 1)
    eps = torch.finfo(torch.float32).eps if eps is None else eps
    # BUG: the reduction's precision (its order of roundings) depends on the batch's rows
    acc = torch.float32 if rows >= THRESHOLD else torch.float64
    xs = x.to(acc)
    mean_square = (xs * xs).mean(dim=-1, keepdim=True)
    y = xs * torch.rsqrt(mean_square + eps)
    if weight is not None:
        y = y * weight.to(acc)
    return y.to(x.dtype)


def evidence(op: str) -> dict[str, bool]:
    return {"torch.nn.functional.rms_norm swapped": F.rms_norm is rms_norm}


def enable(enabled: bool) -> None:
    if enabled:
        F.rms_norm = rms_norm
