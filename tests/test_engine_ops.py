"""The engine ops silu_and_mul, gelu_and_mul, fused_add_rms_norm, layer_norm,
embedding.

Per op: the float64 reference agrees with the stock entry point within its stated bound (float32
and bf16) and is not vacuous (a planted perturbation and a bf16-intermediate variant are caught);
the cpu target's kernel passes the reference and is bitwise batch-invariant (rows alone vs the
same rows inside a larger batch at another position); each name is defined by one spec.
The kernels are called directly here (``install()`` is one-way: tests/test_kernels.py checks the
routing in a subprocess).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from bi_props import catalogue
from bi_props.execution.materialize import bits, needle, operands
from bi_props.model.case import Case
from bi_props.model.compare import compare_to_reference, unit_roundoff
from bi_props.targets.cpu import stock_precision
from bi_props.targets.kernels import activation, gather, normalization

NEW_OPS = ("silu_and_mul", "gelu_and_mul", "fused_add_rms_norm", "layer_norm", "embedding")
DTYPES = ("float32", "bfloat16")
# (rows, h): tile edges, a prime, 1
SHAPES = ((1, 1), (3, 16), (5, 17), (2, 63), (4, 128), (7, 257))


def _options(op: str, seed: int) -> dict:
    if op == "gelu_and_mul":
        return {"approximate": ("none", "tanh")[seed % 2]}
    if op == "fused_add_rms_norm":
        return {"eps": (1e-6, 1e-5)[seed % 2]}
    if op == "layer_norm":
        return {"affine": seed % 2 == 0, "eps": (1e-5, 1e-6)[(seed // 2) % 2]}
    return {}


def _case(op: str, dtype: str, rows: int, h: int, seed: int, values: str = "general") -> Case:
    spec = catalogue.OPS[op]
    shape = (rows, (1, 16, 17, 257)[seed % 4], h) if op == "embedding" else (rows, h)
    probe = Case(op, spec.entries[0], dtype, shape, (), values, seed, _options(op, seed))
    layouts = tuple(
        ("contiguous", "transposed", "offset", "strided")[(seed + i) % 4]
        for i in range(len(spec.operands(probe)))
    )
    return Case(op, spec.entries[0], dtype, shape, layouts, values, seed, _options(op, seed))


def _cases(op: str, dtype: str, count: int = 4):
    for seed in range(count):
        for rows, h in SHAPES:
            yield _case(op, dtype, rows, h, seed)


def kernel(case: Case, args: list) -> tuple:
    """The cpu target's batch-invariant kernel for ``case``'s op, called directly."""
    op = case.op
    if op == "silu_and_mul":
        return (activation.silu_and_mul(args[0]),)
    if op == "gelu_and_mul":
        return (activation.gelu_and_mul(args[0], case.opt("approximate")),)
    if op == "fused_add_rms_norm":
        x, r = args[0].clone(), args[1].clone()
        normalization.fused_add_rms_norm(x, r, args[2], case.opt("eps"))
        return (x, r)
    if op == "layer_norm":
        x, *affine = args
        w, b = affine if affine else (None, None)
        return (normalization.layer_norm(x, [x.shape[-1]], w, b, case.opt("eps")),)
    if op == "embedding":
        return (gather.embedding(args[1], args[0]),)
    raise AssertionError(op)


def stock(case: Case, args: list) -> tuple:
    result = catalogue.OPS[case.op].call(case.entry, args, case, [case.shape[0]])
    return tuple(result) if isinstance(result, tuple) else (result,)


def _inputs(args: list) -> list[np.ndarray]:
    from bi_props.execution.materialize import to_float64

    return [to_float64(a) for a in args]


def mismatches(case: Case, args: list, outputs: tuple, precision: str) -> list:
    refs = catalogue.OPS[case.op].references(_inputs(args), case, [case.shape[0]], precision)
    assert len(refs) == len(outputs)
    found = []
    for i, (out, ref) in enumerate(zip(outputs, refs, strict=True)):
        dtype, shape, _, array = bits(out)
        assert dtype == ref.dtype and shape == ref.value.shape, (case, i, dtype, shape)
        bad = compare_to_reference(array, ref.value, ref.tolerance, ref.dtype, f"output {i}")
        if bad is not None:
            found.append((i, bad))
    return found


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", NEW_OPS)
def test_stock_entry_agrees_with_reference(op: str, dtype: str) -> None:
    for case in _cases(op, dtype):
        args = operands(case, needle(case), "cpu")
        bad = mismatches(case, args, stock(case, args), stock_precision(op))
        assert not bad, (case, bad)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", NEW_OPS)
def test_kernel_agrees_with_reference(op: str, dtype: str) -> None:
    for case in _cases(op, dtype):
        args = operands(case, needle(case), "cpu")
        bad = mismatches(case, args, kernel(case, args), "float32")
        assert not bad, (case, bad)


def _perturbed(t: torch.Tensor, ulps: int) -> torch.Tensor:
    """``t`` moved ``ulps`` units in the last place away from zero (bit patterns + ulps)."""
    view = {torch.float32: torch.int32, torch.bfloat16: torch.int16}[t.dtype]
    raw = t.contiguous().view(view)
    moved = (raw + ulps).view(t.dtype)
    return torch.where(t == 0, t, moved)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", NEW_OPS)
def test_reference_catches_a_planted_perturbation(op: str, dtype: str) -> None:
    """The bound is not vacuous: the kernel's first output moved by a few ulps (64 in float32, 2
    in bf16; 1 for the bitwise embedding) fails the reference on every case with h > 8."""
    ulps = 1 if op == "embedding" else (64 if dtype == "float32" else 2)
    for case in _cases(op, dtype):
        if case.shape[-1] < 8:
            continue
        args = operands(case, needle(case), "cpu")
        first, *rest = kernel(case, args)
        bad = mismatches(case, args, (_perturbed(first, ulps), *rest), "float32")
        assert [i for i, _ in bad] == [0], case


def _bf16_intermediate(case: Case, args: list) -> tuple:
    """The op with one intermediate rounded through bfloat16 (everything else in float32)."""
    b16 = torch.bfloat16
    op, dtype = case.op, args[0].dtype
    if op in ("silu_and_mul", "gelu_and_mul"):
        x = args[0].float()
        h = x.shape[-1] // 2
        if op == "silu_and_mul":
            act = torch.nn.functional.silu(x[:, :h])
        else:
            act = torch.nn.functional.gelu(x[:, :h], approximate=case.opt("approximate"))
        return ((act.to(b16).float() * x[:, h:]).to(dtype),)
    if op == "fused_add_rms_norm":
        total = (args[0].float() + args[1].float()).to(dtype)
        t = total.float()
        normed = t / torch.sqrt((t * t).mean(-1, keepdim=True) + case.opt("eps"))
        return ((normed.to(b16).float() * args[2].float()).to(dtype), total)
    if op == "layer_norm":
        x = args[0].float()
        normed = torch.nn.functional.layer_norm(x, (x.shape[-1],), None, None, case.opt("eps"))
        normed = normed.to(b16).float()
        if len(args) == 3:
            normed = normed * args[1].float() + args[2].float()
        return (normed.to(dtype),)
    raise AssertionError(op)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", NEW_OPS[:4])
def test_reference_catches_a_bf16_intermediate(op: str, dtype: str) -> None:
    """A kernel that rounds one intermediate to bf16 is caught: always for a float32 output, and
    for a bf16 output on a good share of cases (a second rounding is at most one more half ulp)."""
    caught = total = 0
    for case in _cases(op, dtype, count=8):
        if case.shape[-1] < 16:
            continue
        args = operands(case, needle(case), "cpu")
        total += 1
        caught += bool(mismatches(case, args, _bf16_intermediate(case, args), "float32"))
    share = caught / total
    assert share == 1.0 if dtype == "float32" else share >= 0.25, (caught, total)


@pytest.mark.parametrize("dtype", (*DTYPES, "float16"))
@pytest.mark.parametrize("op", NEW_OPS)
def test_kernel_is_bitwise_batch_invariant(op: str, dtype: str) -> None:
    """The needle's rows alone == the same rows inside a 40-row batch at offset 11 (and 0)."""
    from bi_props.model.case import Batch, Companion

    for seed in range(3):
        for rows, h in ((1, 17), (3, 64), (2, 257)):
            case = _case(op, dtype, rows, h, seed)
            for position, companions in ((1, (11, 26)), (0, (37,))):
                batch = Batch(position, tuple(Companion(seed + 5 + i, c) for i, c in
                                              enumerate(companions)))  # fmt: skip
                bcase = case.with_batch(batch)
                alone = kernel(case, operands(case, needle(case), "cpu"))
                together = kernel(bcase, operands(bcase, batch.samples(seed, rows), "cpu"))
                offset = batch.needle_offset(rows)
                for a, t in zip(alone, together, strict=True):
                    assert torch.equal(bits_tensor(a), bits_tensor(t[offset : offset + rows])), (
                        bcase,
                        op,
                    )


