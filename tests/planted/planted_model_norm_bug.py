"""Planted library for localizing a model-level finding inside a catalogue entry: bi_props's correct
CPU kernels for every op, except ``add_rms_norm`` (the probe model's residual add + RMSNorm,
``bi_props.ops.add_rms_norm``), swapped for the library's own custom op
``planted_model_norm_bug::variant_add_rms_norm`` whose kernel reduces the mean square in float32
above 12 rows and in float64 below: a token's normalised activations depend on how many tokens
share the call. Expected finding: probe_model logprobs [enabled], localized to the catalogue entry
add_rms_norm of layer 0 and, inside it, to the custom op, its op-level reproducer failing
standalone.
"""

from __future__ import annotations

import torch

import bi_props.ops
from bi_props.targets.kernels import install
from bi_props.targets.kernels.register import ROUTES

NAMESPACE = "planted_model_norm_bug"
OPS = [*ROUTES, "probe_model"]
KERNEL_PREFIX = f"{NAMESPACE}::"
THRESHOLD = 12


@torch.library.custom_op(f"{NAMESPACE}::variant_add_rms_norm", mutates_args=())
def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    r = x + residual
    wide = torch.float32 if x.shape[0] > THRESHOLD else torch.float64  # BUG: depends on rows
    scale = torch.rsqrt(r.to(wide).pow(2).mean(-1, keepdim=True) + eps)
    return (r.to(wide) * scale).to(r.dtype) * weight, r.clone()


def enable(enabled: bool) -> None:
    if not enabled:
        return
    install(NAMESPACE)
    op = getattr(torch.ops, NAMESPACE).variant_add_rms_norm
    bi_props.ops.add_rms_norm = lambda x, residual, weight, eps: op(x, residual, weight, eps)
