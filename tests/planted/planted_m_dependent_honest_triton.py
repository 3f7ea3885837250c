"""Planted Triton library, the honest twin of ``planted_m_dependent_triton`` (no bug).

The same ``@triton.jit`` matmul, with BLOCK_M chosen from M (16 for M <= 16 rows, 32 above) and
BLOCK_K fixed at 16: every output element sums the same k-tiles in the same order whatever M is,
so it is batch-invariant. Under TRITON_INTERPRET=1 it passes only if the interpreter's ``tl.dot``
is order-fixed (bi_props.targets.triton_compat ``ordered_dot``): numpy's matmul may round a row
differently when the tile has more rows. Expected: no finding.
"""

from __future__ import annotations

import plantedlib
import torch
from planted_m_dependent_triton import THRESHOLD, launch

NAMESPACE = "planted_m_dependent_honest_triton"
OPS = ["mm"]
KERNEL_PREFIX = f"{NAMESPACE}::"
ROUTES = {"mm": (f"{NAMESPACE}::mm",)}


def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    block_m = 16 if a.shape[0] <= THRESHOLD else 32  # fine: rows do not share a reduction
    return launch(a, b, block_m=block_m, block_k=16)


def enable(enabled: bool) -> None:
    if enabled:
        plantedlib.install(NAMESPACE, mm)
