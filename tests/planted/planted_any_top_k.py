"""Planted library, bug class *a batch-level any(need_top_k) moves every row to another path*.

sglang's sampler (#35697) checks whether *any* request of the batch asks for top-k and, if one
does, runs every row through its sort-based top-k/top-p path; otherwise a direct path. Both are
correct, but they round the processed logprobs differently: here the direct path is the cpu
target's kernel (float32), the sort-based one computes them in float64 and rounds once. A needle
whose own requests have no top-k gets the direct path alone and the other one beside a
batch-mate with top-k. Homogeneous batches (every request alike) never show it; mixed
parameters do. Expected finding: sample batch_invariance [enabled], a needle without top-k
beside a companion with it.
"""

from __future__ import annotations

import plantedlib
import torch

NAMESPACE = "planted_any_top_k"
OPS = ["sample"]
KERNEL_PREFIX = f"{NAMESPACE}::"


def sample(logits, temperature, top_k, top_p, min_p, greedy, noise):
    ids, logprobs = plantedlib.sample_invariant(
        logits, temperature, top_k, top_p, min_p, greedy, noise
    )
    vocab = logits.shape[-1]
    need_top_k = (~greedy) & (top_k > 0) & (top_k < vocab)
    if bool(need_top_k.any()):  # BUG: a batch-level choice of path for every row
        kept = torch.isfinite(logprobs) & ~greedy[:, None]
        z = logits.to(torch.float64) / temperature.to(torch.float64)[:, None]
        exact = torch.log_softmax(z.masked_fill(~kept, float("-inf")), dim=-1)  # float64
        logprobs = torch.where(kept, exact.to(torch.float32), logprobs)
    return ids, logprobs


def enable(enabled: bool) -> None:
    if enabled:
        plantedlib.install_sample(NAMESPACE, sample)
