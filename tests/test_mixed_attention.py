"""mixed_attention: a batch of prefills, prefill chunks over a cached prefix and decode
tokens, as ``flash_attn_varlen_func`` takes it (cu_seqlens_q, cu_seqlens_k, the causal mask
aligned to the end). The strategy reaches every kind next to every other and shrinks to the
smallest case; the float64 reference equals a direct loop; the bound holds for the stock
composite and the batch-invariant kernel and catches a sloppy kernel; the mask is aligned to the
end in all three (reference, stock, kernel)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, Phase, find, given, settings

import bi_props.ops as ops
from bi_props.catalogue import OPS
from bi_props.catalogue.attention import mixed_call, mixed_queries, sample_queries
from bi_props.catalogue.strategies import cases
from bi_props.execution import materialize as M
from bi_props.model.case import Batch, Case, Companion, parse_case
from bi_props.model.space import load_profile
from bi_props.targets.kernels import attention as kernel

CPU = load_profile("cpu")
FIND = settings(
    max_examples=3000,
    deadline=None,
    database=None,
    derandomize=True,
    phases=(Phase.generate, Phase.shrink),
)
DRAWN = settings(
    max_examples=40, deadline=None, database=None, suppress_health_check=list(HealthCheck)
)
ENTRY = "bi_props.ops.mixed_attention"


def _kinds(case: Case) -> list[str]:
    """Each sequence's kind in batch order: prefill, chunk or decode."""
    samples = M.batch_samples(case)
    queries = mixed_queries(case, [rows for _, rows in samples])
    kinds = []
    for (_, keys), q in zip(samples, queries, strict=True):
        kinds.append("prefill" if q == keys else "decode" if q == 1 else "chunk")
    return kinds


def _needle_kind(case: Case) -> str:
    return _kinds(case)[case.batch.position]


def _companion_kinds(case: Case) -> list[str]:
    kinds = _kinds(case)
    del kinds[case.batch.position]
    return kinds


# -- the strategy --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("needle", "companion"),
    [("decode", "prefill"), ("chunk", "decode"), ("prefill", "chunk"), ("decode", "chunk")],
)
def test_every_kind_of_needle_meets_every_other_kind(needle: str, companion: str) -> None:
    strategy = cases(CPU, "mixed_attention", "batch_invariance")
    found = find(
        strategy,
        lambda c: _needle_kind(c) == needle and companion in _companion_kinds(c),
        settings=FIND,
    )
    assert _needle_kind(found) == needle and companion in _companion_kinds(found)
    # shrunk: the fewest keys each kind needs (Hypothesis does not always delete the one-token
    # prefills before the companion that matters: their number is not asserted)
    fewest = {"prefill": 1, "decode": 2, "chunk": 3}
    if needle == "chunk":  # its cached prefix shrinks to one token (its length not always: a
        assert found.shape[0] - found.shape[1] == 1, found  # long draw may stay long)
    else:
        assert found.shape[0] == fewest[needle], found
    assert all(c.rows <= fewest[companion] for c in found.batch.companions), found


def test_shrinks_to_the_smallest_case() -> None:
    """Small needle (a one-token prefill), one prefill companion: what a failure shrinks to."""
    found = find(cases(CPU, "mixed_attention", "batch_invariance"), lambda c: True, settings=FIND)
    assert found.shape[:2] == (CPU.attention_length.min, CPU.attention_length.min), found
    assert found.batch.companions == (Companion(0, CPU.attention_length.min),), found


def test_a_companion_with_exactly_ten_query_tokens_and_a_long_needle_are_reached() -> None:
    strategy = cases(CPU, "mixed_attention", "batch_invariance")
    ten = find(strategy, lambda c: max(_queries(c)) >= 10, settings=FIND)
    assert max(_queries(ten)) == 10, ten
    long = find(strategy, lambda c: c.shape[0] > 8 and c.shape[1] == 1, settings=FIND)
    assert long.shape[:2] == (9, 1), long


def _queries(case: Case) -> list[int]:
    return mixed_queries(case, [rows for _, rows in M.batch_samples(case)])


def test_companion_queries_round_trip_and_stay_out_of_other_reprs() -> None:
    batch = Batch(1, (Companion(5, 40, 1), Companion(6, 7)))
    case = Case(ENTRY[8:], ENTRY, "float32", (9, 3, 2, 1, 8), ("contiguous",) * 3, "general", 1)
    case = case.with_batch(batch)
    assert parse_case(repr(case)) == case
    assert repr(Companion(6, 7)) == "Companion(seed=6, rows=7)"
    assert _queries(case) == [1, 3, 7]
    assert OPS["mixed_attention"].needle_output(case) == (1, 3)  # after the decode companion's 1
    with pytest.raises(ValueError, match="neither the needle nor its batch"):
        mixed_queries(case, [9, 40])
    assert [sample_queries(10, q) for q in (0, 1, 4, 10, 99)] == [10, 1, 4, 10, 10]


