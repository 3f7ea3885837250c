"""The ``ascend`` target's NPU calls: the entry points, the attention call's arguments and the
engine ops' adapters' arguments (``bi_props.targets.ascend_ops``); ``ascend_routes`` re-exports
all of it. Pure logic: nothing here imports torch, torch_npu or vllm-ascend."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence

from .ascend_versions import (
    REFERENCE_VERSION,
    in_range,
)

# ---------------------------------------------------------------------------------------------
# Entry points on the NPU and the attention call


ENTRIES: dict[str, tuple[str, ...]] = {
    # torch_npu.npu_add_rms_norm(x1, x2, gamma, epsilon) -> (y, rstd, x1 + x2); the swapped
    # add_rms_norm returns (y, None, x + residual). The catalogue keeps y and the last output.
    "add_rms_norm": ("torch_npu.npu_add_rms_norm",),
    "attention": ("bi_props.targets.ascend.npu_varlen_attention",),
}

CAUSAL_MASK_SIZE = 2048  # sparse_mode 2/3/4 take a compressed 2048 x 2048 mask
CAUSAL_SPARSE_MODE = 3  # rightDownCausal (vllm-ascend's causal prefill)
NO_CACHE_BLOCK_SIZE = 128  # what vllm-ascend passes with block_table=None (PrefillNoCache)


FIA_TENSOR_KEYWORDS = ("query", "key", "value", "atten_mask")


def fia_keywords() -> frozenset[str]:
    """Every keyword ``npu_varlen_attention`` passes to npu_fused_infer_attention_score (the
    contract check finds a vllm-ascend call that uses them all)."""
    return frozenset(FIA_TENSOR_KEYWORDS) | fia_arguments([0, 1], 1, 1, 1.0, True).keys()


def fia_arguments(
    cu_seqlens: Sequence[int], num_heads: int, num_kv_heads: int, scale: float, causal: bool
) -> dict[str, object]:
    """Keyword arguments of ``torch_npu.npu_fused_infer_attention_score`` for packed sequences.

    As vllm-ascend 0.23.0 calls it for a prefill without KV cache (attention/attention_v1.py: TND
    layout, cumulative ``actual_seq_lengths`` = query_start_loc[1:], ``actual_seq_lengths_kv`` the
    same, ``block_table=None``, ``block_size=128``, causal ``sparse_mode=3`` with a 2048 x 2048 int8
    upper-triangular ``atten_mask``, non-causal ``sparse_mode=0`` without mask). The mask tensor is
    built by the caller (it lives on the device). UNVERIFIED on hardware.
    """
    cu = [int(c) for c in cu_seqlens]
    if len(cu) < 2 or cu[0] != 0 or any(b < a for a, b in itertools.pairwise(cu)):
        raise ValueError(f"cu_seqlens must start at 0 and not decrease, got {cu}")
    if num_kv_heads <= 0 or num_heads % num_kv_heads:
        raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
    ends = cu[1:]
    return {
        "input_layout": "TND",
        "actual_seq_lengths": ends,
        "actual_seq_lengths_kv": list(ends),
        "num_heads": int(num_heads),
        "num_key_value_heads": int(num_kv_heads),
        "scale": float(scale),
        "sparse_mode": CAUSAL_SPARSE_MODE if causal else 0,
        "block_table": None,
        "block_size": NO_CACHE_BLOCK_SIZE,
    }


# ---------------------------------------------------------------------------------------------
# The engine ops' adapters (bi_props.targets.ascend_ops): entries and the arguments they pass

ADAPTER_MODULE = "bi_props.targets.ascend_ops"
ADAPTERS_SINCE = REFERENCE_VERSION  # read in the 0.23.0 wheel only; older releases: stock entries

ENGINE_ENTRIES: dict[str, str] = {
    "rms_norm": f"{ADAPTER_MODULE}.npu_rms_norm",
    "fused_add_rms_norm": f"{ADAPTER_MODULE}.npu_fused_add_rms_norm",
    "silu_and_mul": f"{ADAPTER_MODULE}.npu_silu_and_mul",
    "rotary_embedding": f"{ADAPTER_MODULE}.npu_rotary_embedding",
    # Not in every catalogue yet (other branches add them): entries_for() names them only where
    # the catalogue has an op of that name, so they light up when the ops land.
    "paged_decode_attention": f"{ADAPTER_MODULE}.npu_paged_decode_attention",
    "mixed_attention": f"{ADAPTER_MODULE}.npu_mixed_attention",
    "fused_moe": f"{ADAPTER_MODULE}.npu_fused_moe",
}
"""Catalogue op -> the adapter running it the way vllm-ascend 0.23.0 does. ``gelu_and_mul``,
``layer_norm``, ``embedding``, ``greedy_argmax`` and ``top_k`` have none: vllm-ascend 0.23.0 has no
NPU counterpart for them (no GeluAndMul in REGISTERED_ASCEND_OPS, vLLM's native code runs), so the
catalogue's stock entries run on torch_npu's aten kernels."""


def entries_for(version: str | None, catalogue_ops: Iterable[str]) -> dict[str, tuple[str, ...]]:
    """The target's entry points: ENTRIES, plus the engine adapters for a vllm-ascend version they
    were read for (an unknown version reads as the reference one), each only for an op the
    catalogue has (a name lookup: ``paged_decode_attention`` and ``fused_moe`` may be absent)."""
    ops = set(catalogue_ops)
    out = {op: entry for op, entry in ENTRIES.items() if op in ops}
    if in_range(version, since=ADAPTERS_SINCE):
        out.update({op: (entry,) for op, entry in ENGINE_ENTRIES.items() if op in ops})
    return out


def paged_decode_arguments(
    seq_lens: Sequence[int],
    max_blocks: int,
    block_size: int,
    num_heads: int,
    num_kv_heads: int,
    scale: float,
) -> dict[str, object]:
    """Keyword arguments (besides the tensors) of ``npu_fused_infer_attention_score`` for one decode
    token per sequence over a paged cache, as vllm-ascend 0.23.0's DecodeOnly state passes them
    (attention/attention_v1.py forward_fused_infer_attention: TND, ``actual_seq_lengths`` the
    cumulative query lengths 1..B, ``actual_seq_lengths_kv`` = seq_lens, causal sparse_mode 3)."""
    lengths = [int(n) for n in seq_lens]
    if not lengths:
        raise ValueError("paged decode needs at least one sequence")
    capacity = int(max_blocks) * int(block_size)
    bad = [n for n in lengths if not 1 <= n <= capacity]
    if bad:
        raise ValueError(
            f"seq_lens {bad} outside [1, max_blocks * block_size = {capacity}]: each decode"
            " query needs at least one key and its block table must hold its context"
        )
    # the mixed-batch call with one query token per sequence (cumulative lengths 1..B)
    ones = [1] * len(lengths)
    return chunked_prefill_arguments(
        ones, lengths, max_blocks, block_size, num_heads, num_kv_heads, scale, causal=True
    )


PAGED_DECODE_TENSOR_KEYWORDS = ("query", "key", "value", "atten_mask", "block_table")

KV_CACHE_BLOCK_SIZE = 128
"""The paged KV cache's block size the mixed-batch adapter lays the keys out in (vllm-ascend's
usual ``--block-size``; FIA's TND layout with a block table takes 128-aligned blocks)."""


def chunked_prefill_arguments(
    query_lengths: Sequence[int],
    key_lengths: Sequence[int],
    max_blocks: int,
    block_size: int,
    num_heads: int,
    num_kv_heads: int,
    scale: float,
    causal: bool,
) -> dict[str, object]:
    """Keyword arguments (besides the tensors) of ``npu_fused_infer_attention_score`` for a mixed
    batch over a paged cache, as vllm-ascend 0.23.0's ChunkedPrefill state passes them
    (attention/attention_v1.py forward_fused_infer_attention, _get_fia_params' last branch):
    TND, ``actual_seq_lengths`` the cumulative query lengths (attn_metadata.actual_seq_lengths_q),
    ``actual_seq_lengths_kv`` each sequence's key count (seq_lens_list, not cumulative), causal
    ``sparse_mode=3`` (rightDownCausal: a sequence's queries are its last tokens) with the 2048 x
    2048 mask, non-causal ``sparse_mode=0`` without one. Sequence b has ``query_lengths[b]``
    queries (a prefill, a prefill chunk over a cached prefix, or one decode token) over
    ``key_lengths[b]`` keys."""
    lq = [int(n) for n in query_lengths]
    lk = [int(n) for n in key_lengths]
    if not lq or len(lq) != len(lk):
        raise ValueError(f"one query and one key length per sequence, got {lq} and {lk}")
    capacity = int(max_blocks) * int(block_size)
    empty = [b for b, (q, k) in enumerate(zip(lq, lk, strict=True)) if q < 1 or k < 1]
    if empty:
        raise ValueError(
            f"sequences {empty} have no query token or no key (query lengths {lq}, key lengths"
            f" {lk}): every sequence vllm-ascend schedules has both"
        )
    if causal and any(q > k for q, k in zip(lq, lk, strict=True)):
        raise ValueError(f"causal: query lengths {lq} must not exceed key lengths {lk}")
    if max(lk) > capacity:
        raise ValueError(
            f"key lengths {lk} exceed max_blocks * block_size = {capacity}: the block table"
            " must hold every sequence's keys"
        )
    if num_kv_heads <= 0 or num_heads % num_kv_heads:
        raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
    return {
        "input_layout": "TND",
        "block_size": int(block_size),
        "actual_seq_lengths": list(itertools.accumulate(lq)),
        "actual_seq_lengths_kv": lk,
        "num_key_value_heads": int(num_kv_heads),
        "num_heads": int(num_heads),
        "scale": float(scale),
        "sparse_mode": CAUSAL_SPARSE_MODE if causal else 0,
    }


# vllm-ascend's check_npu_moe_gating_top_k (ops/fused_moe/experts_selector.py) wants, with one
# expert group, more than 2 entries per group; it reads them from hidden_states.shape[-1] (the
# hidden size), where the gating op's last dim is the expert count: the adapter requires it of
# the expert count, which is what the kernel groups.
MOE_GATING_MIN_EXPERTS = 3


def moe_gating_arguments(topk: int) -> dict[str, object]:
    """Keywords of ``torch_npu.npu_moe_gating_top_k`` for plain softmax top-k routing, as
    vllm-ascend 0.23.0 passes them (device/device_op.py moe_gating_top_k via
    experts_selector._select_experts_with_fusion_ops: one group, ``renorm=0``; renormalisation
    is done afterwards in torch)."""
    return {
        "k": int(topk),
        "bias": None,
        "k_group": 1,
        "group_count": 1,
        "group_select_mode": 1,
        "renorm": 0,
        "norm_type": 0,
        "routed_scaling_factor": 1.0,
        "eps": 1e-20,
    }


def moe_init_routing_arguments(tokens: int, topk: int, experts: int) -> dict[str, object]:
    """Keywords of ``torch_npu.npu_moe_init_routing_v2`` as TokenDispatcherWithAllGather passes
    them without quantisation or expert parallelism (ops/fused_moe/token_dispatcher.py through
    device/device_op.py npu_moe_init_routing): counts per expert (type 1), all experts local."""
    return {
        "scale": None,
        "active_num": int(tokens) * int(topk),
        "expert_num": int(experts),
        "expert_tokens_num_type": 1,
        "expert_tokens_num_flag": True,
        "active_expert_range": [0, int(experts)],
        "quant_mode": -1,
    }


def moe_mlp_arguments(group_list: object) -> dict[str, object]:
    """Keywords (besides x and weight) of ``torch_npu.npu_grouped_matmul`` in unquant_apply_mlp
    (ops/fused_moe/moe_mlp.py): one output tensor, groups given as counts."""
    return {"split_item": 2, "group_list_type": 1, "group_type": 0, "group_list": group_list}
