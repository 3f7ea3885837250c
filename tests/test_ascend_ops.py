"""Unit tests of the engine ops' Ascend adapters (bi_props/targets/ascend_ops.py), on CPU.

torch_npu cannot be imported here, so each adapter runs against ``FakeNpu``: a namespace that
records every call and computes what torch_npu's documentation says the op returns, in float64
torch. That checks the adapters' own logic (arguments passed, the tuple element kept, in-place
semantics, layouts converted, refusals), not the NPU kernels: nothing here ran on an NPU.
"""

from __future__ import annotations

import itertools
import math
import sys
import types
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from bi_props import ops as stock
from bi_props.catalogue import OPS
from bi_props.model.case import Case
from bi_props.targets import ascend_ops
from bi_props.targets.ascend_ops import (
    FLOAT32_EPS,
    NpuUnsupported,
    npu_fused_add_rms_norm,
    npu_fused_moe,
    npu_mixed_attention,
    npu_paged_decode_attention,
    npu_rms_norm,
    npu_rotary_embedding,
    npu_silu_and_mul,
)
from bi_props.targets.ascend_routes import (
    ENGINE_ENTRIES,
    ENTRIES,
    KV_CACHE_BLOCK_SIZE,
    chunked_prefill_arguments,
    entries_for,
    paged_decode_arguments,
)

RSTD = "rstd"  # what the fake returns in the rstd slot when asked to make it recognisable


