"""Planted library, bug class *a padded-length-dependent kernel*.

The shape of kernels that pick a reduction strategy from the padded sequence length L of a
``(B, L, H)`` input (a CUDA-graph bucket, an HF batch padded to its longest sequence): an rms_norm
that sums each row's squares in float64 (batch-invariant, and accurate) while L < THRESHOLD, and
in float32 from THRESHOLD on. Both are honest (the reference passes), and a packed ``(rows, H)``
input never takes the second path, whatever the batch's rows: only the padded layout
shows it. Expected finding: rms_norm batch_invariance [enabled], the needle alone at its own
length (< THRESHOLD) against the batch padded to THRESHOLD or more.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

NAMESPACE = "planted_padded_length"
OPS = ["rms_norm"]
KERNEL_PREFIX = f"{NAMESPACE}::"
THRESHOLD = 32
_STOCK = F.rms_norm


def rms_norm(input, normalized_shape, weight=None, eps=None):
    stock = _STOCK(input, normalized_shape, weight, eps)  # the stock contract: its checks, dtype
    if len(tuple(normalized_shape)) != 1 or not input.is_floating_point() or input.numel() == 0:
        return stock
    if eps is None:
        eps = torch.finfo(torch.float64 if input.dtype == torch.float64 else torch.float32).eps
    x = input.to(torch.float64)
    # BUG: the reduction's precision (and order) is chosen from the padded length L
    if input.dim() >= 3 and input.shape[-2] >= THRESHOLD:
        squares = input.to(torch.float32).square().sum(dim=-1, keepdim=True).to(torch.float64)
    else:
        squares = x.square().sum(dim=-1, keepdim=True)
    y = x * torch.rsqrt(squares / input.shape[-1] + eps)
    if weight is not None:
        y = y * weight.to(torch.float64)
    return y.to(stock.dtype)


def evidence(op: str) -> dict[str, bool]:
    return {"F.rms_norm swapped": F.rms_norm is rms_norm}


def enable(enabled: bool) -> None:
    if enabled:
        F.rms_norm = rms_norm