# -- the reference: a direct float64 loop, the mask aligned to the end ----------------------------


def _loop(q, k, v, keys, queries, heads, kv_heads):
    """Attention query by query, head by head, key by key, in float64: sequence b's query i (its
    token keys_b - queries_b + i) sees keys j <= keys_b - queries_b + i."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    out, start = [], 0
    for lk, lq in zip(keys, queries, strict=True):
        for i in range(lq):
            token = start + lk - lq + i
            row = np.zeros((heads, v.shape[-1]))
            for h in range(heads):
                g = h // (heads // kv_heads)
                seen = range(start, token + 1)
                s = [sum(q[token, h, d] * k[j, g, d] for d in range(q.shape[-1])) for j in seen]
                s = np.array(s) * scale
                w = np.exp(s - s.max())
                row[h] = (w[:, None] * v[start : token + 1, g]).sum(0) / w.sum()
            out.append(row)
        start += lk
    return np.array(out).reshape(-1, heads, v.shape[-1])


@pytest.mark.parametrize("position", [0, 1, 2])
def test_reference_equals_a_direct_loop(position: int) -> None:
    batch = Batch(position, (Companion(3, 6, 1), Companion(4, 5)))
    case = Case("mixed_attention", ENTRY, "float32", (7, 3, 4, 2, 8), ("contiguous",) * 3,
                "general", 11).with_batch(batch)  # fmt: skip
    samples = M.batch_samples(case)
    keys = [rows for _, rows in samples]
    x = [M.to_float64(t) for t in M.operands(case, samples, "cpu")]
    (ref,) = OPS["mixed_attention"].reference(x, case, keys)
    expected = _loop(*x, keys, mixed_queries(case, keys), 4, 2)
    assert ref.value.shape == expected.shape == (3 + 1 + 5, 4, 8)
    np.testing.assert_allclose(ref.value, expected, rtol=1e-12, atol=1e-12)


def _random(keys, queries, heads=2, kv_heads=1, dim=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(sum(keys), heads, dim, generator=g)
    k = torch.randn(sum(keys), kv_heads, dim, generator=g)
    v = torch.randn(sum(keys), kv_heads, dim, generator=g)
    return q, k, v


@pytest.mark.parametrize("function", [ops.mixed_attention, kernel.mixed_attention])
def test_mask_is_aligned_to_the_end(function) -> None:
    """A decode row sees all its keys, a chunk's query i its prefix and i + 1 new keys: changing
    a key after a query's own token changes nothing before it; the one at its token changes it."""
    keys, queries = [9, 6, 4], [1, 6, 3]
    q, k, v = _random(keys, queries)
    out = mixed_call(function, (q, k, v), keys, queries)
    expected = _loop(*(t.double().numpy() for t in (q, k, v)), keys, queries, 2, 1)
    np.testing.assert_allclose(out.double().numpy(), expected, rtol=1e-5, atol=1e-6)
    # the chunk's (third sequence, keys 15..18, queries at tokens 16, 17, 18) second query sees
    # keys up to token 17: moving key 18 (the last) moves only the third query
    moved = v.clone()
    moved[18] += 100.0
    after = mixed_call(function, (q, k, moved), keys, queries)
    assert torch.equal(after[:9], out[:9])  # the other sequences
    assert torch.equal(after[7 + 0], out[7 + 0]) and torch.equal(after[8], out[8])
    assert not torch.equal(after[9], out[9])
    # the decode row (sequence 0) sees all 9 keys, including the first
    moved = v.clone()
    moved[0] += 100.0
    assert not torch.equal(mixed_call(function, (q, k, moved), keys, queries)[0], out[0])


def test_the_stock_composite_refuses_what_flash_attention_refuses() -> None:
    q, k, v = _random([4], [4])
    cu = torch.tensor([0, 4])
    with pytest.raises(RuntimeError, match="query lengths"):
        ops.mixed_attention(q, k[:2], v[:2], cu, torch.tensor([0, 2]))
    with pytest.raises(RuntimeError, match="1 query sequences but 2 key sequences"):
        ops.mixed_attention(q, k, v, cu, torch.tensor([0, 2, 4]))
    with pytest.raises(RuntimeError, match="cu_seqlens_k must rise"):
        kernel.mixed_attention(q, k, v, cu, torch.tensor([0, 3]))


# -- the bound -----------------------------------------------------------------------------------


def _within_bound(case: Case, function) -> bool:
    samples = M.batch_samples(case)
    lengths = [rows for _, rows in samples]
    args = M.operands(case, samples, "cpu")
    out = mixed_call(function, args, lengths, mixed_queries(case, lengths))
    x = [M.to_float64(t) for t in args]
    (ref,) = OPS["mixed_attention"].references(x, case, lengths, "output")
    got = M.to_float64(out)
    assert got.shape == ref.value.shape
    return bool(np.all(np.abs(got - ref.value) <= ref.tolerance))