class FakeNpu:
    """A torch_npu stand-in: records ``(name, args, kwargs)`` and returns documented outputs."""

    def __init__(self, swapped_add_rms_norm: bool = False) -> None:
        self.calls: list[tuple[str, tuple, dict]] = []
        self.swapped = swapped_add_rms_norm

    def _record(self, name: str, args: tuple, kwargs: dict) -> None:
        self.calls.append((name, args, kwargs))

    def names(self) -> list[str]:
        return [c[0] for c in self.calls]

    def call(self, name: str) -> tuple[tuple, dict]:
        (found,) = [(a, k) for n, a, k in self.calls if n == name]
        return found

    # norms: (y, rstd) and (y, rstd, x_sum); vllm-ascend's swapped add_rms_norm: (y, None, sum)
    @staticmethod
    def _rms(x: torch.Tensor, gamma: torch.Tensor, eps: float) -> tuple[torch.Tensor, Any]:
        rstd = torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + eps)
        return (x.double() * rstd * gamma.double()).to(x.dtype), rstd

    def npu_rms_norm(self, x, gamma, epsilon=1e-6):
        self._record("npu_rms_norm", (x, gamma, epsilon), {})
        return self._rms(x, gamma, epsilon)

    def npu_add_rms_norm(self, x1, x2, gamma, epsilon=1e-6):
        self._record("npu_add_rms_norm", (x1, x2, gamma, epsilon), {})
        total = x1 + x2
        y, rstd = self._rms(total, gamma, epsilon)
        return (y, None if self.swapped else rstd, total)

    def npu_swiglu(self, x, dim=-1):
        self._record("npu_swiglu", (x,), {"dim": dim} if dim != -1 else {})
        a, b = x.chunk(2, dim=dim)
        return F.silu(a) * b

    # attention: TND query, paged key/value (num_blocks, block_size, kv_heads * head_dim)
    def npu_fused_infer_attention_score(self, **kw):
        self._record("npu_fused_infer_attention_score", (), kw)
        q, k, v = kw["query"], kw["key"], kw["value"]
        heads, kv_heads = kw["num_heads"], kw["num_key_value_heads"]
        block_size, table = kw["block_size"], kw["block_table"]
        ends = kw["actual_seq_lengths"]
        out = torch.zeros(q.shape[0], heads, v.shape[-1] // kv_heads, dtype=q.dtype)
        right_down_causal = kw["sparse_mode"] == 3  # a sequence's queries are its last tokens
        for b, n in enumerate(kw["actual_seq_lengths_kv"]):
            rows = [int(table[b, i // block_size]) * block_size + i % block_size for i in range(n)]
            keys = k.reshape(-1, kv_heads, k.shape[-1] // kv_heads)[rows]
            values = v.reshape(-1, kv_heads, v.shape[-1] // kv_heads)[rows]
            group = heads // kv_heads
            first, last = (ends[b - 1] if b else 0), ends[b]
            for t in range(first, last):
                seen = n - (last - t) + 1 if right_down_causal else n
                for h in range(heads):
                    s = keys[:seen, h // group] @ q[t, h] * kw["scale"]
                    out[t, h] = torch.softmax(s, 0) @ values[:seen, h // group]
        return out, None

    # MoE
    def npu_moe_gating_top_k(self, x, **kw):
        self._record("npu_moe_gating_top_k", (x,), kw)
        assert kw["norm_type"] == 0 and kw["renorm"] == 0  # softmax, no renormalisation
        weights, ids = torch.softmax(x.double(), -1).topk(kw["k"], dim=-1)
        return weights, ids.to(torch.int32), None

    def npu_moe_init_routing_v2(self, x, expert_idx, **kw):
        """Rows expanded (token, slot) in order t * k + j, sorted stably by expert;
        expanded_row_idx[t * k + j] is that row's position in the sorted output."""
        self._record("npu_moe_init_routing_v2", (x, expert_idx), kw)
        k = expert_idx.shape[1]
        flat = expert_idx.reshape(-1).long()
        order = torch.sort(flat, stable=True).indices
        position = torch.empty_like(order)
        position[order] = torch.arange(order.numel())
        counts = torch.bincount(flat, minlength=kw["expert_num"])
        return x[order // k], position.to(torch.int32), counts.to(torch.int32), None

    def npu_grouped_matmul(self, **kw):
        self._record("npu_grouped_matmul", (), kw)
        (x,), (w,) = kw["x"], kw["weight"]
        assert kw["group_list_type"] == 1  # counts
        parts, start = [], 0
        for e, n in enumerate(kw["group_list"].tolist()):
            parts.append(x[start : start + n] @ w[e])
            start += n
        return [torch.cat(parts)]

    def npu_moe_token_unpermute(self, permuted_tokens, sorted_indices, probs):
        self._record(
            "npu_moe_token_unpermute",
            (),
            {"permuted_tokens": permuted_tokens, "sorted_indices": sorted_indices, "probs": probs},
        )
        tokens, k = probs.shape
        rows = permuted_tokens[sorted_indices.long()].reshape(tokens, k, -1)
        return (rows * probs.to(rows.dtype)[..., None]).sum(1)


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------------------------------------
# rms_norm, fused_add_rms_norm


def test_rms_norm_keeps_y_not_rstd_and_passes_eps():
    npu = FakeNpu()
    x, w = torch.randn(5, 8, generator=_gen()), torch.randn(8, generator=_gen(1))
    y = npu_rms_norm(x, w, 1e-5, npu=npu)
    args, kwargs = npu.call("npu_rms_norm")
    assert args[0] is x and args[1] is w and args[2] == 1e-5 and kwargs == {}
    assert y.shape == x.shape  # rstd is (5, 1)
    torch.testing.assert_close(y, F.rms_norm(x.double(), (8,), w.double(), 1e-5).float())


def test_rms_norm_without_eps_passes_torchs_default_not_npus():
    """F.rms_norm(eps=None) uses float32's epsilon; npu_rms_norm would default to 1e-6."""
    npu = FakeNpu()
    npu_rms_norm(torch.ones(2, 4), torch.ones(4), None, npu=npu)
    assert npu.call("npu_rms_norm")[0][2] == FLOAT32_EPS == torch.finfo(torch.float32).eps


@pytest.mark.parametrize("swapped", [False, True])
def test_fused_add_rms_norm_is_in_place_with_vllms_semantics(swapped):
    """Native npu_add_rms_norm returns (y, rstd, x + residual), the swapped add_rms_norm
    (y, None, x + residual): both ways x receives y and residual the sum, in place."""
    npu = FakeNpu(swapped_add_rms_norm=swapped)
    x, r = torch.randn(3, 16, generator=_gen(2)), torch.randn(3, 16, generator=_gen(3))
    w = torch.randn(16, generator=_gen(4))
    x0, r0 = x.clone(), r.clone()
    out_x, out_r = npu_fused_add_rms_norm(x, r, w, 1e-6, npu=npu)
    assert out_x is x and out_r is r
    torch.testing.assert_close(r, x0 + r0, rtol=0, atol=0)
    torch.testing.assert_close(x, F.rms_norm((x0 + r0).double(), (16,), w.double(), 1e-6).float())
    args, _ = npu.call("npu_add_rms_norm")
    assert args[0] is x and args[1] is r and args[2] is w  # the caller's tensors themselves
    assert isinstance(args[3], float) and args[3] == 1e-6


def test_fused_add_rms_norm_takes_the_sum_from_the_third_output():
    class Sentinel(FakeNpu):
        def npu_add_rms_norm(self, x1, x2, gamma, epsilon=1e-6):
            return torch.full_like(x1, 1.0), torch.full_like(x1, 2.0), torch.full_like(x1, 3.0)

    x, r = torch.zeros(2, 4), torch.zeros(2, 4)
    npu_fused_add_rms_norm(x, r, torch.ones(4), npu=Sentinel())
    assert torch.all(x == 1.0) and torch.all(r == 3.0)


# ---------------------------------------------------------------------------------------------
# silu_and_mul


def test_silu_and_mul_calls_npu_swiglu_as_vllm_ascend_does():
    npu = FakeNpu()
    x = torch.randn(4, 10, generator=_gen(5))
    out = npu_silu_and_mul(x, npu=npu)
    args, kwargs = npu.call("npu_swiglu")
    assert args == (x,) and kwargs == {}  # default dim=-1, as AscendSiluAndMul.forward_oot
    torch.testing.assert_close(out, stock.silu_and_mul(x), rtol=0, atol=0)


def test_silu_and_mul_refuses_an_odd_last_dim():
    with pytest.raises(NpuUnsupported, match="two halves"):
        npu_silu_and_mul(torch.ones(2, 5), npu=FakeNpu())


# ---------------------------------------------------------------------------------------------
# rotary_embedding


def _rotary_operands(tokens=5, heads=2, kv_heads=1, head_size=8, rot_dim=8, max_pos=12):
    g = _gen(6)
    positions = torch.randint(0, max_pos, (tokens,), generator=g)
    query = torch.randn(tokens, heads * head_size, generator=g)
    key = torch.randn(tokens, kv_heads * head_size, generator=g)
    cache = torch.randn(max_pos, rot_dim, generator=g)
    return positions, query, key, head_size, cache


@pytest.mark.parametrize("rot_dim", [8, 4])
@pytest.mark.parametrize("is_neox", [True, False])
def test_rotary_passes_rope_forward_oots_arguments_and_copies(is_neox, rot_dim):
    """rope_forward_oot(positions, query, key, cos_sin_cache, head_size, rotary_dim,
    is_neox_style); _npu_rotary_embedding rotates in place, so the stand-in does too: the
    operands stay as drawn and the result is the rotation."""
    positions, query, key, head_size, cache = _rotary_operands(rot_dim=rot_dim)
    q0, k0 = query.clone(), key.clone()
    seen = []

    def rope_forward(p, q, k, c, hs, rd, neox):
        seen.append((p, q, k, c, hs, rd, neox))
        rq, rk = stock.rotary_embedding(p, q, k, hs, c, neox)
        q.copy_(rq), k.copy_(rk)  # in place, as torch_npu._npu_rotary_embedding
        return q.view(q.shape[0], -1, hs), k.view(k.shape[0], -1, hs)

    out_q, out_k = npu_rotary_embedding(
        positions, query, key, head_size, cache, is_neox, rope_forward=rope_forward
    )
    ((p, q, k, c, hs, rd, neox),) = seen
    assert p is positions and c is cache and (hs, rd, neox) == (head_size, rot_dim, is_neox)
    assert q.data_ptr() != query.data_ptr() and k.data_ptr() != key.data_ptr()
    assert torch.equal(query, q0) and torch.equal(key, k0)
    want_q, want_k = stock.rotary_embedding(positions, q0, k0, head_size, cache, is_neox)
    assert out_q.shape == query.shape and out_k.shape == key.shape
    assert torch.equal(out_q, want_q) and torch.equal(out_k, want_k)


def test_rotary_looks_up_vllm_ascends_rope_forward_oot_at_call_time(monkeypatch):
    module = types.ModuleType("vllm_ascend.ops.rotary_embedding")
    called = []
    module.rope_forward_oot = lambda *args: (called.append(args), (args[1], args[2]))[1]
    monkeypatch.setitem(sys.modules, "vllm_ascend.ops.rotary_embedding", module)
    positions, query, key, head_size, cache = _rotary_operands()
    npu_rotary_embedding(positions, query, key, head_size, cache, True)
    assert len(called) == 1 and len(called[0]) == 7


@pytest.mark.parametrize("rot_dim", [5, 10])
def test_rotary_refuses_rotary_dims_it_cannot_split(rot_dim):
    positions, query, key, head_size, cache = _rotary_operands(rot_dim=8)
    cache = torch.zeros(cache.shape[0], rot_dim)
    with pytest.raises(NpuUnsupported, match=f"rotary_dim {rot_dim}"):
        npu_rotary_embedding(positions, query, key, head_size, cache, rope_forward=print)


# ---------------------------------------------------------------------------------------------
# paged decode attention


def _paged(batch=3, heads=4, kv_heads=2, head_dim=8, block_size=4, max_blocks=3, seed=7):
    g = _gen(seed)
    num_blocks = batch * max_blocks + 2
    query = torch.randn(batch, heads, head_dim, generator=g, dtype=torch.float64)
    k_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=g).double()
    v_cache = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=g).double()
    table = torch.randperm(num_blocks, generator=g)[: batch * max_blocks].reshape(batch, -1)
    seq_lens = torch.tensor([1, block_size + 1, block_size * max_blocks])[:batch]
    return query, k_cache, v_cache, table.to(torch.int64), seq_lens


def _paged_reference(query, k_cache, v_cache, table, seq_lens, scale):
    batch, heads, _ = query.shape
    block_size, kv_heads = k_cache.shape[1], k_cache.shape[2]
    out = torch.empty_like(query)
    for b in range(batch):
        n = int(seq_lens[b])
        blocks = table[b, : (n + block_size - 1) // block_size]
        keys = k_cache[blocks].reshape(-1, kv_heads, k_cache.shape[-1])[:n]
        values = v_cache[blocks].reshape(-1, kv_heads, v_cache.shape[-1])[:n]
        for h in range(heads):
            kh = h // (heads // kv_heads)
            p = torch.softmax(keys[:, kh] @ query[b, h] * scale, 0)
            out[b, h] = p @ values[:, kh]
    return out


def test_paged_decode_passes_vllm_ascends_decode_arguments():
    npu = FakeNpu()
    query, k_cache, v_cache, table, seq_lens = _paged()
    out = npu_paged_decode_attention(query, k_cache, v_cache, table, seq_lens, npu=npu)
    _, kw = npu.call("npu_fused_infer_attention_score")
    assert kw["query"] is query
    assert kw["key"].shape == (k_cache.shape[0], 4, 2 * 8) and kw["key"].data_ptr() == (
        k_cache.data_ptr()
    )  # a view of the cache, as vllm-ascend's key_cache.view(num_block, block_size, -1)
    assert kw["block_table"].dtype == torch.int32 and torch.equal(kw["block_table"].long(), table)
    assert kw["actual_seq_lengths"] == [1, 2, 3]  # cumulative query lengths: one token each
    assert kw["actual_seq_lengths_kv"] == seq_lens.tolist()
    assert (kw["input_layout"], kw["sparse_mode"], kw["block_size"]) == ("TND", 3, 4)
    assert (kw["num_heads"], kw["num_key_value_heads"]) == (4, 2)
    assert kw["scale"] == 1 / math.sqrt(8)
    mask = kw["atten_mask"]
    assert mask.shape == (2048, 2048) and mask.dtype == torch.int8
    assert mask[0, 1] == 1 and mask[1, 0] == 0 and mask[5, 5] == 0
    want = _paged_reference(query, k_cache, v_cache, table, seq_lens, 1 / math.sqrt(8))
    assert out.shape == query.shape
    torch.testing.assert_close(out, want)


def test_paged_decode_uses_the_given_scale():
    npu = FakeNpu()
    query, k_cache, v_cache, table, seq_lens = _paged(batch=2)
    out = npu_paged_decode_attention(query, k_cache, v_cache, table, seq_lens, 0.5, npu=npu)
    assert npu.call("npu_fused_infer_attention_score")[1]["scale"] == 0.5
    torch.testing.assert_close(out, _paged_reference(query, k_cache, v_cache, table, seq_lens, 0.5))


def _mixed(query_lengths, key_lengths, heads=4, kv_heads=2, dim=8, seed=0):
    g = _gen(seed)
    cu_q = torch.tensor([0, *itertools.accumulate(query_lengths)])
    cu_k = torch.tensor([0, *itertools.accumulate(key_lengths)])
    q = torch.randn(int(cu_q[-1]), heads, dim, generator=g)
    k = torch.randn(int(cu_k[-1]), kv_heads, dim, generator=g)
    v = torch.randn(int(cu_k[-1]), kv_heads, dim, generator=g)
    return q, k, v, cu_q, cu_k


# a decode token over 130 keys (two blocks), a prefill chunk of 3 over a 5-token prefix, a prefill
MIXED = ((1, 3, 4), (130, 8, 4))


def test_mixed_attention_passes_vllm_ascends_chunked_prefill_arguments():
    npu = FakeNpu()
    q, k, v, cu_q, cu_k = _mixed(*MIXED)
    out = npu_mixed_attention(q, k, v, cu_q, cu_k, npu=npu)
    _, kw = npu.call("npu_fused_infer_attention_score")
    assert kw["query"] is q
    block = KV_CACHE_BLOCK_SIZE
    assert kw["key"].shape == (4, block, 2 * 8) and kw["value"].shape == (4, block, 2 * 8)
    table = kw["block_table"]
    assert table.dtype == torch.int32 and table.tolist() == [[0, 1], [2, 0], [3, 0]]
    assert kw["actual_seq_lengths"] == [1, 4, 8]  # cumulative query lengths
    assert kw["actual_seq_lengths_kv"] == [130, 8, 4]  # each sequence's keys, not cumulative
    assert (kw["input_layout"], kw["sparse_mode"], kw["block_size"]) == ("TND", 3, block)
    assert (kw["num_heads"], kw["num_key_value_heads"]) == (4, 2)
    assert kw["scale"] == 1 / math.sqrt(8)
    assert kw["atten_mask"].shape == (2048, 2048) and kw["atten_mask"].dtype == torch.int8
    # the fake computes FIA's rightDownCausal semantics: the result is the catalogue op's
    torch.testing.assert_close(out, stock.mixed_attention(q, k, v, cu_q, cu_k))


def test_mixed_attention_non_causal_passes_no_mask_and_sparse_mode_0():
    npu = FakeNpu()
    q, k, v, cu_q, cu_k = _mixed((2, 5), (3, 4))  # non-causal: more queries than keys is fine
    out = npu_mixed_attention(q, k, v, cu_q, cu_k, 0.5, False, npu=npu)
    _, kw = npu.call("npu_fused_infer_attention_score")
    assert kw["sparse_mode"] == 0 and "atten_mask" not in kw and kw["scale"] == 0.5
    torch.testing.assert_close(out, stock.mixed_attention(q, k, v, cu_q, cu_k, 0.5, False))


def test_mixed_attention_keywords_are_the_contract_checks():
    """The keywords the adapter passes are those ascend_routes.CALL_USES asks vllm-ascend's
    ChunkedPrefill call to use (the contract check reads the 0.23.0 wheel for them)."""
    from bi_props.targets.ascend_routes import CALL_USES

    npu = FakeNpu()
    npu_mixed_attention(*_mixed(*MIXED), npu=npu)
    _, kw = npu.call("npu_fused_infer_attention_score")
    uses = [u for u in CALL_USES if u.adapter == "npu_mixed_attention"]
    causal = [u for u in uses if dict(u.constants)["sparse_mode"] == 3]
    assert len(uses) == 2 and len(causal) == 1
    assert set(kw) == causal[0].keywords


@pytest.mark.parametrize(
    ("query_lengths", "key_lengths", "causal", "match"),
    [
        ((1, 0), (4, 4), True, "no query token"),
        ((1, 1), (4, 0), False, "no key"),
        ((5,), (4,), True, "must not exceed"),
        ((), (), True, "one query and one key length"),
    ],
)
def test_mixed_attention_refuses_what_vllm_ascend_never_schedules(
    query_lengths, key_lengths, causal, match
):
    npu = FakeNpu()
    q, k, v, cu_q, cu_k = _mixed(query_lengths, key_lengths)
    with pytest.raises(NpuUnsupported, match=match):
        npu_mixed_attention(q, k, v, cu_q, cu_k, None, causal, npu=npu)
    assert npu.calls == []  # refused before any NPU call


def test_chunked_prefill_arguments_refuse_impossible_cases():
    with pytest.raises(ValueError, match="exceed max_blocks"):
        chunked_prefill_arguments([1], [129], 1, 128, 2, 2, 1.0, True)
    with pytest.raises(ValueError, match="multiple"):
        chunked_prefill_arguments([1], [4], 1, 128, 3, 2, 1.0, True)


@pytest.mark.parametrize(
    ("lengths", "heads", "kv_heads", "match"),
    [
        ([], 2, 2, "at least one"),
        ([0], 2, 2, r"\[0\]"),
        ([13], 2, 2, "12"),
        ([1], 3, 2, "multiple"),
    ],
)
def test_paged_decode_arguments_refuse_impossible_cases(lengths, heads, kv_heads, match):
    with pytest.raises(ValueError, match=match):
        paged_decode_arguments(lengths, 3, 4, heads, kv_heads, 1.0)


# ---------------------------------------------------------------------------------------------
# fused_moe


def _moe(tokens=6, hidden=8, inter=4, experts=4, seed=8):
    g = _gen(seed)
    x = torch.randn(tokens, hidden, generator=g, dtype=torch.float64)
    w1 = torch.randn(experts, 2 * inter, hidden, generator=g, dtype=torch.float64) / 3
    w2 = torch.randn(experts, hidden, inter, generator=g, dtype=torch.float64) / 3
    gating = torch.randn(tokens, experts, generator=g, dtype=torch.float64)
    return x, w1, w2, gating


def _moe_reference(x, w1, w2, gating, topk, renormalize):
    """vLLM's fused_moe semantics: softmax routing, top-k, optional renormalisation, SiLU-gated
    experts (gate = first half of w1's rows), weighted sum."""
    weights, ids = torch.softmax(gating, -1).topk(topk, dim=-1)
    if renormalize:
        weights = weights / weights.sum(-1, keepdim=True)
    out = torch.zeros_like(x)
    inter = w2.shape[-1]
    for t in range(x.shape[0]):
        for j in range(topk):
            e = int(ids[t, j])
            gate_up = w1[e] @ x[t]
            out[t] += weights[t, j] * (w2[e] @ (F.silu(gate_up[:inter]) * gate_up[inter:]))
    return out


@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("topk", [1, 2, 4])
def test_fused_moe_composes_the_routing_ops_into_vllms_fused_moe(topk, renormalize):
    npu = FakeNpu()
    x, w1, w2, gating = _moe()
    out = npu_fused_moe(x, w1, w2, gating, topk, renormalize, npu=npu)
    assert npu.names() == [
        "npu_moe_gating_top_k",
        "npu_moe_init_routing_v2",
        "npu_grouped_matmul",
        "npu_swiglu",
        "npu_grouped_matmul",
        "npu_moe_token_unpermute",
    ]
    torch.testing.assert_close(out, _moe_reference(x, w1, w2, gating, topk, renormalize))


def test_fused_moe_passes_vllm_ascends_modes():
    npu = FakeNpu()
    x, w1, w2, gating = _moe()
    npu_fused_moe(x, w1, w2, gating, 2, True, npu=npu)
    args, kw = npu.call("npu_moe_gating_top_k")
    assert args[0] is gating
    assert kw == {
        "k": 2,
        "bias": None,
        "k_group": 1,
        "group_count": 1,
        "group_select_mode": 1,
        "renorm": 0,  # renormalised afterwards in torch, as vllm-ascend does
        "norm_type": 0,
        "routed_scaling_factor": 1.0,
        "eps": 1e-20,
    }
    args, kw = npu.call("npu_moe_init_routing_v2")
    assert args[0] is x and args[1].dtype == torch.int32
    assert kw["active_num"] == 12 and kw["expert_num"] == 4
    assert kw["active_expert_range"] == [0, 4] and kw["quant_mode"] == -1
    assert (kw["expert_tokens_num_type"], kw["expert_tokens_num_flag"]) == (1, True)
    gmm1, gmm2 = [k for n, _, k in npu.calls if n == "npu_grouped_matmul"]
    assert gmm1["weight"][0].shape == (4, 8, 8)  # w1 (E, 2I, H) transposed to (E, H, 2I)
    assert gmm2["weight"][0].shape == (4, 4, 8)  # w2 (E, H, I) transposed to (E, I, H)
    for kw in (gmm1, gmm2):
        assert (kw["split_item"], kw["group_list_type"], kw["group_type"]) == (2, 1, 0)
        assert kw["group_list"].dtype == torch.int64 and int(kw["group_list"].sum()) == 12
    unpermute = npu.call("npu_moe_token_unpermute")[1]
    assert torch.all(unpermute["sorted_indices"] >= 0)


@pytest.mark.parametrize(
    ("experts", "topk", "gating_experts", "match"),
    [(4, 5, 4, "topk 5"), (4, 0, 4, "topk 0"), (2, 1, 2, "at least 3"), (4, 1, 3, "gating_output")],
)
def test_fused_moe_refuses_cases_the_gating_op_does_not_take(experts, topk, gating_experts, match):
    x, w1, w2, _ = _moe(experts=experts)
    gating = torch.zeros(x.shape[0], gating_experts, dtype=x.dtype)
    npu = FakeNpu()
    with pytest.raises(NpuUnsupported, match=match):
        npu_fused_moe(x, w1, w2, gating, topk, True, npu=npu)
    assert npu.calls == []  # refused before any NPU call


# ---------------------------------------------------------------------------------------------
# Entries: per version, only for ops the catalogue has, callable through the catalogue's calls


def test_entries_for_the_reference_version_name_the_adapters():
    ops = (*OPS, "paged_decode_attention", "fused_moe")
    for version in ("0.23.0", None):
        got = entries_for(version, ops)
        assert got["rms_norm"] == ("bi_props.targets.ascend_ops.npu_rms_norm",)
        assert got["fused_moe"] == ("bi_props.targets.ascend_ops.npu_fused_moe",)
        assert set(got) == set(ENTRIES) | set(ENGINE_ENTRIES)
    for entry in ENGINE_ENTRIES.values():
        module, _, attr = entry.rpartition(".")
        assert module == ascend_ops.__name__ and callable(getattr(ascend_ops, attr))


def test_entries_follow_the_catalogue_and_the_version():
    got = entries_for("0.23.0", tuple(OPS))
    for op in ("paged_decode_attention", "fused_moe"):
        assert (op in got) == (op in OPS)
    assert set(got) <= set(OPS)
    older = entries_for("0.22.0", tuple(OPS))
    assert older == {op: e for op, e in ENTRIES.items() if op in OPS}
    assert "rms_norm" not in older


def _case(op: str, entry: str, shape: tuple[int, ...], **options: Any) -> Case:
    return Case(op, entry, "float32", shape, (), "normal", 0, options)


@pytest.fixture
def fake_torch_npu(monkeypatch) -> FakeNpu:
    npu = FakeNpu()
    monkeypatch.setitem(sys.modules, "torch_npu", npu)  # what `import torch_npu` then returns
    return npu


def test_catalogue_calls_reach_the_adapters(fake_torch_npu):
    """The catalogue's own call functions, given the target's entries, run the adapters with
    the arguments they expect (and the adapters import torch_npu at call time)."""
    entries = entries_for("0.23.0", tuple(OPS))
    x, w = torch.randn(3, 8, generator=_gen(9)), torch.randn(8, generator=_gen(10))
    spec = OPS["rms_norm"]
    y = spec.call(entries["rms_norm"][0], (x, w), _case("rms_norm", "", (3, 8), eps=1e-5), [3])
    torch.testing.assert_close(y, F.rms_norm(x, (8,), w, 1e-5))
    r = torch.randn(3, 8, generator=_gen(11))
    case = _case("fused_add_rms_norm", "", (3, 8), eps=1e-6)
    out_x, out_r = OPS["fused_add_rms_norm"].call(
        entries["fused_add_rms_norm"][0], (x, r, w), case, [3]
    )
    torch.testing.assert_close(out_r, x + r, rtol=0, atol=0)
    torch.testing.assert_close(out_x, F.rms_norm(x + r, (8,), w, 1e-6))
    gated = torch.randn(3, 8, generator=_gen(12))
    case = _case("silu_and_mul", "", (3, 4))
    out = OPS["silu_and_mul"].call(entries["silu_and_mul"][0], (gated,), case, [3])
    torch.testing.assert_close(out, stock.silu_and_mul(gated), rtol=0, atol=0)
    assert fake_torch_npu.names() == ["npu_rms_norm", "npu_add_rms_norm", "npu_swiglu"]


def test_fused_moe_passes_the_absolute_row_index_as_vllm_ascend_does():
    """DeviceOperator.npu_moe_token_unpermute passes torch.abs(sorted_indices): a sign in
    npu_moe_init_routing_v2's expanded_row_idx must not reach npu_moe_token_unpermute."""

    class SignedRows(FakeNpu):
        def npu_moe_init_routing_v2(self, x, expert_idx, **kw):
            out, rows, counts, scale = super().npu_moe_init_routing_v2(x, expert_idx, **kw)
            return out, -rows, counts, scale

    npu = SignedRows()
    x, w1, w2, gating = _moe()
    out = npu_fused_moe(x, w1, w2, gating, 2, True, npu=npu)
    torch.testing.assert_close(out, _moe_reference(x, w1, w2, gating, 2, True))
