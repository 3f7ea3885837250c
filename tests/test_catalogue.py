"""catalogue.py and materialize.py: operand shapes and layouts, deterministic values, the soundness
of exact comparison (any summation order gives the same bits), and bounded references that hold
stock torch's CPU results and reject wrong ones.

The op calls here are stock torch: nothing installs the batch-invariant kernels in this process.
"""

from __future__ import annotations

import math
import sys

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from bi_props.catalogue import OPS, Reference, out_dtype
from bi_props.catalogue.strategies import cases
from bi_props.execution import materialize as M
from bi_props.model.case import Batch, Case, Companion
from bi_props.model.compare import (
    bits_to_float64,
    compare_bits,
    compare_to_reference,
    round_to_bits,
)
from bi_props.model.observation import Call, Observation, TensorBits
from bi_props.model.properties import reference as judge_reference
from bi_props.model.space import parse
from stock_calls import reversed_sum, round_to, run_stock, tree_sum

SMALL = parse(
    {
        "shapes": {
            "rows": {"min": 1, "max": 6},
            "dim": {"min": 0, "max": 40},
            "boundaries": [16, 32],
        },
        "batch": {"max_companions": 3, "companion_rows": {"min": 1, "max": 5}},
        "attention": {"length": {"min": 1, "max": 10}, "head_dims": [8, 16]},
    },
    "small.toml",
    "small",
)
EXACT = parse(
    {
        "values": {"choices": ["exact"]},
        "shapes": {
            "rows": {"min": 1, "max": 6},
            "dim": {"min": 0, "max": 64},
            "boundaries": [16, 32, 64],
        },
    },
    "exact.toml",
    "exact",
)
BOUNDED = parse(
    {
        "dtypes": {"choices": ["float32", "bfloat16"]},
        "values": {"choices": ["general", "wide"]},
        "shapes": {
            "rows": {"min": 1, "max": 6},
            "dim": {"min": 0, "max": 48},
            "boundaries": [16, 32],
        },
        "attention": {"length": {"min": 1, "max": 10}, "head_dims": [8, 16]},
    },
    "bounded.toml",
    "bounded",
)

