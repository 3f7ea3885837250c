"""Planted library for localizing a model-level finding: bi_props's correct CPU kernels for every
op, except one planted bug in ``aten::mm`` (every ``F.linear`` of the probe model: QKV, the output
projection, the MLP, lm_head): above 16 rows it stops calling its batch-invariant kernel and
sums K in two float32 halves, so a token's projections depend on how many tokens share the call.
Expected finding: probe_model logprobs [enabled], localized to aten::mm (catalogue op mm) in
layer 0's QKV projection, its op-level reproducer failing standalone.
"""

from __future__ import annotations

import warnings

import torch

from bi_props.targets.kernels import install
from bi_props.targets.kernels.register import ROUTES

NAMESPACE = "planted_model_linear_bug"
OPS = [*ROUTES, "probe_model"]
KERNEL_PREFIX = f"{NAMESPACE}::"
THRESHOLD = 16
_LIBRARIES: list[torch.library.Library] = []


def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if a.shape[0] > THRESHOLD and a.is_floating_point():  # BUG: the order depends on M
        half = a.shape[1] // 2
        with torch.no_grad():
            low = (a[:, :half].float().unsqueeze(-1) * b[:half].float().unsqueeze(0)).sum(1)
            high = (a[:, half:].float().unsqueeze(-1) * b[half:].float().unsqueeze(0)).sum(1)
            return (high + low).to(a.dtype)
    return getattr(torch.ops, NAMESPACE).mm(a, b)


def enable(enabled: bool) -> None:
    if not enabled:
        return
    install(NAMESPACE)
    aten = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        aten.impl("mm", mm, "CPU")
    _LIBRARIES.append(aten)
