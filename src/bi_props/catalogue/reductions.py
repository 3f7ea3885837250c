"""Reductions: sum, mean, and the softmax family (softmax, log_softmax).

One op's helpers, shape strategy and OpSpec (in ``OPS``) side by side (``bi_props.catalogue``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..model.bounds import (
    LAMBDA,
    _chain_spread,
    _deterministic,
    _output_rounding,
    _sum_error,
)
from ..model.case import Case
from ..model.compare import exact_integer_limit, unit_roundoff
from ..model.opspec import (
    ControlExample,
    OpSpec,
    Reference,
    out_dtype,
)
from ._shared import (
    Shape,
    _dtype_kw,
    _never_exact,
    _x_operand,
    _x_shape,
)

SUM_BOUND = (
    "a sum of n terms: LAMBDA u_acc sqrt(sum x^2 + 2 E[sum s^2]) (_sum_error), capped by"
    " ((1 + u_acc)^n - 1) sum |x|; mean: / n + 2 u_acc |mean|; plus one rounding to the output"
    " dtype unless it is the internals' own, and the smallest normal"
)


SOFTMAX_BOUND = (
    "float32/float64 internals, softmax: relative, the smaller of 2 u ((1 - p_i)(d_i + 1) +"
    " sum_{j != i} p_j (d_j + 1)) + 2 u + chain and LAMBDA u sqrt(chain spread / s^2 +"
    " 2 (1 - p_i)^2 d_i^2 + 2 sum_{j != i} p_j^2 d_j^2 + 2) + 4 u (1 - p_i), d = |x - max|, the"
    " chain's spread at most the largest-first order's (_softmax_relative); 16-bit internals and"
    " log_softmax: relative u_acc (2 d_i + 8) + 2 u_acc sum_j d_j p_j + _sum_error(sum exp) /"
    " sum exp (log_softmax: absolute, + u_acc |value|); plus one rounding to the output dtype"
    " unless it is the internals' own (softmax), and the smallest normal"
)


def _dims(case: Case) -> tuple[int, ...]:
    """The reduced dimensions, normalised and sorted (all of them when ``dim`` is None)."""
    rank = len(case.shape)
    dim = case.opt("dim")
    if dim is None:
        return tuple(range(rank))
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    return tuple(sorted(d % rank for d in dims)) if dims else tuple(range(rank))


def _reduced_count(case: Case) -> int:
    return math.prod(case.shape[d] for d in _dims(case))


def _reduction_kwargs(case: Case) -> dict[str, Any]:
    import torch

    kwargs: dict[str, Any] = {}
    if case.opt("dim") is not None:
        kwargs["dim"] = case.opt("dim")
        kwargs["keepdim"] = case.opt("keepdim", False)
    if case.opt("dtype") is not None:
        kwargs["dtype"] = getattr(torch, case.opt("dtype"))
    return kwargs


def _reduce_call(name: str) -> Callable[[str, Sequence[Any], Case, Sequence[int]], Any]:
    def call(entry: str, args: Sequence[Any], case: Case, lengths: Sequence[int]) -> Any:
        import torch

        (x,) = args
        kwargs = _reduction_kwargs(case)
        if entry.startswith("Tensor."):
            return getattr(x, name)(**kwargs)
        return getattr(torch, name)(x, **kwargs)

    return call


def _reduce_reference(mean: bool):
    def reference(
        x: Sequence[np.ndarray], case: Case, lengths: Sequence[int], acc: str = "float32"
    ):
        """A sum of n terms accumulated in ``acc`` in any value-oblivious order: _sum_error."""
        dims = _dims(case)
        keep = bool(case.opt("keepdim", False)) and case.opt("dim") is not None
        n, dtype, u = _reduced_count(case), out_dtype(case), unit_roundoff(acc)
        with np.errstate(all="ignore"):
            value = np.sum(x[0], axis=dims, keepdims=keep)
            magnitude = np.sum(np.abs(x[0]), axis=dims, keepdims=keep)
            squares = np.sum(x[0] * x[0], axis=dims, keepdims=keep)
            error = _sum_error(value, squares, magnitude, n, u)
            if mean:
                value = value / n if n else np.full_like(value, np.nan)
                # One more rounding for the division (or for a reciprocal multiply: two).
                error = error / max(n, 1) + 2 * u * np.abs(value)
        intermediate = magnitude / max(n, 1) if mean else magnitude
        # The chain's last addition (mean: the division) is the last rounding, counted above.
        bound = _output_rounding(value, error, dtype, intermediate, acc, last_counted=True)
        return (Reference(np.asarray(value), bound, dtype, acc),)

    return reference


def _reduction_batchable(case: Case) -> bool:
    return case.opt("dim") is not None and 0 not in _dims(case) and len(case.shape) > 1


def _sum_amplitude(case: Case, acc: str = "float32") -> int:
    return min(8, exact_integer_limit(acc) // max(_reduced_count(case), 1))


def _mean_amplitude(case: Case, acc: str = "float32") -> int:
    """Exact only when the count is a power of two: then the division is exact too."""
    n = _reduced_count(case)
    if n == 0 or n & (n - 1):
        return 0
    return _sum_amplitude(case, acc)


def _softmax_call(name: str) -> Callable[[str, Sequence[Any], Case, Sequence[int]], Any]:
    def call(entry: str, args: Sequence[Any], case: Case, lengths: Sequence[int]) -> Any:
        import torch

        (x,) = args
        dim = case.opt("dim", -1)
        dtype = getattr(torch, case.opt("dtype")) if case.opt("dtype") else None
        if entry.startswith("Tensor."):
            return getattr(x, name)(dim, dtype=dtype)
        if entry.startswith("F."):
            return getattr(torch.nn.functional, name)(x, dim=dim, dtype=dtype)
        return getattr(torch, name)(x, dim, dtype=dtype)

    return call


def _positive_chain(e: np.ndarray, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """(sum of squared, sum of) partial sums m = 2..n of the positive terms ``e`` along ``dim``
    taken largest first: each is the largest partial sum of m terms, so these are the worst
    case over every order and grouping (a tree's k-th largest node sums at most n - k + 1
    terms), no probability involved."""
    desc = -np.sort(-np.moveaxis(e, dim, -1), axis=-1)
    prefix = np.cumsum(desc, axis=-1)[..., 1:]
    squares = np.moveaxis(np.sum(prefix * prefix, axis=-1, keepdims=True), -1, dim)
    return squares, np.moveaxis(np.sum(prefix, axis=-1, keepdims=True), -1, dim)


def _softmax_relative(
    e: np.ndarray, s: np.ndarray, d: np.ndarray, dim: int, u: float, acc: str
) -> np.ndarray:
    """softmax's relative error bound per element (``e`` the exact exps of x - max, ``s`` their
    sum, ``d`` = |x - max|), its roundings counted one by one.

    An honest kernel computing in ``acc`` rounds, per element j: the shift x_j - max and at most
    one multiply folding log2(e) into the exponent (each an argument error of u d_j: a relative
    error u d_j of the exp), the exp (EXP_ULPS = 2 ulps: an accelerator's), then the sum's
    chain, and a division, or a reciprocal and a product (2 u, the last of them the output's
    own rounding). Element j's error enters p_i = e_i / s to first order with the coefficient
    (1 - p_i) for j = i (it is in the sum too) and -p_j otherwise. Two bounds, the smaller
    taken (it fails only if one of them does: at most twice 2 exp(-LAMBDA^2 / 2)):

    - worst case: 2 u ((1 - p_i)(d_i + 1) + sum_{j != i} p_j (d_j + 1)) + 2 u + chain, where
      chain is the sum's bound (``_sum_error``, its spread no more than the largest-first order's
      realised one, ``_positive_chain``), or that order's deterministic u (sum of its partial
      sums + s) where smaller;
    - one Azuma-Hoeffding bound over every rounding (the chain, 2 per shift, the division's 2):
      LAMBDA u sqrt(spread / s^2 + 2 (1 - p_i)^2 d_i^2 + 2 sum_{j != i} p_j^2 d_j^2 + 2), plus
      the exps' errors worst case (not roundings: an approximation's may be systematic),
      2 u (1 - p_i) + 2 u sum_{j != i} p_j = 4 u (1 - p_i).

    Before 2026-12-05 the bound added every term at full weight (u (2 d_i + 8) + 2 u
    sum_j p_j d_j + chain, and one more u for the output's rounding): at n = 16 a median 20.6x
    the worst honest order's error. A target declaring 16-bit internals keeps that count (it
    may round partly in float32)."""
    n = e.shape[dim] if e.ndim else 1
    with np.errstate(all="ignore"):
        p = e / s
        squares = np.sum(e * e, axis=dim, keepdims=True)
        weighted = np.sum(np.where(e > 0, d * p, 0.0), axis=dim, keepdims=True)
        if acc not in ("float32", "float64"):
            return u * (2 * d + 8) + 2 * u * weighted + _sum_error(s, squares, s, n, u) / s
        worst_squares, worst_sum = _positive_chain(e, dim)
        spread = np.minimum(_chain_spread(squares, s, n), squares + worst_squares)
        chain = np.minimum(
            np.minimum(LAMBDA * u * np.sqrt(spread), _deterministic(n, u) * s), u * (worst_sum + s)
        )
        own = (1 - p) * (d + 1)
        others = np.maximum(weighted + 1 - p * (d + 1), 0.0)
        linear = 2 * u * (own + others) + 2 * u + chain / s
        shifts = np.where(e > 0, (p * d) ** 2, 0.0)
        own_shift = ((1 - p) * d) ** 2
        other_shifts = np.maximum(np.sum(shifts, axis=dim, keepdims=True) - shifts, 0.0)
        variance = spread / (s * s) + 2 * (own_shift + other_shifts) + 2
        azuma = LAMBDA * u * np.sqrt(variance) + 4 * u * (1 - p)
        return np.where(np.isfinite(azuma), np.minimum(linear, azuma), linear)


def _softmax_reference(log: bool):
    def reference(
        x: Sequence[np.ndarray], case: Case, lengths: Sequence[int], acc: str = "float32"
    ):
        """Computed in ``acc``: x - max (one rounding: an argument error u |x - max|), exp (that
        error, relative, plus a few ulp), a sum of n positive terms (relative error
        e_s = _sum_error / sum, plus the terms' own errors weighted by their share), one division
        or log. Hence, with d_i = |x_i - max| and p_i the softmax:
        softmax relative error <= u (2 d_i + 8) + 2 u sum_j d_j p_j + e_s; log_softmax absolute
        error <= the same + u |log_softmax|."""
        dim, dtype, u = case.opt("dim", -1), out_dtype(case), unit_roundoff(acc)
        v = x[0]
        n = v.shape[dim] if v.ndim else 1
        with np.errstate(all="ignore"):
            m = np.max(v, axis=dim, keepdims=True) if v.size else v
            shifted = v - m
            e = np.exp(shifted)
            s = np.sum(e, axis=dim, keepdims=True)
            squares = np.sum(e * e, axis=dim, keepdims=True)
            d = np.abs(shifted)
            weighted = np.sum(np.where(e > 0, d * e, 0.0), axis=dim, keepdims=True) / s
            if log:
                slack = u * (2 * d + 8) + 2 * u * weighted + _sum_error(s, squares, s, n, u) / s
                value = shifted - np.log(s)
                error = slack + u * np.abs(value)
                magnitude = np.abs(shifted) + np.abs(np.log(s))
            else:
                value = e / s
                error = _softmax_relative(e, s, d, dim, u, acc) * value
                magnitude = value
        bound = _output_rounding(value, error, dtype, magnitude, acc, last_counted=not log)
        return (Reference(value, bound, dtype, acc),)

    return reference


def _softmax_batchable(case: Case) -> bool:
    return len(case.shape) > 1 and case.opt("dim", -1) % len(case.shape) != 0


def _reduce_repro(case: Case) -> tuple[str, str]:
    op, entry = case.op, case.entry
    kwargs = []
    if case.opt("dim") is not None:
        kwargs += [f"dim={case.opt('dim')!r}", f"keepdim={case.opt('keepdim', False)!r}"]
    if case.opt("dtype"):
        kwargs.append(f"dtype={_dtype_kw(case)}")
    joined = ", ".join(kwargs)
    if entry.startswith("Tensor."):
        return "", f"args[0].{op}({joined})"
    return "", f"torch.{op}(args[0]{', ' if joined else ''}{joined})"


def _softmax_repro(case: Case) -> tuple[str, str]:
    op, entry = case.op, case.entry
    dim, dtype = case.opt("dim", -1), _dtype_kw(case)
    if entry.startswith("Tensor."):
        return "", f"args[0].{op}({dim!r}, dtype={dtype})"
    if entry.startswith("F."):
        return "", f"F.{op}(args[0], dim={dim!r}, dtype={dtype})"
    return "", f"torch.{op}(args[0], {dim!r}, dtype={dtype})"


def draw_reduction(draw: Any, ctx: Any) -> Shape:
    """sum and mean: rank 1-3 (2-3 for batch invariance and row permutation: a full sum has no
    rows), a dim."""
    from hypothesis import strategies as st

    options: dict[str, Any] = {}
    batch = ctx.row_wise
    rank = draw(ctx.integers(2 if batch else 1, 3))
    shape = (draw(ctx.rows), *(draw(ctx.small if rank == 3 else ctx.dim) for _ in range(rank - 1)))
    choices: list = [-1, rank - 1]
    if rank == 3:
        choices += [1, (1, 2), (-2,)]
    if not batch:
        choices += [None, 0, tuple(range(rank))]
    options["dim"] = draw(ctx.choice(tuple(choices)))
    if options["dim"] is not None:
        options["keepdim"] = draw(st.booleans())
    options["dtype"] = draw(ctx.choice(tuple([None, "float32"])))
    return shape, options


def draw_softmax(draw: Any, ctx: Any) -> Shape:
    """softmax and log_softmax: rank 2-3, any dim but the rows' for batch invariance and row
    permutation."""
    options: dict[str, Any] = {}
    if ctx.scaled:  # logits over a vocabulary: rank 2, the last dim a deployment size
        rank = 2
        shape = (
            draw(ctx.rows),
            draw(ctx.vocabulary()),
        )
    else:
        rank = draw(ctx.integers(2, 3))
        shape = (
            draw(ctx.rows),
            *(draw(ctx.small if rank == 3 else ctx.dim) for _ in range(rank - 1)),
        )
    dims = [*range(1, rank), -1]
    if not ctx.row_wise:
        dims.append(0)
    options["dim"] = draw(ctx.choice(tuple(sorted(set(dims), key=lambda x: (x != -1, x)))))
    options["dtype"] = draw(ctx.choice(tuple([None, "float32"])))
    return shape, options


# Stock CPU reductions over a strided (transposed) row vectorise across rows once the batch
# fills a vector, a scalar chain for the needle alone (x86 ATen, 2026-12-04).
STRIDED_ROW_CONTROL = ControlExample(
    (1, 64), (15,), {"dim": -1, "dtype": None, "keepdim": False}, layouts=("transposed",)
)

OPS: tuple[OpSpec, ...] = (
    OpSpec(
        name="sum",
        entries=("torch.sum", "Tensor.sum"),
        shape_doc="the input's shape (rank 1-3), rows first",
        operands=_x_operand,
        operand_shapes=_x_shape,
        call=_reduce_call("sum"),
        reference=_reduce_reference(mean=False),
        exact_amplitude=_sum_amplitude,
        batchable=_reduction_batchable,
        bound=SUM_BOUND,
        draw_shape=draw_reduction,
        scale="tokens",
        repro_call=_reduce_repro,
        control_examples=(STRIDED_ROW_CONTROL,),
        aten_names=("aten::sum",),
    ),
    OpSpec(
        name="mean",
        entries=("torch.mean", "Tensor.mean"),
        shape_doc="the input's shape (rank 1-3), rows first",
        operands=_x_operand,
        operand_shapes=_x_shape,
        call=_reduce_call("mean"),
        reference=_reduce_reference(mean=True),
        exact_amplitude=_mean_amplitude,
        batchable=_reduction_batchable,
        bound=SUM_BOUND,
        draw_shape=draw_reduction,
        scale="tokens",
        repro_call=_reduce_repro,
        control_examples=(STRIDED_ROW_CONTROL,),
        aten_names=("aten::mean",),
    ),
    OpSpec(
        name="softmax",
        entries=("torch.softmax", "Tensor.softmax", "F.softmax"),
        shape_doc="the input's shape (rank 2-3), rows first",
        operands=_x_operand,
        operand_shapes=_x_shape,
        call=_softmax_call("softmax"),
        reference=_softmax_reference(log=False),
        exact_amplitude=_never_exact,
        batchable=_softmax_batchable,
        bound=SOFTMAX_BOUND,
        draw_shape=draw_softmax,
        scale="vocab",
        repro_call=_softmax_repro,
        # Stock CPU softmax off the last dimension: its vectorised inner loop over a batch of 16
        # is not the one over the needle alone (x86 ATen, 2026-12-02: 98-107 of 1,152 values).
        control_examples=(ControlExample((1, 48, 24), (15,), {"dim": 1, "dtype": None}),),
        aten_names=("aten::_softmax", "aten::softmax"),
    ),
    OpSpec(
        name="log_softmax",
        entries=("torch.log_softmax", "Tensor.log_softmax", "F.log_softmax"),
        shape_doc="the input's shape (rank 2-3), rows first",
        operands=_x_operand,
        operand_shapes=_x_shape,
        call=_softmax_call("log_softmax"),
        reference=_softmax_reference(log=True),
        exact_amplitude=_never_exact,
        batchable=_softmax_batchable,
        bound=SOFTMAX_BOUND,
        draw_shape=draw_softmax,
        scale="vocab",
        repro_call=_softmax_repro,
        aten_names=("aten::_log_softmax", "aten::log_softmax"),
    ),
)