CHEAP = dict(
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
BOUNDED_OPS = [
    "mm", "addmm", "linear", "sum", "mean", "softmax", "log_softmax", "rms_norm",
    "silu_and_mul", "gelu_and_mul", "layer_norm",
]  # fmt: skip
# References that are bitwise by design, whatever the values (a gather has no arithmetic).
BITWISE_OPS = ["embedding"]
# The ops whose exact value class this file can emulate (see _emulate).
EXACT_OPS = [
    "mm", "matmul", "bmm", "addmm", "linear", "sum", "mean", "add_rms_norm",
    "fused_add_rms_norm", "embedding",
]  # fmt: skip
# Ops with a float64 reference (the probe model has none: it is judged by logprobs/decode).
REFERENCE_OPS = [op for op, info in OPS.items() if "reference" in info.properties]


@pytest.fixture(autouse=True, scope="module")
def _stock_torch():
    register = sys.modules.get("bi_props.targets.kernels.register")
    assert register is None or not register._INSTALLED, "batch-invariant kernels are installed"


def _bits(t: torch.Tensor) -> np.ndarray:
    return M.bits(t)[3]


def _observe(outputs, refs) -> Observation:
    call = Call(outputs=tuple(TensorBits(*M.bits(t)) for t in outputs))
    return Observation("reference", "disabled", {"op": call}, references=tuple(refs))


# ---------------------------------------------------------------------------------------------
# The catalogue's shape functions


@pytest.mark.parametrize("op", list(OPS))
def test_operand_shapes_agree_with_operands(op):
    info = OPS[op]
    assert info.entries and info.shape_doc

    assert "determinism" in info.properties

    @settings(max_examples=15, **CHEAP)
    @given(cases(SMALL, op, "determinism"), st.integers(1, 9))
    def run(case, rows):
        specs = info.operands(case)
        shapes = info.operand_shapes(case, rows)
        assert len(shapes) == len(specs) == len(case.layouts)
        other = info.operand_shapes(case, rows + 3)
        for spec, shape, bigger in zip(specs, shapes, other, strict=True):
            if spec.batch_axis is None:  # shared: independent of the rows
                assert shape == bigger, (spec, case)
            else:  # per sample: the rows sit on the batch axis
                assert shape[spec.batch_axis] == rows, (spec, case)
                assert bigger[spec.batch_axis] == rows + 3
                assert shape[: spec.batch_axis] + shape[spec.batch_axis + 1 :] == (
                    bigger[: spec.batch_axis] + bigger[spec.batch_axis + 1 :]
                )
        assert len(info.output_batch_axes) >= 1

    run()


def test_shape_docs_match_operand_shapes():
    case = Case("mm", "torch.mm", "float32", (3, 5, 7), ("contiguous",) * 2, "general", 0)
    assert OPS["mm"].operand_shapes(case, 3) == ((3, 5), (5, 7))
    case = Case(
        "addmm",
        "torch.addmm",
        "float32",
        (3, 5, 7),
        ("contiguous",) * 3,
        "general",
        0,
        {"bias": "matrix"},
    )
    assert OPS["addmm"].operand_shapes(case, 2) == ((2, 7), (2, 5), (5, 7))
    case = Case(
        "linear",
        "F.linear",
        "float32",
        (3, 4, 5, 7),
        ("contiguous",) * 3,
        "general",
        0,
        {"bias": True, "form": "3d"},
    )
    assert OPS["linear"].operand_shapes(case, 2) == ((2, 4, 5), (7, 5), (7,))
    case = Case(
        "attention",
        OPS["attention"].entries[0],
        "float32",
        (6, 4, 2, 8),
        ("contiguous",) * 3,
        "general",
        0,
    )
    assert OPS["attention"].operand_shapes(case, 6) == ((6, 4, 8), (6, 2, 8), (6, 2, 8))


# ---------------------------------------------------------------------------------------------
# materialize


def _check_layout(t: torch.Tensor, layout: str) -> None:
    if layout == "contiguous":
        assert t.is_contiguous() and t.storage_offset() == 0
    elif layout == "offset":
        assert t.is_contiguous() and t.storage_offset() > 0
    elif layout == "strided" or (layout == "transposed" and t.dim() == 1):
        assert t.stride(-1) == 2
    elif layout == "transposed":
        rows, cols = t.shape[-2], t.shape[-1]
        if rows > 1 and cols > 1:  # with a unit dimension a transpose is still contiguous
            assert t.stride(-2) == 1 and t.stride(-1) == rows, (t.shape, t.stride())
            assert not t.is_contiguous()
    else:  # pragma: no cover
        raise AssertionError(layout)


@pytest.mark.parametrize("op", list(OPS))
def test_materialized_operands(op):
    info = OPS[op]

    @settings(max_examples=10, **CHEAP)
    @given(cases(SMALL, op, "determinism"))
    def run(case):
        case = case.with_padded(0)  # the packed layout (tests/test_padded.py: the padded one)
        samples = M.batch_samples(case)
        assert len(samples) == case.batch.size
        tensors = M.operands(case, samples, "cpu")
        specs = info.operands(case)
        assert len(tensors) == len(specs)
        for index, (t, spec, layout) in enumerate(zip(tensors, specs, case.layouts, strict=True)):
            if spec.tokens:  # token ids
                assert t.dtype == torch.int64
                assert t.numel() == 0 or 0 <= int(t.min()) <= int(t.max()) < spec.tokens
            else:
                assert t.dtype == getattr(torch, case.dtype)
            if spec.batch_axis is None:
                expected = info.operand_shapes(case, samples[0][1])[index]
            else:
                parts = [info.operand_shapes(case, rows)[index] for _, rows in samples]
                total = sum(p[spec.batch_axis] for p in parts)
                expected = list(parts[0])
                expected[spec.batch_axis] = total
                expected = tuple(expected)
            assert tuple(t.shape) == expected, (index, case)
            _check_layout(t, layout)
        # Deterministic, and the same values whatever the layouts.
        again = M.operands(case, samples, "cpu")
        plain = Case(
            case.op,
            case.entry,
            case.dtype,
            case.shape,
            ("contiguous",) * len(case.layouts),
            case.values,
            case.seed,
            dict(case.options),
            case.batch,
        )
        flat = M.operands(plain, samples, "cpu")
        for t, u, f in zip(tensors, again, flat, strict=True):
            np.testing.assert_array_equal(_bits(t), _bits(u))
            np.testing.assert_array_equal(_bits(t), _bits(f))
        # The needle's rows inside the batch are the needle's tensors alone; shared ones equal.
        # (Bitwise except NaN payloads: see test_needle_nan_bits_do_not_depend_on_the_batch.)
        alone = M.operands(case, M.needle(case), "cpu")
        offset = case.batch.needle_offset(case.shape[0])
        for t, a, spec in zip(tensors, alone, specs, strict=True):
            if spec.batch_axis is not None:
                t = t[M.row_slice(offset, case.shape[0], spec.batch_axis, t.dim())]
            if case.values == "special" and t.is_floating_point():
                got, want = M.to_float64(t), M.to_float64(a)
                np.testing.assert_array_equal(got, want)  # NaN meets NaN
                np.testing.assert_array_equal(
                    np.signbit(got[got == 0]), np.signbit(want[want == 0])
                )
            else:
                np.testing.assert_array_equal(_bits(t), _bits(a))
        # Value classes: the needle's (a companion's content may hold -inf, overflow, halves).
        values = [M.to_float64(t) for t, spec in zip(alone, specs, strict=True) if not spec.tokens]
        if case.values == "exact":
            amplitude = info.exact_amplitude(case)
            for v in values:
                assert np.all(v == np.round(v)) and np.all(np.abs(v) <= amplitude)
        elif case.values in ("general", "wide"):
            assert all(np.isfinite(v).all() for v in values)

    run()


def test_needle_nan_bits_do_not_depend_on_the_batch():
    for seed in range(40):
        batch = Batch(1, (Companion(1000 + seed, 40), Companion(2000 + seed, 40)))
        case = Case(
            "sum",
            "torch.sum",
            "bfloat16",
            (1, 10),
            ("contiguous",),
            "special",
            seed,
            {"dim": -1},
            batch,
        )
        (together,) = M.operands(case, M.batch_samples(case), "cpu")
        (alone,) = M.operands(case, M.needle(case), "cpu")
        offset = case.batch.needle_offset(1)
        np.testing.assert_array_equal(
            _bits(together[offset : offset + 1]), _bits(alone), err_msg=f"seed {seed}"
        )


def test_values_depend_on_seed_and_operand():
    case = Case("mm", "torch.mm", "float32", (4, 6, 5), ("contiguous",) * 2, "general", 11)
    a, b = M.values((4, 6), 11, 0, case), M.values((4, 6), 11, 0, case)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, M.values((4, 6), 12, 0, case))
    assert not np.array_equal(a, M.values((4, 6), 11, 1, case))
    # general values are float32 numbers (exactly representable)
    np.testing.assert_array_equal(a, a.astype(np.float32).astype(np.float64))