def bits_tensor(t: torch.Tensor) -> torch.Tensor:
    view = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}
    return t.contiguous().view(view[t.dtype])


def test_fused_add_rms_norm_is_in_place_and_returns_the_mutated_inputs() -> None:
    import bi_props.ops as ops

    g = torch.Generator().manual_seed(0)
    x, r, w = (torch.randn(4, 8, generator=g) for _ in range(3))
    w = w[0]
    x0, r0 = x.clone(), r.clone()
    out_x, out_r = ops.fused_add_rms_norm(x, r, w, 1e-6)
    assert out_x is x and out_r is r
    assert torch.equal(r, x0 + r0)
    assert torch.equal(x, torch.nn.functional.rms_norm(x0 + r0, (8,), w, 1e-6))
    xk, rk = x0.clone(), r0.clone()
    normalization.fused_add_rms_norm(xk, rk, w, 1e-6)
    assert torch.equal(rk, r) and torch.allclose(xk, x, rtol=1e-5, atol=1e-6)


def test_reference_bound_is_finite_and_tight_in_bf16() -> None:
    """bf16 output, float32 internals: each bound stays within ~1.5 bf16 ulps of the value."""
    u = unit_roundoff("bfloat16")
    for op in NEW_OPS[:4]:
        for case in _cases(op, "bfloat16", count=2):
            args = operands(case, needle(case), "cpu")
            refs = catalogue.OPS[op].references(_inputs(args), case, [case.shape[0]], "float32")
            for ref in refs:
                tol = np.asarray(ref.tolerance)
                assert np.isfinite(tol).all(), case
                big = np.abs(ref.value) > 1e-3
                assert (tol[big] <= 3 * u * np.abs(ref.value[big]) + 1e-30).all(), (case, op)