SMALL = load_profile("ci")


def _plain(case: Case) -> Case:
    """The case with plain companions: the bound is checked on every row of the batch, and a
    companion of -inf keys has no finite attention to bound."""
    companions = tuple(replace(c, content="plain") for c in case.batch.companions)
    return case.with_batch(replace(case.batch, companions=companions))


@DRAWN
@given(cases(SMALL, "mixed_attention", "batch_invariance").map(_plain))
def test_the_stock_composite_and_the_kernel_stay_within_the_bound(case: Case) -> None:
    assert _within_bound(case, ops.mixed_attention), case
    assert _within_bound(case, kernel.mixed_attention), case


@DRAWN
@given(cases(SMALL, "mixed_attention", "batch_invariance"))
def test_the_kernel_is_batch_invariant(case: Case) -> None:
    alone = M.operands(case, M.needle(case), "cpu")
    samples = M.batch_samples(case)
    lengths = [rows for _, rows in samples]
    batched = mixed_call(
        kernel.mixed_attention, M.operands(case, samples, "cpu"), lengths,
        mixed_queries(case, lengths),
    )  # fmt: skip
    own = mixed_call(kernel.mixed_attention, alone, [case.shape[0]], [_needle_q(case)])
    offset, rows = OPS["mixed_attention"].needle_output(case)
    assert torch.equal(batched[offset : offset + rows], own), case


def _needle_q(case: Case) -> int:
    return sample_queries(case.shape[0], case.shape[1])


def _sloppy(q, k, v, cu_seqlens_q, cu_seqlens_k, scale=None, causal=True):
    """The batch-invariant kernel with its probabilities rounded to bf16 before P @ V."""
    out = []
    for (qa, qb), (ka, kb) in zip(
        zip(cu_seqlens_q[:-1].tolist(), cu_seqlens_q[1:].tolist(), strict=True),
        zip(cu_seqlens_k[:-1].tolist(), cu_seqlens_k[1:].tolist(), strict=True),
        strict=True,
    ):
        lq, lk = qb - qa, kb - ka
        qs = q[qa:qb].float().transpose(0, 1)
        group = q.shape[1] // k.shape[1]
        ks = k[ka:kb].float().repeat_interleave(group, 1).transpose(0, 1)
        vs = v[ka:kb].float().repeat_interleave(group, 1).transpose(0, 1)
        s = qs @ ks.transpose(1, 2) * scale
        future = torch.arange(lk)[None, :] > lk - lq + torch.arange(lq)[:, None]
        p = s.masked_fill(future, float("-inf")).softmax(-1).bfloat16().float()
        out.append((p @ vs).transpose(0, 1))
    return torch.cat(out).to(q.dtype)


def test_a_sloppy_kernel_violates_the_bound() -> None:
    batch = Batch(0, (Companion(1, 40, 1), Companion(2, 30, 12)))
    caught = 0
    for seed in range(5):
        case = Case("mixed_attention", ENTRY, "float32", (33, 1, 2, 1, 16), ("contiguous",) * 3,
                    "general", seed).with_batch(batch)  # fmt: skip
        caught += not _within_bound(case, _sloppy)
        assert _within_bound(case, kernel.mixed_attention)
    assert caught == 5


def test_stock_control_example_is_batch_variant() -> None:
    """The op's ControlExample: a decode token over 8 keys alone vs beside a 255-token prefill
    differs on stock CPU attention (x86 ATen)."""
    (example,) = OPS["mixed_attention"].control_examples
    companions = tuple(Companion(1 + i, rows) for i, rows in enumerate(example.companions))
    case = Case("mixed_attention", ENTRY, "float32", example.shape, ("contiguous",) * 3,
                "general", example.seed).with_batch(Batch(0, companions))  # fmt: skip
    samples = M.batch_samples(case)
    lengths = [rows for _, rows in samples]
    batched = mixed_call(ops.mixed_attention, M.operands(case, samples, "cpu"), lengths,
                         mixed_queries(case, lengths))  # fmt: skip
    alone = mixed_call(ops.mixed_attention, M.operands(case, M.needle(case), "cpu"), [8], [1])
    assert not torch.equal(batched[:1], alone)


def test_the_report_plot_counts_companions_with_query_tokens() -> None:
    """report.html's shape-space point sums every companion's rows, those with queries too."""
    from bi_props.reporting.data import case_point

    batch = Batch(0, (Companion(5, 40, 1), Companion(6, 7)))
    case = Case("mixed_attention", ENTRY, "float32", (9, 3, 2, 1, 8), ("contiguous",) * 3,
                "general", 1).with_batch(batch)  # fmt: skip
    assert case_point(repr(case)) == ("float32", 9 + 40 + 7, 3)