def test_special_values_include_specials():
    case = Case("sum", "torch.sum", "float32", (50, 40), ("contiguous",), "special", 3)
    v = M.values((50, 40), 3, 0, case)
    assert np.isnan(v).any() and np.isposinf(v).any() and np.isneginf(v).any()
    assert (np.signbit(v) & (v == 0)).any()


def test_apply_layout_keeps_values_and_shape():
    t = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4)
    for layout in ("contiguous", "transposed", "offset", "strided"):
        u = M.apply_layout(t, layout)
        assert torch.equal(u, t) and u.shape == t.shape
        _check_layout(u, layout)
    v = torch.arange(5, dtype=torch.bfloat16)
    assert torch.equal(M.apply_layout(v, "transposed"), v)
    assert M.apply_layout(v, "transposed").stride() == (2,)


def test_bits_of_a_tensor():
    t = torch.tensor([1.0, -0.0, float("inf")], dtype=torch.bfloat16)
    dtype, shape, device, bits = M.bits(M.apply_layout(t, "strided"))
    assert (dtype, shape, device) == ("bfloat16", (3,), "cpu")
    assert bits.tolist() == [0x3F80, 0x8000, 0x7F80] and bits.dtype == np.uint16


# ---------------------------------------------------------------------------------------------
# Exact comparison is sound: another summation order gives the same bits.


