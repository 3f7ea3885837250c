"""The catalogue's engine ops on an Ascend NPU: call adapters onto the torch_npu / vllm-ascend calls
that vllm-ascend 0.23.0 itself makes for them.

NOT RUN ON AN NPU. Each adapter converts bi_props' operand layout (the catalogue's OpSpec) to the
NPU call's arguments and the call's outputs back, exactly as the vllm-ascend 0.23.0 code named in
its docstring does; the names and keywords used are checked against the published 0.23.0 wheel by
``bi_props.integrations.contract`` (``ascend_routes.CALL_USES``, ``ascend_routes.ROPE_FORWARD``).
Their pure logic is unit-tested with a stand-in ``torch_npu`` namespace (tests/test_ascend_ops.py):
which arguments are passed, which output is kept, in-place semantics. Hardware behaviour (layouts
the kernels accept, rounding) is not verified.

torch_npu is looked up when an adapter is called (never at import), so vllm-ascend's attribute
swaps (``torch_npu.npu_add_rms_norm``, ``torch_npu.npu_fused_infer_attention_score``) are what
runs once its switch is on. Every adapter takes ``npu=`` (a torch_npu-like namespace) for tests.

A case the NPU call cannot compute as the catalogue specifies raises :class:`NpuUnsupported`
naming the reason, rather than computing something else.
"""

from __future__ import annotations

import importlib
import itertools
import math
from typing import Any

from .ascend_routes import (
    CAUSAL_MASK_SIZE,
    KV_CACHE_BLOCK_SIZE,
    MOE_GATING_MIN_EXPERTS,
    ROPE_FORWARD,
    chunked_prefill_arguments,
    moe_gating_arguments,
    moe_init_routing_arguments,
    moe_mlp_arguments,
    paged_decode_arguments,
)

FLOAT32_EPS = 2.0**-23
"""F.rms_norm's eps when none is given (float32's epsilon, also for 16-bit inputs); npu_rms_norm's
own default (1e-6) differs, so the adapter always passes one."""


class NpuUnsupported(ValueError):
    """The NPU call vllm-ascend uses cannot compute this case as the catalogue specifies it."""


def _npu(npu: Any) -> Any:
    if npu is not None:
        return npu
    import torch_npu

    return torch_npu


# -- norms -----------------------------------------------------------------------------------


def npu_rms_norm(x: Any, weight: Any, eps: float | None = None, *, npu: Any = None) -> Any:
    """rms_norm as vllm-ascend 0.23.0's AscendRMSNorm.forward_oot without residual
    (ops/layernorm.py: ``torch_npu.npu_rms_norm(x, self.weight, self.variance_epsilon)``), which
    returns ``(y, rstd)``: y is kept. Not swapped by vllm-ascend's switch (unclaimed)."""
    eps = FLOAT32_EPS if eps is None else float(eps)
    y, _rstd = _npu(npu).npu_rms_norm(x, weight, eps)
    return y


def npu_fused_add_rms_norm(
    x: Any, residual: Any, weight: Any, eps: float = 1e-6, *, npu: Any = None
) -> tuple[Any, Any]:
    """vLLM's in-place fused_add_rms_norm through ``torch_npu.npu_add_rms_norm(x, residual,
    weight, eps)`` as AscendRMSNorm.forward_oot calls it with a residual (ops/layernorm.py; under
    VLLM_BATCH_INVARIANT=1 vllm-ascend disables its custom ops, so this branch is taken).

    The NPU op returns ``(y, rstd, x + residual)`` (vllm-ascend's swapped ``add_rms_norm``:
    ``(y, None, x + residual)``) and mutates nothing; vLLM's op is in place, so y is written into
    ``x`` and the sum into ``residual`` (both computed before either is written)."""
    y, _rstd, total = _npu(npu).npu_add_rms_norm(x, residual, weight, float(eps))
    residual.copy_(total)
    x.copy_(y)
    return x, residual


# -- activation ------------------------------------------------------------------------------


