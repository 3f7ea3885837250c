"""Planted library, bug class *an elementwise kernel wrong on one rare 16-bit pattern*.

The shape of a fast path or a lookup table with one bad entry: silu is stock everywhere but on
the single bfloat16 bit pattern 0x4B80 (2^24), where it returns NaN. No value class draws it
(general values are normal samples, wide ones reach about 6 x 2^20, special ones are NaN,
infinities and zeros), so random examples pass in any budget; the exhaustive 16-bit sweep (issue
21) meets it. Expected finding: silu reference [enabled], shrunk to the (1, 1) case holding
pattern 0x4B80 (``values='bit_patterns', seed=19328``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

NAMESPACE = "planted_rare_pattern"
OPS = ["silu"]
KERNEL_PREFIX = f"{NAMESPACE}::"
RARE = 0x4B80
_STOCK = F.silu


def silu(input, inplace=False):
    out = _STOCK(input, inplace=inplace)
    if input.dtype == torch.bfloat16:
        # BUG: one entry of the fast path is wrong
        rare = input.contiguous().view(torch.int16) == RARE
        out = torch.where(rare, torch.full_like(out, float("nan")), out)
    return out


def evidence(op: str) -> dict[str, bool]:
    return {"F.silu swapped": F.silu is silu}


def enable(enabled: bool) -> None:
    if enabled:
        F.silu = silu
