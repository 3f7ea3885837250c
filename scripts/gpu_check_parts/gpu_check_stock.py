"""The GPU check's `controls` part: stock PyTorch, nothing switched (needs only torch).

A bi_props module target (``--bi-target gpu_check_stock``) that claims no op and installs
nothing: its negative controls show what the stock kernels (cuBLAS, PyTorch's CUDA reductions)
do with the batch. Batch variance there is expected (cuBLAS picks kernels by shape) and recorded,
not a failure. On CPU under ``TRITON_INTERPRET=1`` (``gpu_check.sh --interpret``) it is stock
CPU PyTorch.
"""

from __future__ import annotations

import os


def _device() -> str:
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return "cpu"
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except Exception:
        return "cpu"


DEVICE = _device()
OPS: list[str] = []  # claims nothing: every op is stock


def enable(enabled: bool) -> None:
    """Nothing to switch: both states are stock PyTorch."""