def npu_silu_and_mul(x: Any, *, npu: Any = None) -> Any:
    """SwiGLU as vllm-ascend 0.23.0's AscendSiluAndMul.forward_oot (ops/activation.py:
    ``torch_npu.npu_swiglu(x)``, default dim=-1): silu of the first half of the last dim times the
    second half, vLLM's SiluAndMul layout (vllm-ascend maps SiluAndMul onto it unchanged)."""
    if x.dim() < 1 or x.shape[-1] % 2:
        raise NpuUnsupported(f"npu_swiglu splits the last dim in two halves; got {tuple(x.shape)}")
    return _npu(npu).npu_swiglu(x)


# -- rotary ----------------------------------------------------------------------------------


def _rope_forward() -> Any:
    module = importlib.import_module(ROPE_FORWARD.module)
    return getattr(module, ROPE_FORWARD.symbol)


def npu_rotary_embedding(
    positions: Any,
    query: Any,
    key: Any,
    head_size: int,
    cos_sin_cache: Any,
    is_neox: bool = True,
    *,
    rope_forward: Any = None,
) -> tuple[Any, Any]:
    """vLLM's rotary embedding through vllm-ascend 0.23.0's ``rope_forward_oot(positions, query,
    key, cos_sin_cache, head_size, rotary_dim, is_neox_style)`` (ops/rotary_embedding.py), what
    AscendRotaryEmbedding.forward_oot runs via ``torch.ops.vllm.npu_rotary_embedding``: its Triton
    kernel where vllm-ascend has Triton, else ``torch_npu._npu_rotary_embedding`` (neox and gpt-j,
    partial rotary handled by vllm-ascend). rotary_dim is the cache's last dim, as in vLLM.

    ``_npu_rotary_embedding`` rotates its arguments in place (rope_forward_oot passes contiguous
    views of them): the catalogue's op returns new tensors and leaves its operands alone, so
    copies are passed. ``rope_forward``: a stand-in for tests."""
    rotary_dim = int(cos_sin_cache.shape[-1])
    if rotary_dim % 2 or rotary_dim > head_size:
        raise NpuUnsupported(
            f"rotary_dim {rotary_dim} must be even and at most head_size {head_size}"
        )
    forward = rope_forward if rope_forward is not None else _rope_forward()
    q, k = forward(
        positions,
        query.clone(),
        key.clone(),
        cos_sin_cache,
        int(head_size),
        rotary_dim,
        bool(is_neox),
    )
    return q.reshape(query.shape), k.reshape(key.shape)


# -- paged decode attention ------------------------------------------------------------------

_MASKS: dict[str, Any] = {}


def _causal_mask(device: Any) -> Any:
    import torch

    key = str(device)
    if key not in _MASKS:
        ones = torch.ones(CAUSAL_MASK_SIZE, CAUSAL_MASK_SIZE)
        _MASKS[key] = torch.triu(ones, diagonal=1).to(torch.int8).to(device)
    return _MASKS[key]


def npu_paged_decode_attention(
    query: Any,
    key_cache: Any,
    value_cache: Any,
    block_table: Any,
    seq_lens: Any,
    scale: float | None = None,
    *,
    npu: Any = None,
) -> Any:
    """One decode token per sequence over a paged KV cache, as vllm-ascend 0.23.0's
    forward_fused_infer_attention in the DecodeOnly state (attention/attention_v1.py): the cache
    viewed (num_blocks, block_size, kv_heads * head_size), TND layout with cumulative query
    lengths 1..B, ``actual_seq_lengths_kv`` = seq_lens, causal ``sparse_mode=3`` with the 2048 x
    2048 int8 mask (a decode query sees its whole context), through
    ``torch_npu.npu_fused_infer_attention_score`` (looked up now: swapped when the switch is on).

    query (B, H, D); key_cache / value_cache (num_blocks, block_size, Hkv, D), vLLM's layout
    and vllm-ascend's; block_table (B, max_blocks) int; seq_lens (B,) int. Output (B, H, Dv)."""
    import torch

    batch, heads, head_dim = query.shape
    num_blocks, block_size, kv_heads, _ = key_cache.shape
    if scale is None:
        scale = 1.0 / math.sqrt(head_dim)
    lengths = [int(n) for n in (seq_lens.tolist() if hasattr(seq_lens, "tolist") else seq_lens)]
    kwargs = paged_decode_arguments(
        lengths, int(block_table.shape[-1]), block_size, heads, kv_heads, float(scale)
    )
    out, _lse = _npu(npu).npu_fused_infer_attention_score(
        query=query,
        key=key_cache.view(num_blocks, block_size, -1),
        value=value_cache.view(num_blocks, block_size, -1),
        atten_mask=_causal_mask(query.device),
        block_table=block_table.to(torch.int32),
        **kwargs,
    )
    return out.view(batch, heads, value_cache.shape[-1])


