"""Planted library, bug class *expert slots assigned by arrival order*.

A fused MoE kernel that sorts tokens into per-expert slots with atomics gives each token the slot
of its arrival among the tokens of that expert, and adds a token's expert outputs into its row
as the slots complete (atomic adds): first every expert's slot 0, then every slot 1, and so on.
A token's k expert outputs are then summed in an order set by the tokens that arrived before it:
alone, every slot is 0 (ascending expert order); in a batch, or with the batch's rows permuted,
its slots differ per expert and (for k >= 3, where float addition's order shows) so do its
bits. vLLM's MoE test permutes the rows and un-permutes the output for this reason. Expected
finding: fused_moe batch_invariance or row_permutation [enabled], topk >= 3, with another token
arriving before the needle (batch invariance) or more than one token (row permutation).
"""

from __future__ import annotations

import torch
from plantedlib import mm_float64

import bi_props.ops as ops

NAMESPACE = "planted_arrival_order"
OPS = ["fused_moe"]
KERNEL_PREFIX = f"{NAMESPACE}::"


def fused_moe(hidden_states, w1, w2, gating_output, topk, renormalize=True):
    tokens, experts = hidden_states.shape[0], w1.shape[0]
    inter = w2.shape[-1]
    cd = torch.promote_types(hidden_states.dtype, torch.float32)
    f64 = torch.float64
    # Each expert output in float64, element by element (plantedlib.mm_float64: the GEMMs' M
    # cannot show), rounded once: that part is batch-invariant, only the final sum is not.
    logits = gating_output.to(f64)
    ranked, order = torch.sort(logits, dim=-1, descending=True, stable=True)
    ids = order[:, :topk]
    if renormalize:
        weights = torch.softmax(ranked[:, :topk], dim=-1)
    else:
        weights = torch.softmax(logits, dim=-1).gather(1, ids)
    contributions = torch.zeros((tokens, topk, hidden_states.shape[1]), dtype=cd)
    for expert in range(experts):
        token, slot = (ids == expert).nonzero(as_tuple=True)
        if token.numel() == 0:
            continue
        h = mm_float64(hidden_states[token].to(f64), w1[expert].to(f64).t())
        g, v = h[:, :inter], h[:, inter:]
        act = g / (1.0 + torch.exp(-g)) * v
        y = mm_float64(act, w2[expert].to(f64).t())
        contributions[token, slot] = (y * weights[token, slot].unsqueeze(-1)).to(cd)
    # BUG: each token's slot in an expert is its arrival rank among that expert's tokens, and
    # its expert outputs are added slot by slot (as atomics complete), not in expert order
    chosen = torch.zeros((tokens, experts), dtype=torch.int64)
    chosen.scatter_(1, ids, 1)
    arrival = chosen.cumsum(dim=0) - 1  # (tokens, experts): rank among the expert's tokens
    key = arrival.gather(1, ids) * experts + ids
    sequence = key.argsort(dim=1, stable=True)
    ordered = contributions.gather(1, sequence.unsqueeze(-1).expand_as(contributions))
    out = torch.zeros((tokens, hidden_states.shape[1]), dtype=cd)
    for j in range(topk):
        out = out + ordered[:, j]
    return out.to(hidden_states.dtype)


def evidence(op: str) -> dict[str, bool]:
    return {"bi_props.ops.fused_moe swapped": ops.fused_moe is fused_moe}


def enable(enabled: bool) -> None:
    if enabled:
        ops.fused_moe = fused_moe
