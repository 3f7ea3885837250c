"""Planted library, bug class *a top-k path at 8 or more rows that keeps exactly k*.

vLLM's sampler (#50979) takes a Triton top-k path at 8 or more rows that keeps exactly k logits
(ties past the k-th dropped, the first in index order kept), where its PyTorch path below 8 rows
keeps every logit tied with the k-th. The catalogue's contract is the second rule (every logit
>= the k-th largest). Here calls of fewer than 8 rows run the cpu target's kernel (ties kept);
calls of 8 or more keep exactly k. A needle of fewer than 8 requests with top-k and a tie at its
k-th logit (the exact class, bf16 logits, a ties companion's rows) gets another kept set, other
logprobs and maybe another id, once its batch holds 8 or more rows. Expected finding: sample
batch_invariance (or reference, a needle of 8 or more rows alone) [enabled].
"""

from __future__ import annotations

import plantedlib
import torch

NAMESPACE = "planted_top_k_ties_at_8"
OPS = ["sample"]
KERNEL_PREFIX = f"{NAMESPACE}::"
ROWS = 8


def sample(logits, temperature, top_k, top_p, min_p, greedy, noise):
    rows, vocab = logits.shape
    if rows >= ROWS and vocab:  # BUG: the many-row path keeps exactly k (ties dropped)
        on = (~greedy) & (top_k > 0) & (top_k < vocab)
        order = torch.sort(logits, dim=-1, descending=True, stable=True).indices
        rank = torch.empty_like(order).scatter_(1, order, torch.arange(vocab).expand(rows, vocab))
        drop = on[:, None] & (rank >= top_k[:, None])
        logits = logits.masked_fill(drop, float("-inf"))
        top_k = torch.where(on, torch.zeros_like(top_k), top_k)
    return plantedlib.sample_invariant(logits, temperature, top_k, top_p, min_p, greedy, noise)


def enable(enabled: bool) -> None:
    if enabled:
        plantedlib.install_sample(NAMESPACE, sample)
