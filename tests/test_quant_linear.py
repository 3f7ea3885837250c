"""quant_linear (dynamic per-token activation quantization + GEMM + dequantization): the reference
is exact where claimed and bounded elsewhere, the CPU kernel is batch-invariant beside an
outlier companion, the stock composite passes the reference, a per-tensor scale (the planted
library) does not survive an outlier companion, and the op is drawn, registered and routed."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, Phase, find, given, settings

import bi_props.ops as ops
from bi_props.catalogue import OPS
from bi_props.catalogue.quantized import QMAX, quantize_rows
from bi_props.catalogue.strategies import cases
from bi_props.execution import materialize as M
from bi_props.model.case import Batch, Case, Companion
from bi_props.model.compare import compare_to_reference
from bi_props.model.space import load_profile
from bi_props.targets.kernels import quant
from bi_props.targets.kernels.register import ROUTES, SWAPPED_OPS

sys.path.insert(0, str(Path(__file__).parent / "planted"))
import planted_per_tensor_scale as planted

SPACE = load_profile("cpu")
DRAWN = settings(
    database=None,
    max_examples=40,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    phases=[Phase.generate],
)


def _case(qdtype: str, *companions: Companion, dtype: str = "float32", seed: int = 5) -> Case:
    batch = Batch(0, companions) if companions else None
    layouts = ("contiguous", "contiguous")
    options = {"qdtype": qdtype}
    return Case("quant_linear", "bi_props.ops.quant_linear", dtype, (3, 40, 24), layouts,
                "general", seed, options, batch)  # fmt: skip


def _within(kernel, case: Case) -> None:
    x, w = M.operands(case, M.needle(case), "cpu")
    inputs = [M.to_float64(t) for t in (x, w)]
    (ref,) = OPS["quant_linear"].references(inputs, case, [case.shape[0]])
    got = kernel(x, w, case.opt("qdtype"))
    actual = M.bits(got)[3]
    mismatch = compare_to_reference(actual, ref.value, ref.tolerance, ref.dtype, "out")
    assert mismatch is None, (case, str(mismatch))


def test_the_reference_of_a_hand_computed_case_is_exact():
    # scales of exactly 1 (amax 127, or 448): int8 q = [127, -3, 0 (0.5 to even), 2 (1.5 to
    # even)] and [127, 1, 2, 2], [-127, 0, 0, 64]: 16129 - 3 + 4 and -16129 + 128
    x = np.array([[127.0, -3.0, 0.5, 1.5], [0.0, 0.0, 0.0, 0.0]])
    w = np.array([[127.0, 1.0, 2.0, 2.5], [-127.0, 0.0, 0.0, 63.5]])
    case = Case("quant_linear", "bi_props.ops.quant_linear", "float32", (2, 4, 2),
                ("contiguous",) * 2, "general", 0, {"qdtype": "int8"})  # fmt: skip
    (ref,) = OPS["quant_linear"].references([x, w], case, [2])
    assert ref.value.tolist() == [[16130.0, -16001.0], [0.0, 0.0]]
    assert np.all(ref.tolerance < 16130 * 2.0**-20)  # a few float32 ulps, not more
    tx, tw = torch.tensor(x, dtype=torch.float32), torch.tensor(w, dtype=torch.float32)
    for fn in (ops.quant_linear, quant.quant_linear):
        assert fn(tx, tw, "int8").tolist() == [[16130.0, -16001.0], [0.0, 0.0]]
    # e4m3, scales 1 (amax 448): 3.3 -> 3.25 (steps of 0.25 in [2, 4)), 5 exact
    x8, w8 = np.array([[448.0, 1.0, 3.3, -0.0]]), np.array([[448.0, 2.0, 1.0, 5.0]])
    q, s = quantize_rows(x8, "float8_e4m3fn")
    assert q.tolist() == [[448.0, 1.0, 3.25, 0.0]] and s.tolist() == [[1.0]]
    expected = 448.0 * 448.0 + 2.0 + 3.25
    case8 = Case("quant_linear", "bi_props.ops.quant_linear", "float32", (1, 4, 1),
                 ("contiguous",) * 2, "general", 0, {"qdtype": "float8_e4m3fn"})  # fmt: skip
    assert OPS["quant_linear"].references([x8, w8], case8, [1])[0].value.tolist() == [[expected]]
    t8, u8 = torch.tensor(x8, dtype=torch.float32), torch.tensor(w8, dtype=torch.float32)
    assert quant.quant_linear(t8, u8, "float8_e4m3fn").tolist() == [[expected]]


@pytest.mark.parametrize("qdtype", ["int8", "float8_e4m3fn"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_reference_quantizes_as_torch_does_bit_for_bit(qdtype, dtype):
    """The numpy quantization (float32 scale and quotient, the rounding) equals the torch one,
    on normal values, a zero row, tiny rows (scale floor) and a row with an outlier."""
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 200, generator=g) * torch.logspace(-3, 3, 64)[:, None]
    x[0] = 0.0
    x[1] = x[1] * 1e-40 if dtype == torch.float32 else x[1] * 1e-7
    x[2, 7] = 3e4
    x = x.to(dtype)
    q, s = ops.quantize_rows(x, qdtype)
    rq, rs = quantize_rows(M.to_float64(x), qdtype)
    assert np.array_equal(q.double().numpy(), rq) and np.array_equal(s.double().numpy(), rs)
    assert np.abs(rq).max() <= QMAX[qdtype] and not np.isnan(rq).any()
    assert rs[0, 0] == 2.0**-126 and np.all(rq[0] == 0)


@given(cases(SPACE, "quant_linear", "reference"))
@settings(DRAWN)
def test_the_cpu_kernel_is_within_the_reference_on_drawn_cases(case):
    _within(quant.quant_linear, case)


@given(cases(SPACE, "quant_linear", "reference"))
@settings(DRAWN)
def test_the_stock_composite_is_within_the_reference_on_drawn_cases(case):
    _within(ops.quant_linear, case)


@pytest.mark.parametrize("qdtype", ["int8", "float8_e4m3fn"])
def test_the_stock_composite_is_within_the_reference_beside_the_control_batch(qdtype):
    """The control's batch (1 row among 256): stock's float32 GEMM varies there (M = 1 against a
    blocked GEMM) and both of its results stay within the bound."""
    case = replace_shape(_case(qdtype, Companion(9, 255)), (1, 256, 16))
    x, w = M.operands(case, M.batch_samples(case), "cpu")
    alone, inside = ops.quant_linear(x[:1], w, qdtype), ops.quant_linear(x, w, qdtype)[:1]
    assert not torch.equal(alone, inside)  # the negative control has something to see
    _within(ops.quant_linear, replace_shape(_case(qdtype), (1, 256, 16)))


def replace_shape(case: Case, shape: tuple[int, ...]) -> Case:
    from dataclasses import replace

    return replace(case, shape=shape, options=dict(case.options))


def _alone_and_inside(kernel, case: Case) -> tuple[torch.Tensor, torch.Tensor]:
    x_alone, w = M.operands(case, M.needle(case), "cpu")
    x_batch, _ = M.operands(case, M.batch_samples(case), "cpu")
    rows = case.shape[0]
    return kernel(x_alone, w, case.opt("qdtype")), kernel(x_batch, w, case.opt("qdtype"))[:rows]


@pytest.mark.parametrize("qdtype", ["int8", "float8_e4m3fn"])
@pytest.mark.parametrize("content", ["plain", "outlier", "huge", "tiny"])
def test_the_cpu_kernel_is_batch_invariant_beside_any_companion(qdtype, content):
    case = _case(qdtype, Companion(9, 300, content=content), Companion(4, 17))
    alone, inside = _alone_and_inside(quant.quant_linear, case)
    assert M.bits(alone)[3].tobytes() == M.bits(inside)[3].tobytes()


@pytest.mark.parametrize("qdtype", ["int8", "float8_e4m3fn"])
def test_a_per_tensor_scale_varies_beside_an_outlier_only(qdtype):
    outlier = _case(qdtype, Companion(9, 40, content="outlier"))
    plain = _case(qdtype, Companion(9, 40))
    x, _ = M.operands(outlier, M.batch_samples(outlier), "cpu")
    assert float(x[3:].abs().max()) > planted.FLOOR > float(x[:3].abs().max())
    alone, inside = _alone_and_inside(planted.quant_linear, outlier)
    assert not torch.equal(alone, inside)
    alone, inside = _alone_and_inside(planted.quant_linear, plain)
    assert torch.equal(alone, inside)
    _within(planted.quant_linear, _case(qdtype))  # the needle alone: within the bound


def test_the_strategy_draws_both_qdtypes_and_an_outlier_companion():
    strategy = cases(SPACE, "quant_linear", "batch_invariance")
    quick = settings(DRAWN, max_examples=2000, phases=[Phase.generate, Phase.shrink])
    for qdtype in ("int8", "float8_e4m3fn"):  # find raises where no draw has it
        find(strategy, lambda c, q=qdtype: c.opt("qdtype") == q, settings=quick)
    find(strategy, lambda c: any(x.content == "outlier" for x in c.batch.companions),
         settings=quick)  # fmt: skip


def test_the_registry_lists_the_op_and_the_cpu_target_routes_it():
    spec = OPS["quant_linear"]
    assert spec.entries == ("bi_props.ops.quant_linear",)
    assert spec.option_choices == {"qdtype": ("int8", "float8_e4m3fn")}
    assert ROUTES["quant_linear"] == ("bi_props_cpu::quant_linear",)
    assert SWAPPED_OPS["quant_linear"] == "quant_linear"


@pytest.mark.parametrize("dtype", [torch.float64, torch.int64, torch.complex64])
def test_other_dtypes_raise_alike_in_the_kernel_and_the_stock_composite(dtype):
    x, w = torch.ones(2, 3).to(dtype), torch.ones(4, 3).to(dtype)
    for fn in (ops.quant_linear, quant.quant_linear):
        with pytest.raises(RuntimeError, match="quant_linear: x and weight must share a dtype"):
            fn(x, w, "int8")
