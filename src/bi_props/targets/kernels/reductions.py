"""Batch-invariant sum and mean (full and over dims), with aten's dtype and argument contract."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from .primitives import compute_dtype, tree_sum
from .route import KernelRoute


def _normalize_dims(dim: int | Sequence[int] | None, ndim: int) -> list[int]:
    """Sorted reduced dims; None or [] means all. Same errors as aten."""
    if dim is None:
        return list(range(ndim))
    dims = [dim] if isinstance(dim, int) else list(dim)
    if not dims:
        return list(range(ndim))
    low, high = (-1, 0) if ndim == 0 else (-ndim, ndim - 1)
    seen: set[int] = set()
    for d in dims:
        if not low <= d <= high:
            raise IndexError(
                f"Dimension out of range (expected to be in range of [{low}, {high}], but got {d})"
            )
        wrapped = d % max(ndim, 1)
        torch._check(
            wrapped not in seen,
            lambda w=wrapped: f"dim {w} appears multiple times in the list of dims",
        )
        seen.add(wrapped)
    return sorted(seen) if ndim else []


def _reduce_sum(x: Tensor, dims: list[int], keepdim: bool) -> tuple[Tensor, int]:
    """Tree sum of ``x`` (already in its accumulation dtype) over ``dims``, and the count.

    The reduced dims are moved last and flattened into one axis in row-major order, so each
    output element is the fixed tree over the same R = prod(reduced sizes) elements whatever the
    kept dims (the rows) are.
    """
    kept = [d for d in range(x.dim()) if d not in dims]
    count = 1
    for d in dims:
        count *= x.shape[d]
    kept_shape = [x.shape[d] for d in kept]
    flat = x.permute([*kept, *dims]).reshape(*kept_shape, count)
    out = tree_sum(flat, -1)
    if keepdim:
        out = out.reshape([1 if d in dims else x.shape[d] for d in range(x.dim())])
    return out, count


def _accumulate_dtype(dtype: torch.dtype) -> torch.dtype:
    return compute_dtype(dtype)


@torch.no_grad()
def sum(
    self: Tensor,
    dim: int | Sequence[int] | None = None,
    keepdim: bool = False,
    *,
    dtype: torch.dtype | None = None,
) -> Tensor:
    """Batch-invariant ``aten::sum`` / ``sum.dim_IntList``.

    Every output element is the pairwise tree (``tree_sum``) over its own R reduced elements, R
    fixed by the reduced dims' sizes: the number of kept rows and their values cannot reach it.
    Floating inputs accumulate in float32 (float64 for float64), integers and bool in int64.
    """
    if dtype is not None:
        src = self.to(dtype)
        out_dtype = dtype
    else:
        src = self
        floating = self.is_floating_point() or self.is_complex()
        out_dtype = self.dtype if floating else torch.int64
    dims = _normalize_dims(dim, self.dim())
    out, _ = _reduce_sum(src.to(_accumulate_dtype(src.dtype)), dims, keepdim)
    return out.to(out_dtype)


@torch.no_grad()
def mean(
    self: Tensor,
    dim: int | Sequence[int] | None = None,
    keepdim: bool = False,
    *,
    dtype: torch.dtype | None = None,
) -> Tensor:
    """Batch-invariant ``aten::mean`` / ``mean.dim``: ``sum``'s tree, then one correctly rounded
    division by the count, so it inherits the sum's invariance. Floating and complex only."""
    out_dtype = dtype if dtype is not None else self.dtype
    torch._check(
        out_dtype.is_floating_point or out_dtype.is_complex,
        lambda: (
            "mean(): could not infer output dtype. "
            + (
                "Input dtype must be either a floating point or complex dtype. "
                if dtype is None
                else "Optional dtype must be either a floating point or complex dtype. "
            )
            + f"Got: {_scalar_name(out_dtype)}"
        ),
    )
    src = self.to(out_dtype)
    dims = _normalize_dims(dim, self.dim())
    total, count = _reduce_sum(src.to(_accumulate_dtype(out_dtype)), dims, keepdim)
    return (total / count).to(out_dtype)


_SCALAR_NAMES = {
    torch.bool: "Bool",
    torch.uint8: "Byte",
    torch.int8: "Char",
    torch.int16: "Short",
    torch.int32: "Int",
    torch.int64: "Long",
}


def _scalar_name(dtype: torch.dtype) -> str:
    return _SCALAR_NAMES.get(dtype, str(dtype).removeprefix("torch."))


ROUTES = (
    KernelRoute(
        "sum(Tensor self, int[1]? dim=None, bool keepdim=False, *, ScalarType? dtype=None)"
        " -> Tensor",
        sum,
        ops=("sum",),
        aten={
            "sum": lambda ns: lambda self, *, dtype=None: ns.sum(self, None, False, dtype=dtype),
            "sum.dim_IntList": lambda ns: (
                lambda self, dim, keepdim=False, *, dtype=None: ns.sum(
                    self, dim, keepdim, dtype=dtype
                )
            ),
        },
        all_dtypes=True,
    ),
    KernelRoute(
        "mean(Tensor self, int[1]? dim=None, bool keepdim=False, *, ScalarType? dtype=None)"
        " -> Tensor",
        mean,
        ops=("mean",),
        aten={
            "mean": lambda ns: lambda self, *, dtype=None: ns.mean(self, None, False, dtype=dtype),
            "mean.dim": lambda ns: (
                lambda self, dim, keepdim=False, *, dtype=None: ns.mean(
                    self, dim, keepdim, dtype=dtype
                )
            ),
        },
        all_dtypes=True,
    ),
)
"""The kernels of this module and how the switch routes to them (route.py)."""