# -- mixed batches: prefill chunks and decode tokens over a paged cache ----------------------


def paged_layout(key_lengths: list[int], block_size: int) -> tuple[list[list[int]], int]:
    """Each sequence's blocks in a fresh cache (sequence after sequence, as an allocator hands
    out free blocks to a new batch), and the block table's width: ``(tables, max_blocks)``."""
    tables, next_block = [], 0
    for n in key_lengths:
        count = -(-n // block_size)
        tables.append(list(range(next_block, next_block + count)))
        next_block += count
    return tables, max((len(t) for t in tables), default=0)


def npu_mixed_attention(
    q: Any,
    k: Any,
    v: Any,
    cu_seqlens_q: Any,
    cu_seqlens_k: Any,
    scale: float | None = None,
    causal: bool = True,
    *,
    npu: Any = None,
) -> Any:
    """``bi_props.ops.mixed_attention`` (sequence b: ``Lq_b`` new tokens over ``Lk_b`` keys, a
    cached prefix and those tokens; a prefill, a prefill chunk, or one decode token) as
    vllm-ascend 0.23.0 runs a mixed batch: the ChunkedPrefill state of
    forward_fused_infer_attention (attention/attention_v1.py) reads the keys from the paged KV
    cache through the block table, TND queries with cumulative ``actual_seq_lengths``,
    ``actual_seq_lengths_kv`` = each sequence's key count, causal ``sparse_mode=3`` with the 2048
    x 2048 mask (non-causal: ``sparse_mode=0``, no mask), through
    ``torch_npu.npu_fused_infer_attention_score`` (looked up now: swapped when the switch is on).

    The packed keys and values are written into a cache of ``KV_CACHE_BLOCK_SIZE``-token blocks
    first (vllm-ascend's reshape_and_cache has put them there before attention runs). q (Tq, H,
    D), k / v (Tk, Hkv, D) packed by the cumulative lengths; output (Tq, H, Dv) in q's dtype. A
    sequence without a query token or a key raises NpuUnsupported (vllm-ascend never schedules
    one)."""
    import torch

    bounds_q = [int(c) for c in cu_seqlens_q.tolist()]
    bounds_k = [int(c) for c in cu_seqlens_k.tolist()]
    lq = [b - a for a, b in itertools.pairwise(bounds_q)]
    lk = [b - a for a, b in itertools.pairwise(bounds_k)]
    tokens, heads, head_dim = q.shape
    kv_heads, value_dim = k.shape[1], v.shape[2]
    if scale is None:
        scale = 1.0 / math.sqrt(head_dim)
    block_size = KV_CACHE_BLOCK_SIZE
    tables, max_blocks = paged_layout(lk, block_size)
    try:
        kwargs = chunked_prefill_arguments(
            lq, lk, max_blocks, block_size, heads, kv_heads, float(scale), bool(causal)
        )
    except ValueError as refused:
        raise NpuUnsupported(f"npu_mixed_attention: {refused}") from None
    blocks = sum(len(t) for t in tables)
    key_cache = k.new_zeros((blocks * block_size, kv_heads, head_dim))
    value_cache = v.new_zeros((blocks * block_size, kv_heads, value_dim))
    for table, start, n in zip(tables, bounds_k, lk, strict=False):  # bounds_k has one more
        at = table[0] * block_size  # a sequence's blocks are consecutive here
        key_cache[at : at + n] = k[start : start + n]
        value_cache[at : at + n] = v[start : start + n]
    block_table = torch.zeros((len(tables), max_blocks), dtype=torch.int32)
    for b, table in enumerate(tables):
        block_table[b, : len(table)] = torch.tensor(table, dtype=torch.int32)
    extra = {"atten_mask": _causal_mask(q.device)} if causal else {}
    out, _lse = _npu(npu).npu_fused_infer_attention_score(
        query=q,
        key=key_cache.view(blocks, block_size, -1),
        value=value_cache.view(blocks, block_size, -1),
        block_table=block_table.to(q.device),
        **extra,
        **kwargs,
    )
    return out.view(tokens, heads, value_dim)


# -- fused MoE -------------------------------------------------------------------------------


def npu_fused_moe(
    hidden_states: Any,
    w1: Any,
    w2: Any,
    gating_output: Any,
    topk: int,
    renormalize: bool = True,
    *,
    npu: Any = None,
) -> Any:
    """vLLM's fused_moe (softmax routing, SiLU-gated experts, no quantisation, one device) as
    vllm-ascend 0.23.0 computes it on the all-gather path, with the torch_npu ops it calls:

    1. ``npu_moe_gating_top_k(x, k=, bias=None, k_group=1, group_count=1, group_select_mode=1,
       renorm=0, norm_type=0, routed_scaling_factor=1.0, eps=1e-20)`` (device/device_op.py,
       moe_gating_top_k), then renormalisation in torch when asked, as vllm-ascend does;
    2. ``npu_moe_init_routing_v2(hidden, topk_ids, scale=None, active_num=T * topk,
       expert_num=E, expert_tokens_num_type=1, expert_tokens_num_flag=True,
       active_expert_range=[0, E], quant_mode=-1)`` (device_op.py npu_moe_init_routing, called
       by token_dispatcher.TokenDispatcherWithAllGather): tokens sorted by expert, counts;
    3. ``npu_grouped_matmul(x=[...], weight=[w1^T], split_item=2, group_list_type=1,
       group_type=0, group_list=counts)[0]``, ``npu_swiglu``, the same with w2^T
       (ops/fused_moe/moe_mlp.py unquant_apply_mlp, need_trans=True);
    4. ``npu_moe_token_unpermute(permuted_tokens=, sorted_indices=|expanded_row_idx|, probs=)``
       (device_op.py npu_moe_token_unpermute, token_combine): the weighted sum back per token.

    hidden_states (T, H), w1 (E, 2I, H), w2 (E, H, I), gating_output (T, E). vllm-ascend's
    fused gating op is used only where its own check allows (``MOE_GATING_MIN_EXPERTS``); other
    cases raise NpuUnsupported instead of silently computing vllm-ascend's torch fallback."""
    import torch

    npu = _npu(npu)
    tokens, hidden = hidden_states.shape
    experts = int(w1.shape[0])
    if gating_output.shape != (tokens, experts):
        raise NpuUnsupported(
            f"gating_output {tuple(gating_output.shape)} is not (tokens, experts) ="
            f" {(tokens, experts)}"
        )
    if not 1 <= topk <= experts or experts < MOE_GATING_MIN_EXPERTS:
        raise NpuUnsupported(
            f"npu_moe_gating_top_k needs 1 <= topk <= experts and at least"
            f" {MOE_GATING_MIN_EXPERTS} experts (vllm-ascend's check_npu_moe_gating_top_k;"
            f" else it falls back to torch): topk {topk}, experts {experts}"
        )
    weights, ids, _ = npu.npu_moe_gating_top_k(gating_output, **moe_gating_arguments(topk))
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    ids = ids.to(torch.int32)
    sorted_states, expanded_row_idx, counts, _scale = npu.npu_moe_init_routing_v2(
        hidden_states, ids, **moe_init_routing_arguments(tokens, topk, experts)
    )
    counts = counts.to(torch.int64)
    gate_up = npu.npu_grouped_matmul(
        x=[sorted_states], weight=[w1.transpose(1, 2)], **moe_mlp_arguments(counts)
    )[0]
    activated = npu.npu_swiglu(gate_up)
    down = npu.npu_grouped_matmul(
        x=[activated], weight=[w2.transpose(1, 2)], **moe_mlp_arguments(counts)
    )[0]
    out = npu.npu_moe_token_unpermute(
        permuted_tokens=down, sorted_indices=expanded_row_idx.abs(), probs=weights
    )
    return out.view(tokens, hidden)
