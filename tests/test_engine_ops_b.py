"""The inference ops added for issue 13 (ops-b): rotary_embedding, greedy_argmax, top_k.

Per op: the float64 reference agrees with the stock torch entry point (within the stated bound,
or exactly) on random cases in float32 and bfloat16, and catches a planted perturbation (the
bound is not vacuous); the cpu target's kernel passes the reference and is bitwise
batch-invariant (a sample alone vs the same sample inside a larger batch at another position).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import bi_props.ops as stock_ops
from bi_props import materialize
from bi_props.case import Batch, Case, Companion
from bi_props.catalogue import OPS
from bi_props.compare import compare_to_reference
from bi_props.targets.kernels import rotary

DTYPES = ("float32", "bfloat16")


def _case(op: str, dtype: str, shape: tuple, options: dict, seed: int, values: str = "general"):
    provisional = Case(op, "", dtype, shape, (), values, 0, options)
    layouts = ("contiguous",) * len(OPS[op].operands(provisional))
    return Case(op, OPS[op].entries[0], dtype, shape, layouts, values, seed, options)


def _outputs(result) -> tuple:
    return tuple(result) if isinstance(result, (tuple, list)) else (result,)


def _check_reference(case: Case, outputs, precision: str) -> list[str]:
    """Mismatch messages of ``outputs`` against the op's reference (empty: all agree)."""
    args = materialize.operands(case, materialize.needle(case), "cpu")
    refs = OPS[case.op].references(
        [materialize.to_float64(a) for a in args], case, [case.shape[0]], precision
    )
    problems = []
    for out, ref in zip(_outputs(outputs), refs, strict=True):
        dtype, shape, _, bits = materialize.bits(out)
        assert (dtype, shape) == (ref.dtype, ref.value.shape)
        mismatch = compare_to_reference(bits, ref.value, ref.tolerance, dtype, case.op)
        if mismatch is not None:
            problems.append(str(mismatch))
    return problems


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and np.array_equal(materialize.bits(a)[3], materialize.bits(b)[3])
    )


def _batch_invariant(case: Case, kernel, position: int, companions) -> None:
    """The needle's rows alone == the same rows inside a batch (companions around it)."""
    spec = OPS[case.op]
    alone = _outputs(kernel(materialize.operands(case, materialize.needle(case), "cpu"), case))
    batched = case.with_batch(Batch(position=position, companions=tuple(companions)))
    samples = materialize.batch_samples(batched)
    together = _outputs(kernel(materialize.operands(batched, samples, "cpu"), batched))
    offset = sum(rows for _, rows in samples[:position])
    for axis, a, t in zip(spec.output_batch_axes, alone, together, strict=True):
        rows = t.narrow(axis, offset, case.shape[0])
        assert _same_bits(rows, a), f"{case!r}: rows in the batch differ from alone"


# ---------------------------------------------------------------------------------------------
# rotary_embedding

ROTARY_SHAPES = [
    (1, 1, 1, 2, 2, 1),
    (5, 2, 1, 8, 8, 17),
    (7, 4, 2, 16, 6, 100),
    (17, 2, 2, 64, 32, 4096),
    (3, 1, 1, 128, 128, 33),
]


def _rotary_kernel(args, case):
    positions, query, key, cache = args
    return rotary.rotary_embedding(
        positions, query, key, case.shape[3], cache, case.opt("is_neox", True)
    )


def _rotary_stock(args, case):
    positions, query, key, cache = args
    return stock_ops.rotary_embedding(
        positions, query, key, case.shape[3], cache, case.opt("is_neox", True)
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("neox", [True, False])
def test_rotary_reference_agrees_with_stock_and_kernel(dtype: str, neox: bool) -> None:
    for seed, shape in enumerate(ROTARY_SHAPES):
        for values in ("general", "wide"):
            case = _case("rotary_embedding", dtype, shape, {"is_neox": neox}, seed, values)
            args = materialize.operands(case, materialize.needle(case), "cpu")
            # stock: vLLM's forward_native, in the operands' dtype (declared "output")
            assert not _check_reference(case, _rotary_stock(args, case), "output")
            # the cpu kernel: float32 internals
            assert not _check_reference(case, _rotary_kernel(args, case), "float32")


@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_reference_catches_a_planted_perturbation(dtype: str) -> None:
    """One ulp-scale nudge of a single rotated element, the wrong rotation convention, a cache
    row off by one position, or bf16 products under a float32 declaration: each is caught."""
    case = _case("rotary_embedding", dtype, (9, 2, 1, 16, 16, 64), {"is_neox": True}, 5)
    args = materialize.operands(case, materialize.needle(case), "cpu")
    q, k = _rotary_kernel(args, case)
    nudged = q.clone()
    nudged[3, 2] = nudged[3, 2] * (1 + 8 * torch.finfo(q.dtype).eps) + 4 * torch.finfo(q.dtype).eps
    assert _check_reference(case, (nudged, k), "float32")
    positions, query, key, cache = args
    gptj = rotary.rotary_embedding(positions, query, key, 16, cache, False)
    assert _check_reference(case, gptj, "float32")
    shifted = rotary.rotary_embedding((positions + 1) % 64, query, key, 16, cache, True)
    assert _check_reference(case, shifted, "float32")
    if dtype == "float32":
        low = stock_ops.rotary_embedding(
            positions, query.bfloat16(), key.bfloat16(), 16, cache.bfloat16(), True
        )
        assert _check_reference(case, tuple(t.float() for t in low), "float32")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("neox", [True, False])
def test_rotary_kernel_is_batch_invariant(dtype: str, neox: bool) -> None:
    for seed, shape in enumerate(ROTARY_SHAPES):
        case = _case("rotary_embedding", dtype, shape, {"is_neox": neox}, seed)
        companions = [Companion(seed + 100, 300), Companion(seed + 200, 1), Companion(7, 16)]
        for position in (0, 1, 3):
            _batch_invariant(case, _rotary_kernel, position, companions)
