"""Planted library, bug class *a dynamic activation scale taken over the whole batch* (per-tensor
amax: vLLM #57016, one batch-mate's outlier changes every other sample's bits).

It claims ``quant_linear`` and swaps ``bi_props.ops.quant_linear`` for a kernel that quantizes
each token per row (the contract: ``bi_props.ops.quantize_rows``) and accumulates exactly, but
keeps each token's scale relative to a per-tensor scale, as two-level schemes do (a global
scale from the amax of the *whole call's input*, per-token scales stored against it):
``S = max(amax_all, FLOOR) / QMAX``, the token's dequantization scale ``fl32(s_x / S) * S``.
While every value of the batch stays below FLOOR, S is one constant and the kernel is
batch-invariant (and within the reference bound: the ratio's one float32 rounding); one companion
holding outliers (values 10^2 to 10^4 times the others) moves S, and with it the last bits of
every other row. Needles and companions of general values never reach FLOOR; wide values may,
in the needle itself beside any companion (another way in). Expected finding: quant_linear
batch_invariance [enabled], a companion with ``content='outlier'`` (or 'huge'), or a wide needle.
Nothing else is claimed: every other op is stock.
"""

from __future__ import annotations

import torch

import bi_props.ops as ops

NAMESPACE = "planted_per_tensor_scale"
OPS = ["quant_linear"]
KERNEL_PREFIX = f"{NAMESPACE}::"
FLOOR = 64.0  # the per-tensor amax's floor: no plain value of the needle's classes reaches it


def quant_linear(x, weight, qdtype="int8"):
    ops.check_quant_args(x, weight, qdtype)
    qmax = ops.QUANT_QMAX[qdtype]
    qx, sx = ops.quantize_rows(x, qdtype)
    qw, sw = ops.quantize_rows(weight, qdtype)
    x32 = x.to(torch.float32)
    finite = x32[torch.isfinite(x32)]
    amax = float(finite.abs().max()) if finite.numel() else 0.0
    # BUG: a per-tensor scale over the whole call's input (the batch), kept in the token's scale
    tensor_scale = torch.tensor(max(amax, FLOOR) / qmax, dtype=torch.float32)
    kept = (sx / tensor_scale).to(torch.float64) * float(tensor_scale)
    acc = torch.zeros((x.shape[0], weight.shape[0]), dtype=torch.float64)
    q64, w64 = qx.to(torch.float64), qw.to(torch.float64)
    for i in range(x.shape[1]):  # exact: integers or e4m3 products, far below 2^53
        acc += q64[:, i : i + 1] * w64[:, i : i + 1].t()
    return ((acc * kept) * sw.to(torch.float64).t()).to(x.dtype)


def evidence(op: str) -> dict[str, bool]:
    return {"bi_props.ops.quant_linear swapped": ops.quant_linear is quant_linear}


def enable(enabled: bool) -> None:
    if enabled:
        ops.quant_linear = quant_linear
