"""Normalisation: rms_norm, add_rms_norm, vLLM's in-place fused_add_rms_norm, layer_norm.

One op's helpers, shape strategy and OpSpec (in ``OPS``) side by side (``bi_props.catalogue``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..model.bounds import (
    LAMBDA,
    _chain_spread,
    _output_rounding,
    _sum_error,
)
from ..model.case import Case
from ..model.compare import unit_roundoff
from ..model.opspec import (
    ControlExample,
    Operand,
    OpSpec,
    Reference,
)
from ._shared import (
    Shape,
    _entry_function,
    _never_exact,
    _rows_padded,
    _stock_or_import,
)

RMS_NORM_BOUND = (
    "relative _sum_error(sum x^2) / (2 sum x^2) + 5.5 u_acc on each output (/h and + eps halved by"
    " the sqrt, a 2-ulp rsqrt, x * rstd, * weight; 8 u_acc for 16-bit internals); plus one"
    " rounding to the output dtype unless it is the internals' own, and the smallest normal"
)


def _rms_norm_operands(case: Case) -> tuple[Operand, ...]:
    return (Operand("input", 0), Operand("weight", None))


def _rms_norm_shapes(case: Case, rows: int) -> tuple[tuple[int, ...], ...]:
    _, h = case.shape
    return ((rows, h), (h,))


def _eps(case: Case) -> float:
    """PyTorch's default eps is the epsilon of the *computation* type: float32's for bf16 and fp16
    inputs too (ATen's opmath type), not the input dtype's."""
    eps = case.opt("eps")
    return 2.0**-23 if eps is None else float(eps)


def _rms_norm_value(
    x: np.ndarray, w: np.ndarray, eps: float, dtype: str, acc: str = "float32"
) -> Reference:
    """mean of squares (h positive terms, relative error e_s = _sum_error / sum), + eps, sqrt,
    divide, times weight, all in ``acc``: relative error <= e_s / 2 + RMS_NORM_FIXED u on each
    output (``_rms_norm_fixed``)."""
    h, u = x.shape[-1], unit_roundoff(acc)
    with np.errstate(all="ignore"):
        sq = x * x
        total = np.sum(sq, axis=-1, keepdims=True)
        ms = total / max(h, 1)
        value = x / np.sqrt(ms + eps) * w
        squares = np.sum(sq * sq, axis=-1, keepdims=True)
        chain = _sum_error(total, squares, total, h, u)
        chain = np.where(total > 0, chain / total / 2, 0.0)
        relative = chain + _rms_norm_fixed(acc) * u
        if acc in ("float32", "float64"):
            relative = np.minimum(relative, _rms_norm_azuma(total, squares, h, u))
        error = relative * np.abs(value)
    bound = _output_rounding(value, error, dtype, None, acc, last_counted=True)
    return Reference(value, bound, dtype, acc)


RMS_NORM_FIXED = 5.5
"""rms_norm's roundings after the sum of squares, in u, counted one by one for float32 (or
float64) internals: the division by h (or a rounded 1/h and a product: 2 u), + eps (u), both
halved by the square root (1.5 u); the reciprocal square root (an accelerator's rsqrt: 2 ulps;
or sqrt and a division: 2 u); x * rstd (u); times the weight (u: the last rounding, the
output's own where the output is float32). Before 2026-12-05 the bound allowed 8 u here plus u
for the output's rounding: a median 16-18.7x the worst honest order's error in float32."""


RMS_NORM_ROUNDINGS = 2.75
"""The sum of squared coefficients of rms_norm's roundings after the sum of squares (as in
RMS_NORM_FIXED): 1/h and its product (0.5^2 each), + eps (0.5^2), x * rstd (1), * weight (1);
the reciprocal square root's two roundings (sqrt and 1 / r: 1 each) or an approximate rsqrt's
2 ulps are added apart (``_rms_norm_azuma``)."""


def _rms_norm_azuma(total: Any, squares: Any, h: int, u: float) -> Any:
    """rms_norm's relative error with every rounding in one Azuma-Hoeffding bound (LAMBDA, as
    in ``bounds``): the sum of squares' chain (its spread over (2 sum)^2: the square root halves
    it) and RMS_NORM_ROUNDINGS; the reciprocal square root either as two more roundings or as an
    approximation's 2 ulps, worst case (not a rounding: it may be systematic), whichever is
    larger. ``_rms_norm_value`` takes the smaller of this and the worst-case sum (chain bound /
    2 + RMS_NORM_FIXED u): it fails only if one of them does, at most twice 2 exp(-LAMBDA^2 / 2)
    per element."""
    with np.errstate(all="ignore"):
        spread = _chain_spread(squares, total, max(h, 1)) / (4 * total * total)
        variance = np.where(total > 0, spread, 0.0) + RMS_NORM_ROUNDINGS
        return np.maximum(
            LAMBDA * u * np.sqrt(variance + 2.0), LAMBDA * u * np.sqrt(variance) + 2 * u
        )


def _rms_norm_fixed(acc: str) -> float:
    """RMS_NORM_FIXED for float32 or float64 internals; 8 for 16-bit ones, as before (a kernel
    declaring them may round anywhere between float32 steps)."""
    return RMS_NORM_FIXED if acc in ("float32", "float64") else 8.0


def _rms_norm_call(entry: str, args: Sequence[Any], case: Case, lengths: Sequence[int]) -> Any:
    import torch

    x, w = args
    if entry != "F.rms_norm":  # a target's own entry point (e.g. vLLM's _C kernel): (x, w, eps)
        return _entry_function(entry)(x, w, case.opt("eps"))
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), w, eps=case.opt("eps"))


def _rms_norm_reference(
    x: Sequence[np.ndarray], case: Case, lengths: Sequence[int], acc: str = "float32"
):
    return (_rms_norm_value(x[0], x[1], _eps(case), case.dtype, acc),)


def _add_rms_norm_operands(case: Case) -> tuple[Operand, ...]:
    return (Operand("x", 0), Operand("residual", 0), Operand("weight", None))


def _add_rms_norm_shapes(case: Case, rows: int) -> tuple[tuple[int, ...], ...]:
    _, h = case.shape
    return ((rows, h), (rows, h), (h,))


def _add_rms_norm_call(entry: str, args: Sequence[Any], case: Case, lengths: Sequence[int]) -> Any:
    function = _entry_function(entry)  # looked up now: swaps show
    x, residual, weight = args
    y, *rest = function(x, residual, weight, _eps(case))
    # Upstream variants return (y, rstd, x + residual) or (y, x + residual): keep y and the sum.
    return (y, rest[-1])


def _residual_references(
    x: Sequence[np.ndarray], dtype: str, eps: float, acc: str
) -> tuple[Reference, Reference]:
    """(y, residual) of x + residual normalised: the residual output is one rounding of the exact
    sum (bitwise on exact inputs); y is rms_norm of the sum *rounded to the output dtype*, as a
    kernel that normalises the residual it stored computes it. Where the output dtype is
    narrower than the internals, a kernel may instead take the mean of squares of the unrounded
    sum (vLLM's CUDA kernel: the variance of the float sum, the stored residual normalised) or
    normalise the unrounded sum: y's bound adds both differences, computed exactly (without it
    an honest bf16 kernel of that form used up to 1.9x its bound)."""
    from ..model.compare import bits_to_float64, round_to_bits

    total = x[0] + x[1]
    rounded = bits_to_float64(round_to_bits(total, dtype), dtype)
    y = _rms_norm_value(rounded, x[2], eps, dtype, acc)
    if unit_roundoff(dtype) > unit_roundoff(acc):
        h = max(total.shape[-1], 1)
        with np.errstate(all="ignore"):
            rstd = 1 / np.sqrt(np.sum(rounded * rounded, -1, keepdims=True) / h + eps)
            rstd_exact = 1 / np.sqrt(np.sum(total * total, -1, keepdims=True) / h + eps)
            w = np.abs(x[2])
            form = (
                np.abs(total - rounded) * rstd_exact + np.abs(rounded) * np.abs(rstd_exact - rstd)
            ) * w
        y = Reference(y.value, y.tolerance + form, y.dtype, y.precision)
    return y, Reference(total, unit_roundoff(dtype) * np.abs(total), dtype, acc)


def _add_rms_norm_reference(
    x: Sequence[np.ndarray], case: Case, lengths: Sequence[int], acc: str = "float32"
):
    return _residual_references(x, case.dtype, _eps(case), acc)


def _add_rms_norm_amplitude(case: Case, acc: str = "float32") -> int:
    """Only the residual output can be exact; y involves sqrt and division."""
    return 8


def _fused_add_rms_norm_call(
    entry: str, args: Sequence[Any], case: Case, lengths: Sequence[int]
) -> Any:
    """The op mutates x and residual: it runs on copies with the same shape and strides (so that
    determinism's second call and the reference see the drawn inputs), and the op's outputs are
    the two mutated copies (x <- rms_norm(x + residual) * weight, residual <- x + residual),
    whatever the entry point returns: the in-place semantics are what is tested."""
    import torch

    x, residual, weight = args

    def copy(t: Any) -> Any:
        out = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
        return out.copy_(t)

    xc, rc = copy(x), copy(residual)
    _entry_function(entry)(xc, rc, weight, float(case.opt("eps", 1e-6)))
    return (xc, rc)


def _fused_add_rms_norm_reference(
    x: Sequence[np.ndarray], case: Case, lengths: Sequence[int], acc: str = "float32"
):
    """As add_rms_norm's (x_out is y, residual_out the sum rounded once), with the case's eps."""
    return _residual_references(x, case.dtype, float(case.opt("eps", 1e-6)), acc)


_STOCK_FUSED_ADD_RMS_NORM = '''
def fused_add_rms_norm(x, residual, weight, eps):
    """Stock composite, vLLM semantics, in place: residual += x; x = rms_norm(residual) * weight."""
    residual.add_(x)
    x.copy_(F.rms_norm(residual, tuple(weight.shape), weight, eps))
    return x, residual
'''


def _fused_add_rms_norm_repro(case: Case) -> tuple[str, str]:
    definition = _stock_or_import(case, _STOCK_FUSED_ADD_RMS_NORM, "fused_add_rms_norm")
    eps = float(case.opt("eps", 1e-6))
    expr = (
        f"(lambda x, r: (fused_add_rms_norm(x, r, args[2], {eps!r}), (x, r))[1])"
        "(args[0].clone(), args[1].clone())"
    )
    return definition, expr


def _layer_norm_operands(case: Case) -> tuple[Operand, ...]:
    ops = (Operand("input", 0),)
    return (*ops, Operand("weight", None), Operand("bias", None)) if case.opt("affine") else ops


def _layer_norm_shapes(case: Case, rows: int) -> tuple[tuple[int, ...], ...]:
    _, h = case.shape
    return ((rows, h), (h,), (h,)) if case.opt("affine") else ((rows, h),)


def _layer_norm_call(entry: str, args: Sequence[Any], case: Case, lengths: Sequence[int]) -> Any:
    import torch

    x, *affine = args
    w, b = affine if affine else (None, None)
    eps = float(case.opt("eps", 1e-5))
    if entry != "F.layer_norm":  # a target's own kernel: (x, weight, bias, eps)
        return _entry_function(entry)(x, w, b, eps)
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, eps)


LAYER_NORM_BOUND = (
    "mean: _sum_error / h + u_acc |mean|; d = x - mean: that + u_acc |d|; var: (2 sum |d| e_d +"
    " sum e_d^2 + _sum_error(sum d^2) + 4 u_acc sum x^2) / h + u_acc var (two-pass, Welford or"
    " one-pass E[x^2] - mean^2 alike); rstd relative e_var / (2 (var + eps)) + 4 u_acc; y = d rstd"
    " w + b: (e_d + (rel_rstd + 2 u_acc) |d|) rstd |w| + u_acc |y|; plus one rounding to the"
    " output dtype unless it is the internals' own, and the smallest normal"
)


def _layer_norm_reference(
    x: Sequence[np.ndarray], case: Case, lengths: Sequence[int], acc: str = "float32"
):
    """(x - mean) / sqrt(var + eps) * w + b over the last dim (biased variance), in float64,
    with the error of a kernel computing in ``acc`` (LAYER_NORM_BOUND, in words)."""
    v, *affine = x
    h, u, eps = case.shape[1], unit_roundoff(acc), float(case.opt("eps", 1e-5))
    n = max(h, 1)
    with np.errstate(all="ignore"):
        total = np.sum(v, axis=-1, keepdims=True)
        mean = total / n
        e_mean = _sum_error(
            total, np.sum(v * v, axis=-1, keepdims=True), np.sum(np.abs(v), -1, keepdims=True), n, u
        )
        e_mean = e_mean / n + u * np.abs(mean)
        d = v - mean
        e_d = e_mean + u * np.abs(d)
        sq = d * d
        ssq = np.sum(sq, axis=-1, keepdims=True)
        var = ssq / n
        e_var = 2 * np.sum(np.abs(d) * e_d, -1, keepdims=True) + np.sum(
            e_d * e_d, -1, keepdims=True
        )
        e_var = e_var + _sum_error(ssq, np.sum(sq * sq, -1, keepdims=True), ssq, n, u)
        e_var = (e_var + 4 * u * np.sum(v * v, -1, keepdims=True)) / n + u * var
        rstd = 1.0 / np.sqrt(var + eps)
        rel_rstd = e_var / (2 * (var + eps)) + 4 * u
        y = d * rstd
        error = (e_d + (rel_rstd + 2 * u) * np.abs(d)) * rstd
        if affine:
            w, b = affine
            y = y * w + b
            error = error * np.abs(w) + u * np.abs(y)
    # The last rounding (+ b, or d * rstd without affine) is counted above.
    bound = _output_rounding(y, error, case.dtype, None, acc, last_counted=True)
    return (Reference(y, bound, case.dtype, acc),)


def _layer_norm_repro(case: Case) -> tuple[str, str]:
    eps = float(case.opt("eps", 1e-5))
    if case.opt("affine"):
        return "", f"F.layer_norm(args[0], (args[0].shape[-1],), args[1], args[2], {eps!r})"
    return "", f"F.layer_norm(args[0], (args[0].shape[-1],), None, None, {eps!r})"


def _rms_norm_repro(case: Case) -> tuple[str, str]:
    if case.entry != "F.rms_norm":
        module, _, attr = case.entry.rpartition(".")
        return f"from {module} import {attr} as rms_norm\n", (
            f"rms_norm(args[0], args[1], {case.opt('eps')!r})"
        )
    return "", f"F.rms_norm(args[0], (args[0].shape[-1],), args[1], eps={case.opt('eps')!r})"


_STOCK_ADD_RMS_NORM = '''
def add_rms_norm(x, residual, weight, eps=None):
    """Stock composite: (rms_norm(x + residual) * weight, x + residual)."""
    total = x + residual
    return F.rms_norm(total, tuple(weight.shape), weight, eps), total
'''


def _add_rms_norm_repro(case: Case) -> tuple[str, str]:
    module, _, attr = case.entry.rpartition(".")
    if module == "bi_props.ops":
        definition = _STOCK_ADD_RMS_NORM
    else:
        definition = f"from {module} import {attr} as add_rms_norm\n"
    expr = f"(lambda y, *rest: (y, rest[-1]))(*add_rms_norm(*args, {_eps(case)!r}))"
    return definition, expr


def draw_rms_norm(draw: Any, ctx: Any) -> Shape:
    options = {"eps": draw(ctx.choice(tuple([None, 1e-6])))}
    return (draw(ctx.rows), draw(ctx.extents(ctx.clip(ctx.dim_extent, low=1)))), options


def draw_add_rms_norm(draw: Any, ctx: Any) -> Shape:
    return (draw(ctx.rows), draw(ctx.extents(ctx.clip(ctx.dim_extent, low=1)))), {}


def draw_fused_add_rms_norm(draw: Any, ctx: Any) -> Shape:
    options = {"eps": draw(ctx.choice(tuple([1e-6, 1e-5])))}
    return (draw(ctx.rows), draw(ctx.extents(ctx.clip(ctx.dim_extent, low=1)))), options


def draw_layer_norm(draw: Any, ctx: Any) -> Shape:
    options = {"affine": draw(ctx.option("affine")), "eps": draw(ctx.option("eps"))}
    return (draw(ctx.rows), draw(ctx.extents(ctx.clip(ctx.dim_extent, low=1)))), options


OPS: tuple[OpSpec, ...] = (
    OpSpec(
        name="rms_norm",
        entries=("F.rms_norm",),
        shape_doc="(m, h): input (m, h) per sample, weight (h,) shared",
        operands=_rms_norm_operands,
        operand_shapes=_rms_norm_shapes,
        call=_rms_norm_call,
        reference=_rms_norm_reference,
        exact_amplitude=_never_exact,
        bound=RMS_NORM_BOUND,
        draw_shape=draw_rms_norm,
        scale="tokens",
        repro_call=_rms_norm_repro,
        # A transposed input: its mean of squares over a strided row is vectorised across the
        # batch's rows, a scalar chain for the needle alone (x86 ATen, 2026-12-04).
        control_examples=(ControlExample((1, 97), (249,), layouts=("transposed", "contiguous")),),
        aten_names=("aten::rms_norm",),
        padded=_rows_padded,
    ),
    OpSpec(
        name="add_rms_norm",
        entries=("bi_props.ops.add_rms_norm",),
        shape_doc="(m, h): x and residual (m, h) per sample, weight (h,) shared; returns"
        " (rms_norm(x + residual) * weight, x + residual)",
        operands=_add_rms_norm_operands,
        operand_shapes=_add_rms_norm_shapes,
        call=_add_rms_norm_call,
        reference=_add_rms_norm_reference,
        exact_amplitude=_add_rms_norm_amplitude,
        output_batch_axes=(0, 0),
        inexact_outputs=(0,),
        bound=RMS_NORM_BOUND + "; the residual x + residual: one rounding",
        draw_shape=draw_add_rms_norm,
        scale="tokens",
        repro_call=_add_rms_norm_repro,
        # As rms_norm's: x transposed makes x + residual strided (x86 ATen, 2026-12-04).
        control_examples=(
            ControlExample((1, 64), (255,), layouts=("transposed", "contiguous", "contiguous")),
        ),
        padded=_rows_padded,
    ),
    OpSpec(
        name="fused_add_rms_norm",
        entries=("bi_props.ops.fused_add_rms_norm",),
        shape_doc="(m, h): x and residual (m, h) per sample, weight (h,) shared; vLLM's"
        " in-place op: residual <- x + residual, x <- rms_norm(residual) * weight; the"
        " outputs are the two mutated inputs (x, residual)",
        operands=_add_rms_norm_operands,
        operand_shapes=_add_rms_norm_shapes,
        call=_fused_add_rms_norm_call,
        reference=_fused_add_rms_norm_reference,
        exact_amplitude=_add_rms_norm_amplitude,
        output_batch_axes=(0, 0),
        inexact_outputs=(0,),
        bound=RMS_NORM_BOUND + "; the residual x + residual: one rounding",
        notes="in place: the call runs on copies of x and residual (same strides) and returns"
        " them mutated",
        draw_shape=draw_fused_add_rms_norm,
        scale="tokens",
        repro_call=_fused_add_rms_norm_repro,
        # The residual transposed: its mean of squares is reduced across the batch's rows, a
        # scalar chain for the needle alone; the rounding shows in y for some data only (3 of 8
        # fixed seeds; x86 ATen, 2026-12-04): seed 100 is one that shows it.
        control_examples=(
            ControlExample(
                (1, 97),
                (249,),
                {"eps": 1e-5},
                layouts=("contiguous", "transposed", "contiguous"),
                seed=100,
            ),
        ),
        padded=_rows_padded,
    ),
    OpSpec(
        name="layer_norm",
        entries=("F.layer_norm",),
        shape_doc="(m, h): input (m, h) per sample; with affine, weight and bias (h,) shared;"
        " normalised over the last dim",
        operands=_layer_norm_operands,
        operand_shapes=_layer_norm_shapes,
        call=_layer_norm_call,
        reference=_layer_norm_reference,
        exact_amplitude=_never_exact,
        option_choices={"affine": (True, False), "eps": (1e-5, 1e-6)},
        bound=LAYER_NORM_BOUND,
        draw_shape=draw_layer_norm,
        scale="tokens",
        repro_call=_layer_norm_repro,
        aten_names=("aten::layer_norm", "aten::native_layer_norm"),
        padded=_rows_padded,
    ),
)
