"""Batch-invariant embedding: a gather, no arithmetic."""

from __future__ import annotations

from torch import Tensor

from .route import KernelRoute


def embedding(weight: Tensor, indices: Tensor) -> Tensor:
    """``weight[indices]`` by ``index_select`` along the rows: each output row is a copy of one
    weight row, bit for bit, whatever the other indices are."""
    flat = weight.index_select(0, indices.reshape(-1))
    return flat.reshape(*indices.shape, *weight.shape[1:])


def _embedding(ns):
    def embedding(weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
        """Forward only (padding_idx and scale_grad_by_freq concern the gradient)."""
        return ns.embedding(weight, indices)

    return embedding


ROUTES = (
    KernelRoute(
        "embedding(Tensor weight, Tensor indices) -> Tensor",
        embedding,
        ops=("embedding",),
        aten={"embedding": _embedding},
    ),
)
"""The kernels of this module and how the switch routes to them (route.py)."""
