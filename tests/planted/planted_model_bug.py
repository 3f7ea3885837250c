"""Planted library for the model-level property: bi_props's correct CPU kernels for every op, except
one planted bug in ``silu`` (SwiGLU's activation) that only a composition exercises the way a model
does: for tensors of more than 512 elements it switches to a cheaper float32 formula, so a token's
activations depend on how many tokens share the call. Expected finding: probe_model logprobs
[enabled], its message naming silu among the catalogue ops the model used.
"""

from __future__ import annotations

import warnings

import torch

from bi_props.targets.kernels import activation, install
from bi_props.targets.kernels.register import ROUTES

NAMESPACE = "planted_model_bug"
OPS = [*ROUTES, "probe_model"]
KERNEL_PREFIX = f"{NAMESPACE}::"
THRESHOLD = 512
_LIBRARIES: list[torch.library.Library] = []


def silu(x: torch.Tensor) -> torch.Tensor:
    if x.numel() > THRESHOLD:  # BUG: the formula depends on the size of the whole call
        return (x.float() * (1.0 / (1.0 + (-x.float()).exp()))).to(x.dtype)
    return activation.silu(x)


def enable(enabled: bool) -> None:
    if not enabled:
        return
    install(NAMESPACE)
    aten = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        aten.impl("silu", silu, "CPU")
    _LIBRARIES.append(aten)
