"""Batch-invariant fused MoE block (vLLM's ``fused_moe`` contract, SiLU-gated experts).

Stock engines group tokens by expert and run one GEMM per expert over that expert's tokens, so
the M of each GEMM (and with it the GEMM's blocking) depends on the whole batch. This kernel keeps
the grouping (it is what makes a MoE block cheap) but every step is a function of the token's own
row: the selection is ``sampling.top_k`` of the token's logits (ties to the lowest expert
index), the routing weights a ``softmax_core`` over that row, each expert GEMM a ``matmul_tree``
(an element's tree depends on K only, never on how many tokens share the expert), SiLU elementwise
in float64 from the package's own ``exp``, and the weighted combine a fixed tree over the token's
k slots (in selection order). float32 throughout (16-bit operands upcast exactly), rounded once.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .normalization import softmax_core
from .primitives import compute_dtype, exp, matmul_tree, tree_sum
from .route import KernelRoute
from .sampling import top_k


def _check(hidden: Tensor, w1: Tensor, w2: Tensor, gating: Tensor, topk: int) -> None:
    torch._check(hidden.dim() == 2, lambda: f"hidden_states must be 2-D, got {hidden.dim()}-D")
    torch._check(w1.dim() == 3 and w2.dim() == 3, lambda: "w1 and w2 must be 3-D")
    experts, two_inter, size = w1.shape
    torch._check(
        two_inter % 2 == 0 and size == hidden.shape[1],
        lambda: f"w1 must be (E, 2I, H) with H = {hidden.shape[1]}, got {list(w1.shape)}",
    )
    torch._check(
        tuple(w2.shape) == (experts, size, two_inter // 2),
        lambda: f"w2 must be {[experts, size, two_inter // 2]}, got {list(w2.shape)}",
    )
    torch._check(
        tuple(gating.shape) == (hidden.shape[0], experts),
        lambda: f"gating_output must be {[hidden.shape[0], experts]}, got {list(gating.shape)}",
    )
    torch._check(0 < topk <= experts, lambda: f"topk must be in 1..{experts}, got {topk}")
    torch._check(
        hidden.dtype == w1.dtype == w2.dtype and hidden.is_floating_point(),
        lambda: (
            f"hidden_states, w1, w2 must share a floating dtype: {hidden.dtype}, {w1.dtype},"
            f" {w2.dtype}"
        ),
    )


def _silu_and_mul(h: Tensor, inter: int) -> Tensor:
    """silu(h[:, :I]) * h[:, I:] in float64 (the own exp), rounded once to h's dtype."""
    g, v = h[:, :inter].to(torch.float64), h[:, inter:].to(torch.float64)
    silu = g / (exp(-g) + 1.0)
    silu = torch.where(g == float("-inf"), torch.full_like(silu, -0.0), silu)
    return (silu * v).to(h.dtype)


@torch.no_grad()
def fused_moe(
    hidden_states: Tensor,
    w1: Tensor,
    w2: Tensor,
    gating_output: Tensor,
    topk: int,
    renormalize: bool = True,
) -> Tensor:
    """sum_j p_j * w2[e_j] @ silu_and_mul(w1[e_j] @ x) per token: e_j the token's topk experts by
    logit (ties to the lowest index), p_j the softmax of its logits (renormalize: over the
    selected ones; else over all experts, then picked)."""
    _check(hidden_states, w1, w2, gating_output, topk)
    cd = compute_dtype(hidden_states.dtype)
    tokens, size = hidden_states.shape
    inter = w2.shape[-1]
    out = torch.zeros((tokens, size), dtype=cd)
    if tokens == 0:
        return out.to(hidden_states.dtype)
    logits = gating_output.to(cd)
    selected, ids = top_k(logits, topk)
    if renormalize:
        weights = softmax_core(selected, -1)
    else:
        weights = softmax_core(logits, -1).gather(1, ids)
    x = hidden_states.to(cd)
    expert_out = torch.zeros((tokens, topk, size), dtype=cd)
    for expert in range(w1.shape[0]):
        token, slot = (ids == expert).nonzero(as_tuple=True)
        if token.numel() == 0:
            continue
        h = matmul_tree(x[token][None], w1[expert].to(cd).t()[None])[0]
        act = _silu_and_mul(h, inter)
        expert_out[token, slot] = matmul_tree(act[None], w2[expert].to(cd).t()[None])[0]
    out = tree_sum(expert_out * weights.unsqueeze(-1), 1)
    return out.to(hidden_states.dtype)


ROUTES = (
    KernelRoute(
        "fused_moe(Tensor hidden_states, Tensor w1, Tensor w2, Tensor gating_output, int topk,"
        " bool renormalize=True) -> Tensor",
        fused_moe,
        ops=("fused_moe",),
        composite="fused_moe",
    ),
)
"""The kernels of this module and how the switch routes to them (route.py)."""
