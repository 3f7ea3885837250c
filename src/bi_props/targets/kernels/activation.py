"""Batch-invariant activations: SwiGLU's ``silu``.

Stock CPU ``silu`` is position-dependent in float32 here: its vectorised body and its scalar tail
compute ``exp`` differently, and which elements fall in the tail depends on the tensor's size, i.e.
on the batch (measured: 8 of ~300k elements differ between a slice computed alone and in place).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .primitives import exp


def silu(x: Tensor) -> Tensor:
    """``x / (1 + exp(-x))`` in float64 with the package's own ``exp``, rounded once to x's dtype.

    Batch-invariant by construction: an elementwise function of one element made only of correctly
    rounded operations (the own exp included), so no element can see its neighbours or its
    position in the tensor.
    """
    if not x.is_floating_point():
        raise RuntimeError(f"\"silu\" not implemented for '{str(x.dtype).removeprefix('torch.')}'")
    with torch.no_grad():
        x64 = x.to(torch.float64)
        y = x64 / (exp(-x64) + 1.0)
        # -inf: -inf / inf is NaN; silu(-inf) is -0.0 as in PyTorch.
        y = torch.where(x64 == float("-inf"), torch.full_like(y, -0.0), y)
        return y.to(x.dtype)
