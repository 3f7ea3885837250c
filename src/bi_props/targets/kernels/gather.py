"""Batch-invariant embedding: a gather, no arithmetic."""

from __future__ import annotations

from torch import Tensor


def embedding(weight: Tensor, indices: Tensor) -> Tensor:
    """``weight[indices]`` by ``index_select`` along the rows: each output row is a copy of one
    weight row, bit for bit, whatever the other indices are."""
    flat = weight.index_select(0, indices.reshape(-1))
    return flat.reshape(*indices.shape, *weight.shape[1:])
