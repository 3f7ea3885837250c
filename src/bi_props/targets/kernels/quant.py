"""Batch-invariant quantized linear (``bi_props.ops.quant_linear``'s contract: dynamic per-token
activation scales, per-channel weight scales, int8 or float8_e4m3fn).

The quantization is ``bi_props.ops.quantize_rows``: every scale and quotient is a function of its
own row (float32, correctly rounded), so it is batch-invariant by construction. The GEMM is
exact: the quantized values are integers of magnitude <= 127 or e4m3 values (4 significant bits,
multiples of 2^-9, at most 448), so every product and every partial sum of K < 2^17 of them is a
float64 value (a multiple of 2^-18 below 2^53 of them), and ``matmul_tree`` in float64 computes
the exact sum whatever the order. The dequantization is ``(acc * s_x) * s_w`` in float64, then one
rounding to x's dtype: the same operations for a row whatever shares the call.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ...ops import check_quant_args, quantize_rows
from .primitives import matmul_tree
from .route import KernelRoute


@torch.no_grad()
def quant_linear(x: Tensor, weight: Tensor, qdtype: str = "int8") -> Tensor:
    """``(q_x @ q_w^T) * s_x * s_w`` rounded to x's dtype: q and s per row (``quantize_rows``),
    the product exact in float64, the two scale products in float64."""
    check_quant_args(x, weight, qdtype)
    qx, sx = quantize_rows(x, qdtype)
    qw, sw = quantize_rows(weight, qdtype)
    acc = matmul_tree(qx.to(torch.float64)[None], qw.to(torch.float64).t()[None])[0]
    out = (acc * sx.to(torch.float64)) * sw.to(torch.float64).t()
    return out.to(x.dtype)


ROUTES = (
    KernelRoute(
        'quant_linear(Tensor x, Tensor weight, str qdtype="int8") -> Tensor',
        quant_linear,
        ops=("quant_linear",),
        composite="quant_linear",
    ),
)
"""The kernels of this module and how the switch routes to them (route.py)."""
