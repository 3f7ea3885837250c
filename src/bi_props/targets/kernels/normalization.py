"""Batch-invariant softmax, log_softmax, rms_norm and add_rms_norm (row-wise normalisations)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from .primitives import compute_dtype, exp, log, sqrt, tree_max, tree_sum
from .route import KernelRoute

_HALF = (torch.float16, torch.bfloat16)


def softmax_core(x: Tensor, dim: int, *, log_output: bool = False) -> Tensor:
    """(log_)softmax of ``x`` (float32 or float64) over ``dim``, in x's dtype.

    max by ``tree_max``; x - max is one correctly rounded subtraction; ``exp``/``log`` are the
    package's own; the normaliser is a ``tree_sum``; the last step one division (softmax) or
    subtraction (log_softmax). Every step is elementwise or a tree over ``dim`` alone.
    """
    m = tree_max(x, dim).unsqueeze(dim)
    z = x - m
    e = exp(z)
    s = tree_sum(e, dim).unsqueeze(dim)
    if log_output:
        return z - log(s)
    return e / s


def _softmax_entry(self: Tensor, dim: int, half_to_float: bool, log_output: bool) -> Tensor:
    name = "log_softmax" if log_output else "softmax"
    torch._check(
        self.is_floating_point(),
        lambda: (
            f'"{name}_lastdim_kernel_impl" not implemented for '
            f"'{str(self.dtype).removeprefix('torch.')}'"
        ),
    )
    torch._check(
        not half_to_float or self.dtype in _HALF,
        lambda: "conversion is supported for Half type only",
    )
    out_dtype = torch.float32 if half_to_float else self.dtype
    ndim = max(self.dim(), 1)
    torch._check_index(
        -ndim <= dim < ndim,
        lambda: (
            f"Dimension out of range (expected to be in range of [{-ndim}, {ndim - 1}], "
            f"but got {dim})"
        ),
    )
    if self.numel() == 0:
        return torch.empty(self.shape, dtype=out_dtype, device=self.device)
    x = self.to(compute_dtype(self.dtype))
    if x.dim() == 0:
        return softmax_core(x.reshape(1), 0, log_output=log_output).reshape(()).to(out_dtype)
    return softmax_core(x, dim % ndim, log_output=log_output).to(out_dtype)


@torch.no_grad()
def softmax(self: Tensor, dim: int, half_to_float: bool = False) -> Tensor:
    """Batch-invariant ``aten::_softmax``.

    Each row's max and normaliser are pairwise trees over that row's own elements with a shape set
    by the softmax length; exp is computed elementwise from correctly rounded float64 operations;
    no step looks at other rows or at how many there are. half_to_float: fp16/bf16 in, fp32 out.
    """
    return _softmax_entry(self, dim, half_to_float, log_output=False)


@torch.no_grad()
def log_softmax(self: Tensor, dim: int, half_to_float: bool = False) -> Tensor:
    """Batch-invariant ``aten::_log_softmax``: (x - max) - log(sum exp(x - max)).

    Same row-local trees and own exp/log as ``softmax``, so a row's result is a function of that
    row and its length only.
    """
    return _softmax_entry(self, dim, half_to_float, log_output=True)


def _checked_shape(input: Tensor, normalized_shape: Sequence[int]) -> list[int]:
    """``normalized_shape`` as a list, after aten's own check (and message) that the input ends
    with it: rms_norm and layer_norm share it."""
    shape = list(normalized_shape)
    k = len(shape)
    torch._check(
        input.dim() >= k and list(input.shape[input.dim() - k :]) == shape,
        lambda: (
            f"Given normalized_shape={shape}, expected input with shape [*"
            + "".join(f", {s}" for s in shape)
            + f"], but got input of size{list(input.shape)}"
        ),
    )
    return shape


@torch.no_grad()
def rms_norm(
    input: Tensor,
    normalized_shape: Sequence[int],
    weight: Tensor | None = None,
    eps: float | None = None,
) -> Tensor:
    """Batch-invariant ``aten::rms_norm``: x / sqrt(mean(x**2) + eps) * weight.

    The mean of squares is a ``tree_sum`` over the normalised elements of one row and one
    division; sqrt is the package's own (correctly rounded for float32) and the rest are single
    correctly rounded elementwise ops, so a row never sees the batch. eps defaults to the compute
    dtype's epsilon (float32's for bf16/fp16 input), exactly as aten does.
    """
    shape = _checked_shape(input, normalized_shape)
    k = len(shape)
    if weight is not None:
        torch._check(
            list(weight.shape) == shape,
            lambda: (
                "Expected weight to be of same shape as normalized_shape, but got weight of "
                f"shape {list(weight.shape)} and normalized_shape = {shape}"
            ),
        )
    cd = compute_dtype(input.dtype)
    if eps is None:
        eps = torch.finfo(cd).eps
    count = 1
    for s in shape:
        count *= s
    lead = list(input.shape[: input.dim() - k])
    x = input.to(cd).reshape(*lead, count)
    mean_sq = tree_sum(x * x, -1) / count
    y = x / sqrt(mean_sq + eps).unsqueeze(-1)
    if weight is not None:
        y = y * weight.to(cd).reshape(count)
    return y.reshape(input.shape).to(input.dtype)


@torch.no_grad()
def add_rms_norm(
    x: Tensor, residual: Tensor, weight: Tensor, eps: float | None = None
) -> tuple[Tensor, Tensor]:
    """Batch-invariant fused add + rms_norm: (rms_norm(x + residual) * weight, x + residual).

    The residual sum is one correctly rounded float32 add rounded once to the output dtype (bitwise
    what stock ``x + residual`` gives, bf16 included: it also adds in float32 and rounds once);
    ``rms_norm`` of that rounded sum is row-local as argued there.
    """
    out_dtype = torch.result_type(x, residual)
    cd = compute_dtype(out_dtype)
    total = (x.to(cd) + residual.to(cd)).to(out_dtype)
    return rms_norm(total, list(weight.shape), weight, eps), total


@torch.no_grad()
def fused_add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> None:
    """Batch-invariant vLLM ``fused_add_rms_norm``, in place: ``residual <- x + residual`` (one
    float32 add, rounded once), ``x <- rms_norm(residual) * weight`` (``rms_norm`` above:
    row-local). Both results are computed before either tensor is written."""
    y, total = add_rms_norm(x, residual, weight, eps)
    residual.copy_(total)
    x.copy_(y)


@torch.no_grad()
def layer_norm(
    input: Tensor,
    normalized_shape: Sequence[int],
    weight: Tensor | None = None,
    bias: Tensor | None = None,
    eps: float = 1e-5,
) -> Tensor:
    """Batch-invariant ``aten::layer_norm``: (x - mean) / sqrt(var + eps) * weight + bias.

    Two passes over one row's own normalised elements in the compute dtype: mean = ``tree_sum(x)``
    / n, d = x - mean, var = ``tree_sum(d * d)`` / n (biased), then one correctly rounded ``sqrt``
    (the package's), a division, the weight product and the bias add, rounded once to the input
    dtype. Every tree depends on n only, so a row never sees the batch.
    """
    shape = _checked_shape(input, normalized_shape)
    k = len(shape)
    cd = compute_dtype(input.dtype)
    count = 1
    for s in shape:
        count *= s
    lead = list(input.shape[: input.dim() - k])
    x = input.to(cd).reshape(*lead, count)
    if count == 0:
        return input.clone()
    mean = (tree_sum(x, -1) / count).unsqueeze(-1)
    d = x - mean
    var = tree_sum(d * d, -1) / count
    y = d / sqrt(var + eps).unsqueeze(-1)
    if weight is not None:
        y = y * weight.to(cd).reshape(count)
    if bias is not None:
        y = y + bias.to(cd).reshape(count)
    return y.reshape(input.shape).to(input.dtype)


def _layer_norm(ns):
    def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5, cudnn_enable=True):
        return ns.layer_norm(input, normalized_shape, weight, bias, eps)

    return layer_norm


def _fused_add_rms_norm(ns):
    def fused_add_rms_norm(x, residual, weight, eps=1e-6):
        """Batch-invariant ``bi_props.ops.fused_add_rms_norm``, in place; returns the two
        mutated tensors, as the stock composite does."""
        ns.fused_add_rms_norm(x, residual, weight, float(eps))
        return x, residual

    return fused_add_rms_norm


ROUTES = (
    KernelRoute(
        "softmax(Tensor self, int dim, bool half_to_float) -> Tensor",
        softmax,
        ops=("softmax",),
        aten={
            "_softmax": lambda ns: (
                lambda self, dim, half_to_float: ns.softmax(self, dim, half_to_float)
            )
        },
    ),
    KernelRoute(
        "log_softmax(Tensor self, int dim, bool half_to_float) -> Tensor",
        log_softmax,
        ops=("log_softmax",),
        aten={
            "_log_softmax": lambda ns: (
                lambda self, dim, half_to_float: ns.log_softmax(self, dim, half_to_float)
            )
        },
    ),
    KernelRoute(
        "rms_norm(Tensor input, int[] normalized_shape, Tensor? weight=None, float? eps=None)"
        " -> Tensor",
        rms_norm,
        ops=("rms_norm",),
        aten={
            "rms_norm": lambda ns: (
                lambda input, normalized_shape, weight=None, eps=None: ns.rms_norm(
                    input, normalized_shape, weight, eps
                )
            )
        },
    ),
    KernelRoute(
        "add_rms_norm(Tensor x, Tensor residual, Tensor weight, float? eps=None)"
        " -> (Tensor, Tensor)",
        add_rms_norm,
        ops=("add_rms_norm",),
        composite="add_rms_norm",
    ),
    KernelRoute(
        "fused_add_rms_norm(Tensor(a!) x, Tensor(b!) residual, Tensor weight, float eps) -> ()",
        fused_add_rms_norm,
        ops=("fused_add_rms_norm",),
        composite="fused_add_rms_norm",
        forward=_fused_add_rms_norm,
    ),
    KernelRoute(
        "layer_norm(Tensor input, int[] normalized_shape, Tensor? weight=None, Tensor? bias=None,"
        " float eps=1e-05) -> Tensor",
        layer_norm,
        ops=("layer_norm",),
        aten={"layer_norm": _layer_norm},
    ),
)
"""The kernels of this module and how the switch routes to them (route.py)."""