def _products(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """float32 products a[..., i, k] * b[..., k, j], shaped (..., i, k, j)."""
    return a.astype(np.float32)[..., :, :, None] * b.astype(np.float32)[..., None, :, :]


def _contract(a: np.ndarray, b: np.ndarray, how: str, start=0.0, store="float32") -> np.ndarray:
    vector = b.ndim == 1
    if vector:
        b = b[:, None]
    p = _products(a, b)
    if how == "tree":
        out = tree_sum(p, -2) + np.float32(start)
    else:
        out = reversed_sum(p, -2, start, store)
    return out[..., 0] if vector else out


def _emulate(case: Case, x: list[np.ndarray], how: str) -> list[np.ndarray]:
    """A float32 kernel computing the op in another order; float32 results, one per output.
    ``how``: "tree" (pairwise), "reversed" (sequential, last term first), or "narrow" (reversed,
    every partial result rounded into the output dtype)."""
    op = case.op
    store = out_dtype(case) if how == "narrow" else "float32"
    if op in ("mm", "matmul", "bmm"):
        return [_contract(x[0], x[1], how, store=store)]
    if op == "linear":
        bias = x[2].astype(np.float32) if len(x) == 3 else np.float32(0.0)
        if how == "tree":
            return [_contract(x[0], x[1].T, how) + bias]
        # the accumulator starts at the bias
        return [_contract(x[0], x[1].T, how, start=bias, store=store)]
    if op == "addmm":
        c, a, b = x
        beta, alpha = np.float32(case.opt("beta", 1)), np.float32(case.opt("alpha", 1))
        c_term = beta * c.astype(np.float32) if beta else np.float32(0.0)
        if how == "tree":
            return [c_term + alpha * _contract(a, b, how)]
        return [_contract(a * alpha, b, how, start=c_term, store=store)]
    if op in ("sum", "mean"):
        dims = (
            tuple(range(x[0].ndim))
            if case.opt("dim") is None
            else ((case.opt("dim"),) if isinstance(case.opt("dim"), int) else case.opt("dim"))
        )
        dims = tuple(sorted(d % x[0].ndim for d in dims))
        keep = [d for d in range(x[0].ndim) if d not in dims]
        moved = np.transpose(x[0].astype(np.float32), keep + list(dims))
        flat = moved.reshape((*moved.shape[: len(keep)], math.prod(moved.shape[len(keep) :])))
        if how == "tree":
            total = tree_sum(flat, -1) + np.float32(0)
        else:
            total = reversed_sum(flat, -1, store=store)
        n = flat.shape[-1]
        if op == "mean":
            total = total / np.float32(n) if how == "tree" else total * np.float32(1 / n)
        if case.opt("keepdim") and case.opt("dim") is not None:
            total = np.expand_dims(total, dims)
        return [np.asarray(total, dtype=np.float32)]
    if op in ("add_rms_norm", "fused_add_rms_norm"):
        total = x[0].astype(np.float32) + x[1].astype(np.float32)
        return [None, total]  # only the residual output is exact
    if op == "embedding":
        return [x[1].astype(np.float32)[x[0].astype(np.int64)]]  # a gather: no order at all
    raise AssertionError(op)  # pragma: no cover


# Selections: exact whatever the order, since they compare and never round; their
# exact class (small integers: ties) is checked against stock torch and the tree kernels in
# tests/test_engine_ops_b.py.
SELECTION_OPS = ["greedy_argmax", "top_k"]
# Ops that draw the exact class only for its ties (router logits), with every output inexact:
# their references stay bounded on it (tests/test_engine_ops_moe.py).
TIE_CLASS_OPS = ["fused_moe", "sample"]
# Ops whose outputs have dtypes of their own, whatever the inputs' (a sampler: int64 ids, float32
# logprobs).
FIXED_DTYPE_OPS = ["sample"]


@pytest.mark.parametrize("op", TIE_CLASS_OPS)
def test_tie_class_ops_claim_no_exact_output(op):
    spec = OPS[op]
    probe = Case(op, spec.entries[0], "float32", (1,) * 5, (), "exact", 0, {})
    assert spec.exact_amplitude(probe) >= 1
    assert spec.inexact_outputs == tuple(range(len(spec.output_batch_axes)))


@pytest.mark.parametrize(
    "op", [op for op in OPS if op not in EXACT_OPS + SELECTION_OPS + TIE_CLASS_OPS]
)
def test_other_ops_never_claim_exactness(op):
    """Exactness is claimed only where this file checks that it is sound."""

    props = OPS[op].properties
    prop = "reference" if "reference" in props else props[0]

    @settings(max_examples=15, **CHEAP)
    @given(cases(EXACT, op, prop))
    def run(case):
        assert OPS[op].exact_amplitude(case) == 0
        assert case.values != "exact"

    run()


@pytest.mark.parametrize("op", EXACT_OPS)
def test_exact_class_is_order_independent(op):
    """For exact inputs, float32 kernels summing in other orders (reversed sequential from a
    zeroed/bias-initialised accumulator; pairwise) round to exactly the reference's bits, once,
    to the output dtype; a kernel declaring 16-bit internals (every partial result rounded into
    the output dtype, "narrow") gets bitwise references only where its own range holds them."""
    space = parse(
        {
            "dtypes": {"choices": ["float32", "bfloat16", "float16"]},
            "values": {"choices": ["exact"]},
            "shapes": {
                "rows": {"min": 1, "max": 4},
                "dim": {"min": 0, "max": 300},
                "boundaries": [16, 64, 256],
            },
        },
        "exact16.toml",
        "exact16",
    )

    @settings(max_examples=40, **CHEAP)
    @given(cases(space, op, "reference"))
    def run(case):
        assume(case.values == "exact")
        assert OPS[op].exact_amplitude(case) >= 1
        dtype = out_dtype(case)
        args = M.operands(case, M.needle(case), "cpu")
        x = [M.to_float64(a) for a in args]
        lengths = [case.shape[0]]
        refs = OPS[op].reference(x, case, lengths)
        narrow_refs = OPS[op].references(x, case, lengths, "output")
        for how in ("reversed", "tree", "narrow"):
            if how == "narrow" and any(r.tolerance is not None for r in narrow_refs):
                continue  # bounded: the 16-bit range does not hold these partial sums
            for ref, emulated in zip(refs, _emulate(case, x, how), strict=True):
                if emulated is None:
                    continue
                assert ref.dtype == dtype
                assert emulated.shape == ref.value.shape, (how, case)
                want = round_to_bits(ref.value, dtype)
                got = round_to_bits(emulated.astype(np.float64), dtype)
                mismatch = compare_bits(got, want, dtype, f"{how} order vs reference")
                assert mismatch is None, f"{case!r}\n{mismatch}"
                if how == "narrow":  # within the 16-bit range: the reference is representable
                    np.testing.assert_array_equal(bits_to_float64(want, dtype), ref.value)

    run()


def test_exact_class_rounds_sixteen_bit_outputs_once_at_realistic_amplitudes():
    """A float32-accumulating kernel with a bf16 output is compared bit for bit at K = 4096,
    against the exact sum rounded once; a declared 16-bit accumulator gets the bounded check."""
    case = Case("mm", "torch.mm", "bfloat16", (4, 4096, 8), ("contiguous",) * 2, "exact", 3)
    amplitude = OPS["mm"].exact_amplitude(case)
    assert amplitude == 8
    x = [M.to_float64(a) for a in M.operands(case, M.needle(case), "cpu")]
    assert np.abs(x[0]).max() == 8
    (ref,) = OPS["mm"].references(x, case, [4])
    assert ref.tolerance is None and ref.precision == "float32"
    assert np.abs(ref.value).max() > 256  # beyond bf16's exact-integer range
    (narrow,) = OPS["mm"].references(x, case, [4], "output")
    assert narrow.tolerance is not None and narrow.precision == "bfloat16"
    assert np.isfinite(narrow.tolerance).all()


@pytest.mark.parametrize("op", ["addmm", "linear"])
def test_exact_class_survives_sixteen_bit_intermediates(op):
    """A kernel declaring 16-bit internals ("output") may round the product into the output
    dtype before it adds the bias (or scales by alpha): where its references are bitwise, still
    the same values for exact inputs (zeros may differ in sign, see
    test_stock_signed_zeros_pass_the_reference_property); elsewhere within its bound."""
    space = parse(
        {
            "dtypes": {"choices": ["bfloat16", "float16"]},
            "values": {"choices": ["exact"]},
            "shapes": {"rows": {"min": 1, "max": 4}, "dim": {"min": 0, "max": 40}},
        },
        "16.toml",
        "16",
    )

    @settings(max_examples=40, **CHEAP)
    @given(cases(space, op, "reference"))
    def run(case):
        assume(case.values == "exact")
        dtype = out_dtype(case)
        x = [M.to_float64(a) for a in M.operands(case, M.needle(case), "cpu")]
        (ref,) = OPS[op].references(x, case, [case.shape[0]], "output")
        if op == "addmm":
            c, a, b = x
            product = round_to(_contract(a, b, "reversed"), dtype)
            beta, alpha = case.opt("beta", 1), case.opt("alpha", 1)
            result = alpha * product.astype(np.float64) + (beta * c if beta else 0.0)
        else:
            product = round_to(_contract(x[0], x[1].T, "tree"), dtype)
            result = product.astype(np.float64) + (x[2] if len(x) == 3 else 0.0)
        if ref.tolerance is not None:
            bits = round_to_bits(result, dtype)
            mismatch = compare_to_reference(bits, ref.value, ref.tolerance, dtype, "narrow")
            assert mismatch is None, f"{case!r}\n{mismatch}"
            return
        got = bits_to_float64(round_to_bits(result, dtype), dtype)
        want = bits_to_float64(round_to_bits(ref.value, dtype), dtype)
        np.testing.assert_array_equal(got, want)  # == : -0.0 equals 0.0

    run()


@pytest.mark.parametrize("op", ["mm", "matmul", "bmm", "addmm", "linear", "sum", "mean"])
def test_stock_torch_is_exact_on_exact_inputs(op):
    """Stock torch's CPU kernels on exact inputs give the reference rounded once (up to the sign
    of a zero) wherever their declared precision makes the reference bitwise, and stay within
    the bound elsewhere: stock bf16 ``linear`` with a bias rounds the product to bf16 before it
    adds the bias (declared "output"; e.g. -260 for -258 at K = 24), which only a bound admits."""

    @settings(max_examples=15, **CHEAP)
    @given(cases(EXACT, op, "reference"))
    def run(case):
        assume(case.values == "exact")
        _, outputs, refs = run_stock(case)
        for out, ref in zip(outputs, refs, strict=True):
            if ref.tolerance is not None:
                mismatch = compare_to_reference(
                    _bits(out), ref.value, ref.tolerance, ref.dtype, "x"
                )
                assert mismatch is None, f"{case!r}\n{mismatch}"
                continue
            got = bits_to_float64(_bits(out), ref.dtype)
            want = bits_to_float64(round_to_bits(ref.value, ref.dtype), ref.dtype)
            np.testing.assert_array_equal(got, want, err_msg=repr(case))

    run()


@pytest.mark.parametrize("op", ["mm", "matmul", "bmm", "addmm", "linear", "sum", "mean"])
def test_exact_class_references_are_bitwise(op):
    shape = (2, 4, 4, 4) if op == "bmm" else (2, 4, 4)
    options = {"dim": -1} if op in ("sum", "mean") else {}
    probe = Case(op, "", "float32", shape, (), "exact", 5, options)
    layouts = ("contiguous",) * len(OPS[op].operands(probe))
    case = Case(op, OPS[op].entries[0], "float32", shape, layouts, "exact", 5, options)
    assert OPS[op].exact_amplitude(case) >= 1
    _, _, refs = run_stock(case)
    assert all(ref.tolerance is None for ref in refs)


def test_add_rms_norm_residual_is_bitwise_for_exact_inputs():
    case = Case(
        "add_rms_norm",
        OPS["add_rms_norm"].entries[0],
        "bfloat16",
        (3, 8),
        ("contiguous",) * 3,
        "exact",
        1,
    )
    _, outputs, refs = run_stock(case)
    y, residual = refs
    assert residual.tolerance is None and y.tolerance is not None
    assert judge_reference(_observe(outputs, refs)).ok
    general = Case(
        *[getattr(case, f) for f in ("op", "entry", "dtype", "shape", "layouts")], "general", 1
    )
    assert run_stock(general)[2][1].tolerance is not None


@pytest.mark.parametrize(
    ("op", "dtype", "options"),
    [
        ("mm", "float32", {}),
        ("addmm", "bfloat16", {"beta": 0, "alpha": -1, "bias": "vector"}),
        ("addmm", "float16", {"beta": 0, "alpha": -1, "bias": "vector"}),
    ],
)
def test_stock_signed_zeros_pass_the_reference_property(op, dtype, options):
    """Guard: stock torch returns -0.0 where an exact product is zero (float32 mm with K = 1 and
    a zero times a negative; 16-bit addmm with beta = 0, alpha = -1), while the float64 reference
    is +0.0. The sign of a zero depends on the order of operations, so an exact-class reference
    check must accept either zero (a plain bitwise comparison would reject stock torch)."""
    k = 1 if op == "mm" else 2
    a = torch.tensor([[0.0] * k, [0.0] * k, [2.0] * k], dtype=getattr(torch, dtype))
    b = torch.tensor([[-3.0, 0.0, 5.0]] * k, dtype=getattr(torch, dtype))
    case = Case(
        op,
        OPS[op].entries[0],
        dtype,
        (3, k, 3),
        ("contiguous",) * (2 if op == "mm" else 3),
        "exact",
        0,
        options,
    )
    args = [a, b] if op == "mm" else [torch.ones(3, dtype=a.dtype), a, b]
    (out,) = (OPS[op].call(case.entry, args, case, [3]),)
    refs = OPS[op].references([M.to_float64(t) for t in args], case, [3])
    got = bits_to_float64(_bits(out), dtype)
    assert (np.signbit(got) & (got == 0)).any(), "precondition: torch returned a -0.0"
    assert not (np.signbit(refs[0].value) & (refs[0].value == 0)).any()
    verdict = judge_reference(_observe((out,), refs))
    assert verdict.ok, verdict.message


# ---------------------------------------------------------------------------------------------
# Bounded references hold stock torch's results and reject wrong ones.


@pytest.mark.parametrize("op", [op for op in REFERENCE_OPS if op not in SELECTION_OPS])
def test_bounded_reference_contains_stock_torch(op):
    @settings(max_examples=25, **CHEAP)
    @given(cases(BOUNDED, op, "reference"))
    def run(case):
        _, outputs, refs = run_stock(case)
        assert len(outputs) == len(refs)
        for out, ref in zip(outputs, refs, strict=True):
            assert isinstance(ref, Reference)
            assert (ref.tolerance is None) == (op in BITWISE_OPS), case
            assert ref.dtype == str(out.dtype).removeprefix("torch.")
            assert op in FIXED_DTYPE_OPS or ref.dtype == out_dtype(case)
            assert tuple(out.shape) == ref.value.shape
            if ref.tolerance is not None:
                tol = np.broadcast_to(ref.tolerance, ref.value.shape)
                assert np.all((tol >= 0) | np.isnan(ref.value))  # mean of nothing: NaN, NaN
            mismatch = compare_to_reference(_bits(out), ref.value, ref.tolerance, ref.dtype, "x")
            assert mismatch is None, f"{case!r}\n{mismatch}"
        verdict = judge_reference(_observe(outputs, refs))
        assert verdict.ok, verdict.message

    run()


@pytest.mark.parametrize("op", [op for op in SELECTION_OPS if op in OPS])
@pytest.mark.parametrize("space", [BOUNDED, EXACT], ids=["bounded", "exact"])
def test_selection_reference_is_stock_torch_exactly(op, space):
    """Selections have exact references in every value class: stock torch's result
    (the drawn entry point), bit for bit, ties included (the exact class has many)."""

    @settings(max_examples=25, **CHEAP)
    @given(cases(space, op, "reference"))
    def run(case):
        _, outputs, refs = run_stock(case)
        assert len(outputs) == len(refs)
        for out, ref in zip(outputs, refs, strict=True):
            assert ref.tolerance is None
            assert ref.dtype == str(out.dtype).removeprefix("torch.")
            assert tuple(out.shape) == ref.value.shape
            mismatch = compare_to_reference(_bits(out), ref.value, None, ref.dtype, "x")
            assert mismatch is None, f"{case!r}\n{mismatch}"
        verdict = judge_reference(_observe(outputs, refs))
        assert verdict.ok, verdict.message

    run()


@pytest.mark.parametrize("op", BOUNDED_OPS)
def test_bounded_reference_rejects_a_perturbed_element(op):
    """Every case, none discarded: the bound is finite, the correctly rounded result passes, and
    at the element with the smallest relative slack the slack is under 1% of the value (for a
    float32-internal kernel: a 16-bit output's half ulp is 0.4%), so a 5% change there is
    caught, and only there. An all-zero output must reject a 1.0; an empty one has no element."""

    @settings(max_examples=20, **CHEAP)
    @given(cases(BOUNDED, op, "reference"))
    def run(case):
        _, _, (ref,) = run_stock(case, precision="float32")
        value = np.asarray(ref.value, dtype=np.float64)
        tol = np.broadcast_to(ref.tolerance, value.shape)
        finite = np.isfinite(value)
        assert np.isfinite(tol[finite]).all(), f"{case!r}: an infinite bound"
        perfect = round_to_bits(value, ref.dtype)
        assert compare_to_reference(perfect, value, ref.tolerance, ref.dtype, "x") is None
        if not finite.any():  # an empty output, or the mean of nothing (NaN, NaN allowed)
            assert value.size == 0 or np.isnan(value).all(), repr(case)
            return
        if op == "layer_norm" and case.shape[1] == 1:
            # One element normalises nothing: y = 0 + b, but a kernel computing x * rstd - mean
            # * rstd with an fma (stock bf16 does: 1.2e-6 for 0) errs by u |x| / sqrt(eps),
            # which the bound must allow; no 1% slack there (the bound is exercised above).
            return
        flat, flat_tol = value.ravel(), tol.ravel()
        with np.errstate(divide="ignore", invalid="ignore"):
            slack = np.where(finite.ravel() & (flat != 0), flat_tol / np.abs(flat), np.inf)
        index = int(np.argmin(slack))
        values = bits_to_float64(perfect, ref.dtype).ravel()
        if np.isfinite(slack[index]):
            assert slack[index] < 0.01, f"{case!r}: slack {slack[index]:.3g} of the value"
            values[index] *= 1.05
        else:  # every element is zero (an empty sum, a zero row): nothing relative to change
            index = int(np.flatnonzero(finite.ravel())[0])
            assert flat_tol[index] < 0.01, f"{case!r}: slack {flat_tol[index]:.3g} around 0"
            values[index] = 1.0
        wrong = round_to_bits(values.reshape(value.shape), ref.dtype)
        mismatch = compare_to_reference(wrong, value, ref.tolerance, ref.dtype, "perturbed")
        assert mismatch is not None, repr(case)
        assert mismatch.mismatched == 1
        assert np.ravel_multi_index(mismatch.first_index, value.shape) == index
        wrong_out = torch.from_numpy(bits_to_float64(wrong, ref.dtype)).to(
            getattr(torch, ref.dtype)
        )
        assert not judge_reference(_observe((wrong_out,), (ref,))).ok

    run()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_bounded_reference_rejects_a_transposed_operand(dtype):
    for seed in range(5):
        case = Case("mm", "torch.mm", dtype, (8, 8, 8), ("contiguous",) * 2, "general", seed)
        (a, b), (out,), (ref,) = run_stock(case)
        assert compare_to_reference(_bits(out), ref.value, ref.tolerance, dtype, "x") is None
        wrong = torch.mm(a, b.T)
        mismatch = compare_to_reference(_bits(wrong), ref.value, ref.tolerance, dtype, "x")
        assert mismatch is not None and mismatch.mismatched > 32


def test_bounded_reference_rejects_softmax_over_the_wrong_dim():
    case = Case(
        "softmax", "torch.softmax", "float32", (6, 9), ("contiguous",), "general", 2, {"dim": -1}
    )
    (x,), _, (ref,) = run_stock(case)
    wrong = torch.softmax(x, 0)
    assert compare_to_reference(_bits(wrong), ref.value, ref.tolerance, "float32", "x") is not None


def test_bounded_reference_rejects_rms_norm_without_weight():
    case = Case("rms_norm", "F.rms_norm", "bfloat16", (4, 32), ("contiguous",) * 2, "general", 9)
    (x, _), _, (ref,) = run_stock(case)
    wrong = torch.nn.functional.rms_norm(x, (32,))
    mismatch = compare_to_reference(_bits(wrong), ref.value, ref.tolerance, "bfloat16", "x")
    assert mismatch is not None and mismatch.mismatched > 64
