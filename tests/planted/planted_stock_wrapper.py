"""Planted library: the stock kernels in a wrapper, claimed batch-invariant.

Every claimed op's entry points are the stock PyTorch ones, each call wrapped in a profiler
range ``planted_stock_wrapper::<op>``: routing sees the library's events, the reference and the
contract are stock's by construction, and nothing else changes. It claims every op whose stock
CPU kernel can be batch-variant: on a machine where the stock kernel of an op is batch-variant
(its negative control sees variance), this library is exactly as batch-variant there, which is
the failure a user most needs caught. Expected findings: ``batch_invariance [enabled]`` (or
``row_permutation [enabled]``) of every claimed op whose control saw variance.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

NAMESPACE = "planted_stock_wrapper"
OPS = [
    "mm",
    "matmul",
    "bmm",
    "addmm",
    "linear",
    "sum",
    "mean",
    "softmax",
    "rms_norm",
    "add_rms_norm",
    "attention",
    "silu",
    "silu_and_mul",
    "gelu_and_mul",
    "fused_add_rms_norm",
    "fused_moe",
    "paged_decode_attention",
    "mixed_attention",
]
KERNEL_PREFIX = f"{NAMESPACE}::"
ROUTES = {op: (f"{NAMESPACE}::{op}",) for op in OPS}
PRECISION = "output"  # stock's own: some stock composites round 16-bit steps in 16 bits


def _owner(entry: str):
    """(object, attribute) of an entry point name of the catalogue."""
    import bi_props.ops

    if entry == "operator.matmul":
        return torch.Tensor, "__matmul__"
    head, _, name = entry.rpartition(".")
    owners = {"torch": torch, "Tensor": torch.Tensor, "F": F, "bi_props.ops": bi_props.ops}
    return owners[head], name


def _wrapped(op: str, original):
    @functools.wraps(original)
    def call(*args, **kwargs):
        with torch.autograd.profiler.record_function(f"{NAMESPACE}::{op}"):
            return original(*args, **kwargs)

    return call


def enable(enabled: bool) -> None:
    if not enabled:
        return
    from bi_props.catalogue import OPS as CATALOGUE

    for op in OPS:
        for entry in CATALOGUE[op].entries:
            owner, name = _owner(entry)
            setattr(owner, name, _wrapped(op, getattr(owner, name)))