def test_each_op_name_is_defined_by_one_spec() -> None:
    root = Path(__file__).resolve().parents[1]
    for op in NEW_OPS:
        out = subprocess.run(
            ["git", "grep", "-n", f'name="{op}"', "--", "src", "tests"],
            cwd=root,
            capture_output=True,
            text=True,
            check=False,
        ).stdout.splitlines()
        assert len(out) == 1 and out[0].startswith("src/bi_props/catalogue/"), (op, out)
        assert op in catalogue.BUILTIN_OPS


def test_an_op_stock_cannot_make_batch_variant_has_no_blind_control() -> None:
    """embedding is a gather: stock torch is batch-invariant on it too, so a negative control
    could only ever be blind. Its switched-off batch_invariance is neither control nor cell;
    the switched-on one is judged as for every op."""
    from bi_props.catalogue import OPS, cells, controls

    assert OPS["embedding"].negative_control is False
    assert controls(["embedding"]) == []
    assert ("embedding", "batch_invariance", "enabled") in cells(["embedding"])
    assert ("embedding", "batch_invariance", "disabled") not in cells(["embedding"])
    assert controls(["layer_norm"]) == [("layer_norm", "batch_invariance")]


def test_norm_kernels_refuse_a_wrong_normalized_shape_as_aten_does() -> None:
    """rms_norm and layer_norm share one shape check, worded as aten's layer_norm words it (aten's
    rms_norm writes "[*4]" where layer_norm writes "[*, 4]")."""
    import torch
    import torch.nn.functional as F

    from bi_props.targets.kernels import normalization as N

    x = torch.ones(2, 3)
    with pytest.raises(RuntimeError) as expected:
        F.layer_norm(x, [4])
    for kernel in (N.rms_norm, N.layer_norm):
        with pytest.raises(RuntimeError) as got:
            kernel(x, [4])
        assert str(got.value) == str(expected.value), kernel
