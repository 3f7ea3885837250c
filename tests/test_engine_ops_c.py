"""paged_decode_attention: KV-cache decode attention with a block table.

A sample is one sequence: its rows are its KV tokens, its output one row (its decode token). The
call pages each sequence's keys and values into blocks at positions Hypothesis draws (option
``placement``), so the same needle's blocks move when it is batched.

Checked here: the paged layout (every token has its own slot in the pool; placement 0 is the
plain order, others permute it); the float64 reference contains the stock split-KV composite and
the cpu kernel (float32 and bf16, GQA, several block sizes and placements) and rejects planted
perturbations (one nudged element, a stale slot read, the wrong kv head, the wrong block, bf16
weights under a float32 declaration); the cpu kernel is bitwise batch-invariant and independent
of the placement, while the stock composite is not batch-invariant (what the negative control
needs to see); the needle's output row is cut out by ``OpSpec.output_rows``; reproducers run;
and (slow) ``bi-props fuzz`` on the cpu target gives no finding over the full property set in
both switch states, its negative control seeing the stock composite's variance.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import bi_props.ops as stock_ops
from bi_props.catalogue import OPS, PAGED_SPARE_BLOCKS, paged_decode_call, paged_layout
from bi_props.execution import materialize
from bi_props.model.case import Batch, Case, Companion
from bi_props.model.compare import compare_to_reference
from bi_props.model.property_spec import controls_of
from bi_props.targets.kernels import paged_attention

OP = "paged_decode_attention"
SPEC = OPS[OP]
DTYPES = ("float32", "bfloat16")
# (context, heads, kv_heads, head_dim, block_size), placement: one key, GQA 4:1 and 2:1, MHA,
# block sizes 1, 3, 16 and 17 (a block larger than the sequence), a long context
SHAPES = [
    ((1, 1, 1, 8, 1), 0),
    ((5, 4, 1, 16, 3), 7),
    ((17, 4, 2, 8, 16), 0),
    ((40, 2, 2, 32, 17), 12345),
    ((129, 8, 2, 16, 5), 99),
    ((300, 2, 1, 64, 16), 3),
]


def _case(dtype: str, shape: tuple, placement: int, seed: int, values: str = "general") -> Case:
    layouts = ("contiguous", "transposed", "strided")
    return Case(OP, SPEC.entries[0], dtype, shape, layouts, values, seed, {"placement": placement})


def _run(function, case: Case, samples=None):
    """``function`` (an entry point's signature) on the case's paged operands."""
    samples = samples or materialize.needle(case)
    args = materialize.operands(case, samples, "cpu")
    return args, paged_decode_call(function, args, case, [rows for _, rows in samples])


def _stock(case: Case, samples=None):
    return _run(stock_ops.paged_decode_attention, case, samples)


def _kernel(case: Case, samples=None):
    return _run(paged_attention.paged_decode_attention, case, samples)


def _problems(case: Case, args, out: torch.Tensor, precision: str = "float32") -> list[str]:
    """Mismatch messages of ``out`` against the reference for the needle (empty: all agree)."""
    inputs = [materialize.to_float64(a) for a in args]
    (ref,) = SPEC.references(inputs, case, [case.shape[0]], precision)
    dtype, shape, _, bits = materialize.bits(out)
    assert (dtype, shape) == (ref.dtype, ref.value.shape)
    mismatch = compare_to_reference(bits, ref.value, ref.tolerance, dtype, OP)
    return [] if mismatch is None else [str(mismatch)]


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and np.array_equal(materialize.bits(a)[3], materialize.bits(b)[3])


# ---------------------------------------------------------------------------------------------
# The paged layout


@pytest.mark.parametrize("placement", [0, 1, 2**31 - 1])
@pytest.mark.parametrize("block_size", [1, 3, 16])
def test_every_token_has_its_own_slot_in_its_own_blocks(block_size: int, placement: int) -> None:
    lengths = [5, 1, 33, 16]
    table, slots, num_blocks = paged_layout(lengths, block_size, placement)
    counts = [-(-n // block_size) for n in lengths]
    assert num_blocks == sum(counts) + PAGED_SPARE_BLOCKS
    assert table.dtype == np.int32 and table.shape == (4, max(counts))
    assert len(set(slots.tolist())) == len(slots) == sum(lengths)  # no two tokens share a slot
    assert slots.min() >= 0 and slots.max() < num_blocks * block_size
    owned = [table[b, :count].tolist() for b, count in enumerate(counts)]
    assert len({x for row in owned for x in row}) == sum(counts)  # no block owned twice
    start = 0
    for b, n in enumerate(lengths):  # token t of sequence b: block table[b, t // bs], t % bs
        t = np.arange(n)
        want = table[b, t // block_size] * block_size + t % block_size
        assert np.array_equal(slots[start : start + n], want)
        start += n
    plain = [x for row in owned for x in row]
    if placement == 0:
        assert plain == list(range(sum(counts)))  # batch order: what shrinking reaches
    elif block_size == 1:  # 57 + 2 blocks: a permutation leaves them in order with p ~ 1/59!
        assert plain != list(range(sum(counts)))


def test_the_placement_moves_the_blocks_not_the_result() -> None:
    """The kernel's bits do not depend on where the blocks sit (nor on the stale slots)."""
    for dtype in DTYPES:
        shape = (37, 4, 2, 16, 4)
        _, first = _kernel(_case(dtype, shape, 0, 5))
        for placement in (1, 77, 2**30):
            _, moved = _kernel(_case(dtype, shape, placement, 5))
            assert _same_bits(first, moved), placement
        tables = {paged_layout([37], 4, p)[0].tobytes() for p in (0, 1, 77, 2**30)}
        assert len(tables) == 4  # the block table really changed each time


# ---------------------------------------------------------------------------------------------
# Reference


@pytest.mark.parametrize("dtype", DTYPES)
def test_reference_contains_the_stock_composite_and_the_kernel(dtype: str) -> None:
    for seed, (shape, placement) in enumerate(SHAPES):
        for values in ("general", "wide"):
            case = _case(dtype, shape, placement, seed, values)
            args, out = _stock(case)
            assert out.shape == (1, shape[1], shape[3]) and out.dtype == getattr(torch, dtype)
            assert not _problems(case, args, out), case  # stock: float32 internals
            args, out = _kernel(case)
            assert not _problems(case, args, out), case


@pytest.mark.parametrize("dtype", DTYPES)
def test_reference_rejects_planted_perturbations(dtype: str) -> None:
    """A nudged element (2048 float32 eps: the bound, the attention op's, is relative to
    sum p |v| and allows ~500 eps of the value here, of which the kernel uses ~1%; 2 ulps in
    bf16, where the final rounding dominates), one
    stale slot read, query head h reading kv head h % Hkv (not h // (H / Hkv)), one block from
    the wrong place, and (float32) attention weights rounded to bf16."""
    case = _case(dtype, (45, 4, 2, 16, 8), 21, 3)
    args, good = _kernel(case)
    assert not _problems(case, args, good)
    eps = torch.finfo(good.dtype).eps
    nudged = good.clone()
    nudged[0, 1, 3] = nudged[0, 1, 3] * (1 + (2048 if dtype == "float32" else 2) * eps)
    assert _problems(case, args, nudged)

    def kernel(q, k_cache, v_cache, table, lens, scale):
        return paged_attention.paged_decode_attention(q, k_cache, v_cache, table, lens, scale)

    def one_more(q, k_cache, v_cache, table, lens, scale):  # reads the stale slot after the end
        return kernel(q, k_cache, v_cache, table, lens + 1, scale)

    def modulo_heads(q, k_cache, v_cache, table, lens, scale):
        swapped = q.reshape(q.shape[0], 2, 2, q.shape[2]).transpose(1, 2).reshape(q.shape)
        out = kernel(swapped, k_cache, v_cache, table, lens, scale)
        return out.reshape(out.shape[0], 2, 2, out.shape[2]).transpose(1, 2).reshape(out.shape)

    def wrong_block(q, k_cache, v_cache, table, lens, scale):
        moved = table.clone()
        moved[0, 2] = moved[0, 5]  # block 2's keys and values replaced by block 5's
        return kernel(q, k_cache, v_cache, moved, lens, scale)

    for wrong in (one_more, modulo_heads, wrong_block):
        _, out = _run(wrong, case)
        assert _problems(case, args, out), wrong.__name__
    if dtype == "float32":

        def bf16_weights(q, k_cache, v_cache, table, lens, scale):
            out = torch.empty_like(q)
            for b in range(q.shape[0]):
                n = int(lens[b])
                blocks = table[b, : -(-n // k_cache.shape[1])].long()
                keys = k_cache[blocks].reshape(-1, 2, 16)[:n].repeat_interleave(2, 1)
                values = v_cache[blocks].reshape(-1, 2, 16)[:n].repeat_interleave(2, 1)
                p = torch.softmax(torch.einsum("hd,lhd->hl", q[b], keys) * scale, -1)
                out[b] = torch.einsum("hl,lhd->hd", p.bfloat16().float(), values)
            return out

        _, out = _run(bf16_weights, case)
        assert _problems(case, args, out)


# ---------------------------------------------------------------------------------------------
# Batch invariance and the needle's output row


def test_output_rows_cut_one_row_per_sequence() -> None:
    case = _case("float32", (9, 2, 1, 8, 4), 0, 1)
    assert SPEC.needle_output(case) == (0, 1)
    batched = case.with_batch(Batch(2, (Companion(1, 300), Companion(2, 7), Companion(3, 1))))
    assert SPEC.needle_output(batched) == (2, 1)  # two sequences before it: row 2
    samples = materialize.batch_samples(batched)
    _, out = _kernel(batched, samples)
    assert out.shape == (4, 2, 8)


@pytest.mark.parametrize("dtype", (*DTYPES, "float16"))
def test_kernel_is_bitwise_batch_invariant(dtype: str) -> None:
    for seed, (shape, placement) in enumerate(SHAPES):
        case = _case(dtype, shape, placement, seed)
        _, alone = _kernel(case)
        companions = (Companion(seed + 100, 512), Companion(seed + 200, 1), Companion(7, 16))
        for position in (0, 1, 3):
            batched = case.with_batch(Batch(position, companions))
            _, together = _kernel(batched, materialize.batch_samples(batched))
            offset, rows = SPEC.needle_output(batched)
            assert _same_bits(together[offset : offset + rows], alone), (case, position)


def test_stock_composite_is_batch_variant() -> None:
    """The negative control's premise: the stock split-KV decode splits a 40-key needle into 3
    splits alone and into 8 of 64 next to a 512-key sequence, and its bits change."""
    case = _case("float32", (40, 4, 2, 16, 8), 0, 11)
    _, alone = _stock(case)
    batched = case.with_batch(Batch(0, (Companion(12, 512),)))
    _, together = _stock(batched, materialize.batch_samples(batched))
    assert not _same_bits(together[0:1], alone)
    assert torch.allclose(together[0:1], alone, rtol=1e-5, atol=1e-6)  # variance, not an error


# ---------------------------------------------------------------------------------------------
# The entry points' contract and the reproducer


def test_the_op_is_defined_by_one_spec() -> None:
    """One OpSpec defines the op; everything else refers to it by name."""
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        ["git", "grep", "-n", f'name="{OP}"', "--", "src", "tests"],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.splitlines()
    assert len(out) == 1 and out[0].startswith("src/bi_props/catalogue/attention.py:"), out
    assert controls_of(SPEC) == ("batch_invariance",)  # stock can be batch-variant: a real control


def test_both_entry_points_refuse_malformed_arguments_alike() -> None:
    q, cache = torch.zeros(2, 4, 8), torch.zeros(3, 4, 2, 8)
    table = torch.tensor([[0, 1], [2, 0]], dtype=torch.int32)
    bad = [
        ((q, cache, cache, table, torch.tensor([9, 1])), "seq_lens"),  # 9 > 2 blocks of 4
        ((q, cache, cache, table, torch.tensor([0, 1])), "seq_lens"),  # no key at all
        ((q, cache, cache, table + 5, torch.tensor([3, 1])), "block ids"),
        ((torch.zeros(2, 3, 8), cache, cache, table, torch.tensor([3, 1])), "multiple"),
    ]
    for args, message in bad:
        for function in (stock_ops.paged_decode_attention, paged_attention.paged_decode_attention):
            with pytest.raises(RuntimeError, match=message):
                function(*args)


@pytest.mark.parametrize("prop", ["reference", "batch_invariance"])
def test_reproducer_runs_and_compares(prop: str, tmp_path: Path) -> None:
    """A standalone reproducer pages the cache as the call does and compares the needle's one
    output row; the (correct) kernel does not reproduce a finding."""
    from bi_props.execution import execute
    from bi_props.reporting import repro
    from bi_props.targets.cpu import CpuTarget

    target = CpuTarget()
    case = _case("bfloat16", (19, 4, 2, 8, 4), 5, 1)
    if prop == "batch_invariance":
        case = case.with_batch(Batch(1, (Companion(3, 40), Companion(4, 2))))
    exported = execute.export(prop, case, target)
    assert exported.get("rows", 1) == 1
    setup = {"enabled": target.repro_setup(True), "disabled": target.repro_setup(False)}
    finding = {"property": prop, "switch": "enabled", "kind": "mismatch", "message": ""}
    path = tmp_path / f"{prop}.py"
    path.write_text(repro.script(finding, case, exported, setup, target.kernel_prefix))
    proc = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "does NOT reproduce" in proc.stdout
    if prop == "reference":
        assert "output 0 vs the float64 reference: within the stated bound" in proc.stdout


# ---------------------------------------------------------------------------------------------
# End to end: the full property set on the cpu target, both switch states

SPACE = """
[hypothesis]
max_examples = 8
[runner]
example_timeout_s = 60
start_timeout_s = 180
control_examples = 60
[dtypes]
choices = ["float32", "bfloat16"]
[shapes]
rows = { min = 1, max = 96 }
dim = { min = 1, max = 32 }
boundaries = [16, 32, 64]
[batch]
max_companions = 3
companion_rows = { min = 1, max = 160 }
[attention]
head_dims = [8, 16]
"""


@pytest.mark.campaign
@pytest.mark.slow
def test_fuzz_on_the_cpu_target_gives_no_finding_and_the_control_sees_variance(
    clean_cpu_campaign,
) -> None:
    clean_cpu_campaign(OP, SPACE, budget_s=300, seed=7, examples_per_cell=30)
