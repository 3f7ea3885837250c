"""Matrix products: mm, matmul, bmm, addmm, linear.

One op's helpers, shape strategy and OpSpec (in ``OPS``) side by side (``bi_props.catalogue``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..model.bounds import (
    _bounded_amplitude,
    _output_rounding,
    _product_reference,
    _sum_error,
)
from ..model.case import Case
from ..model.compare import unit_roundoff
from ..model.opspec import (
    ControlExample,
    Operand,
    OpSpec,
    Reference,
    out_dtype,
)
from ._shared import (
    Shape,
    _fixed_repro,
)

PRODUCT_BOUND = (
    "LAMBDA u_acc sqrt(sum t^2 + 2 E[sum s^2]) over the K products t (the sum-of-terms bound,"
    " _sum_error), capped by ((1 + u_acc)^K - 1) |A| @ |B|; plus one rounding to the output"
    " dtype and the smallest normal"
)


def _mm_shapes(case: Case, rows: int) -> tuple[tuple[int, ...], ...]:
    _, k, n = case.shape
    return ((rows, k), (k, n))


def _mm_call(entry: str, args: Sequence[Any], case: Case, lengths: Sequence[int]) -> Any:
    import torch

    a, b = args
    return a.mm(b) if entry == "Tensor.mm" else torch.mm(a, b)


def _mm_reference(x: Sequence[np.ndarray], case: Case, lengths: Sequence[int], acc="float32"):
    return (_product_reference(x[0], x[1], case.shape[1], out_dtype(case), acc),)


MATMUL_FORMS = ("2d", "batched", "broadcast", "vector")


def _matmul_operands(case: Case) -> tuple[Operand, ...]:
    form = case.opt("form", "2d")
    shared_rhs = form in ("2d", "broadcast", "vector")
    return (Operand("input", 0), Operand("other", None if shared_rhs else 0))


def _matmul_shapes(case: Case, rows: int) -> tuple[tuple[int, ...], ...]:
    form = case.opt("form", "2d")
    if form == "2d":
        _, k, n = case.shape
        return ((rows, k), (k, n))
    if form == "vector":
        _, k = case.shape
        return ((rows, k), (k,))
    _, m, k, n = case.shape
    if form == "batched":
        return ((rows, m, k), (rows, k, n))
    return ((rows, m, k), (k, n))


def _matmul_padded(case: Case) -> bool:
    """The padded layout for forms whose rows are independent: (b, l, k) @ (k, n) or (k,)."""
    return case.opt("form", "2d") in ("2d", "vector")


def _matmul_call(entry: str, args: Sequence[Any], case: Case, lengths: Sequence[int]) -> Any:
    import torch

    a, b = args
    return a @ b if entry == "operator.matmul" else torch.matmul(a, b)


def _matmul_reference(
    x: Sequence[np.ndarray], case: Case, lengths: Sequence[int], acc: str = "float32"
):
    form = case.opt("form", "2d")
    k = case.shape[1] if form in ("2d", "vector") else case.shape[2]
    return (_product_reference(x[0], x[1], k, out_dtype(case), acc),)


def _matmul_amplitude(case: Case, acc: str = "float32") -> int:
    form = case.opt("form", "2d")
    k = case.shape[1] if form in ("2d", "vector") else case.shape[2]
    return _bounded_amplitude(k, acc)


def _bmm_shapes(case: Case, rows: int) -> tuple[tuple[int, ...], ...]:
    _, m, k, n = case.shape
    return ((rows, m, k), (rows, k, n))


def _bmm_call(entry: str, args: Sequence[Any], case: Case, lengths: Sequence[int]) -> Any:
    import torch

    return torch.bmm(*args)


def _bmm_reference(x: Sequence[np.ndarray], case: Case, lengths: Sequence[int], acc="float32"):
    return (_product_reference(x[0], x[1], case.shape[2], out_dtype(case), acc),)


def _addmm_operands(case: Case) -> tuple[Operand, ...]:
    bias_axis = 0 if case.opt("bias", "vector") == "matrix" else None
    return (Operand("self", bias_axis), Operand("mat1", 0), Operand("mat2", None))


def _addmm_shapes(case: Case, rows: int) -> tuple[tuple[int, ...], ...]:
    _, k, n = case.shape
    bias = (rows, n) if case.opt("bias", "vector") == "matrix" else (n,)
    return (bias, (rows, k), (k, n))


def _addmm_call(entry: str, args: Sequence[Any], case: Case, lengths: Sequence[int]) -> Any:
    import torch

    c, a, b = args
    return torch.addmm(c, a, b, beta=case.opt("beta", 1), alpha=case.opt("alpha", 1))


def _addmm_reference(
    x: Sequence[np.ndarray], case: Case, lengths: Sequence[int], acc: str = "float32"
):
    """beta*C + alpha*(A@B); beta and alpha are powers of two (or 0), so scaling is exact: a sum
    of K + 1 terms (the K scaled products and the bias)."""
    c, a, b = x
    beta, alpha = case.opt("beta", 1), case.opt("alpha", 1)
    k, dtype = case.shape[1], out_dtype(case)
    with np.errstate(all="ignore"):
        product = a @ b
        c_term = beta * c if beta != 0 else np.zeros_like(product)
        value = c_term + alpha * product
        magnitude = np.abs(c_term) + abs(alpha) * (np.abs(a) @ np.abs(b))
        squares = c_term * c_term + alpha * alpha * ((a * a) @ (b * b))
    error = _sum_error(value, squares, magnitude, k + 1, unit_roundoff(acc))
    return (Reference(value, _output_rounding(value, error, dtype, magnitude, acc), dtype, acc),)


def _addmm_amplitude(case: Case, acc: str = "float32") -> int:
    k = case.shape[1]
    scale = abs(case.opt("alpha", 1)) + abs(case.opt("beta", 1))
    # A power-of-two alpha of 0.5 could make an odd integer sum a half-integer: still exact in
    # binary floating point, so only the magnitude matters.
    return _bounded_amplitude(k + 1, acc, scale)


def _linear_operands(case: Case) -> tuple[Operand, ...]:
    ops = (Operand("input", 0), Operand("weight", None))
    return (*ops, Operand("bias", None)) if case.opt("bias", True) else ops


def _linear_shapes(case: Case, rows: int) -> tuple[tuple[int, ...], ...]:
    if case.opt("form", "2d") == "3d":
        _, s, k, n = case.shape
        x = (rows, s, k)
    else:
        _, k, n = case.shape
        x = (rows, k)
    shapes: tuple[tuple[int, ...], ...] = (x, (n, k))
    return (*shapes, (n,)) if case.opt("bias", True) else shapes


def _linear_padded(case: Case) -> bool:
    """The padded layout for the 2-D form: (b, l, k) x weight (n, k)."""
    return case.opt("form", "2d") == "2d"


def _linear_call(entry: str, args: Sequence[Any], case: Case, lengths: Sequence[int]) -> Any:
    import torch

    return torch.nn.functional.linear(*args)


def _linear_reference(
    x: Sequence[np.ndarray], case: Case, lengths: Sequence[int], acc: str = "float32"
):
    k, dtype = case.shape[-2], out_dtype(case)
    with np.errstate(all="ignore"):
        value = x[0] @ x[1].T
        magnitude = np.abs(x[0]) @ np.abs(x[1]).T
        squares = (x[0] * x[0]) @ (x[1] * x[1]).T
        if len(x) == 3:
            value = value + x[2]
            magnitude = magnitude + np.abs(x[2])
            squares = squares + x[2] * x[2]
    error = _sum_error(value, squares, magnitude, k + 1, unit_roundoff(acc))
    return (Reference(value, _output_rounding(value, error, dtype, magnitude, acc), dtype, acc),)


def _linear_amplitude(case: Case, acc: str = "float32") -> int:
    return _bounded_amplitude(case.shape[-2] + 1, acc)


def _mm_repro(case: Case) -> tuple[str, str]:
    return "", "args[0].mm(args[1])" if case.entry == "Tensor.mm" else "torch.mm(args[0], args[1])"


def _matmul_repro(case: Case) -> tuple[str, str]:
    return "", "args[0] @ args[1]" if case.entry == "operator.matmul" else "torch.matmul(*args)"


def _addmm_repro(case: Case) -> tuple[str, str]:
    beta, alpha = case.opt("beta", 1), case.opt("alpha", 1)
    return "", f"torch.addmm(args[0], args[1], args[2], beta={beta!r}, alpha={alpha!r})"


def _draw_product(draw: Any, ctx: Any, options: dict[str, Any]) -> Shape:
    form = options.get("form", "2d")
    rows, d = ctx.rows, ctx.dim
    if form == "vector":
        return (draw(rows), draw(d)), options
    if form in ("batched", "broadcast", "3d"):
        return (draw(rows), draw(ctx.integers(1, 8)), draw(d), draw(d)), options
    return (draw(rows), draw(d), draw(d)), options


# The needle alone is M = 1 (a GEMV path in MKL, oneDNN, cuBLAS and most NPU libraries), inside
# the batch M = 256 (a blocked GEMM): their K orders differ on the common CPU and GPU builds.
PRODUCT_CONTROL = (1, 256, 16)
PRODUCT_COMPANIONS = (255,)


# bmm: one matrix-vector product (n = 1) alone takes another path than inside a batch of eight
# (stock CPU fp32, torch 2.13: the needle's K = 512 sums differ); measured 2026-12-04, every
# batch size 2-300 tried, n = 1 with m in 1-33 and K >= 112.
BMM_CONTROL = ControlExample((1, 4, 512, 1), (7,))


def _product_controls(**options: Any) -> tuple[ControlExample, ...]:
    return (ControlExample(PRODUCT_CONTROL, PRODUCT_COMPANIONS, options),)


def draw_mm(draw: Any, ctx: Any) -> Shape:
    return _draw_product(draw, ctx, {})


def draw_matmul(draw: Any, ctx: Any) -> Shape:
    return _draw_product(draw, ctx, {"form": draw(ctx.option("form"))})


def draw_addmm(draw: Any, ctx: Any) -> Shape:
    options = {"beta": draw(ctx.option("beta"))}
    options["alpha"] = draw(ctx.option("alpha"))
    options["bias"] = draw(ctx.option("bias"))
    return _draw_product(draw, ctx, options)


def draw_linear(draw: Any, ctx: Any) -> Shape:
    from hypothesis import strategies as st

    options = {"bias": draw(st.booleans().map(lambda x: not x))}
    options["form"] = draw(ctx.option("form"))
    return _draw_product(draw, ctx, options)


def draw_bmm(draw: Any, ctx: Any) -> Shape:
    return (draw(ctx.rows), draw(ctx.small), draw(ctx.dim), draw(ctx.dim)), {}


def small_companions(ctx: Any) -> Any:
    """bmm and matmul: companions of at most 16 rows (each row is a whole matrix or more)."""
    return ctx.integers(1, min(ctx.space.companion_rows.max, 16))


OPS: tuple[OpSpec, ...] = (
    OpSpec(
        name="mm",
        entries=("torch.mm", "Tensor.mm"),
        shape_doc="(m, k, n): input (m, k) per sample, mat2 (k, n) shared",
        operands=lambda case: (Operand("input", 0), Operand("mat2", None)),
        operand_shapes=_mm_shapes,
        call=_mm_call,
        reference=_mm_reference,
        exact_amplitude=lambda case, acc="float32": _bounded_amplitude(case.shape[1], acc),
        bound=PRODUCT_BOUND,
        draw_shape=draw_mm,
        scale="tokens",
        repro_call=_mm_repro,
        control_examples=_product_controls(),
        aten_names=("aten::mm",),
    ),
    OpSpec(
        name="matmul",
        entries=("torch.matmul", "operator.matmul"),
        shape_doc="form 2d: (m, k, n); vector: (m, k) @ (k,); batched: (b, m, k, n) both per"
        " sample; broadcast: (b, m, k) per sample @ (k, n) shared",
        operands=_matmul_operands,
        operand_shapes=_matmul_shapes,
        call=_matmul_call,
        reference=_matmul_reference,
        exact_amplitude=_matmul_amplitude,
        option_choices={"form": MATMUL_FORMS},
        bound=PRODUCT_BOUND,
        draw_shape=draw_matmul,
        scale="tokens",
        companion_rows=small_companions,
        repro_call=_matmul_repro,
        control_examples=_product_controls(form="2d"),
        aten_names=("aten::mv", "aten::dot", "aten::matmul"),
        padded=_matmul_padded,
    ),
    OpSpec(
        name="bmm",
        entries=("torch.bmm",),
        shape_doc="(b, m, k, n): both operands per sample along b",
        operands=lambda case: (Operand("input", 0), Operand("mat2", 0)),
        operand_shapes=_bmm_shapes,
        call=_bmm_call,
        reference=_bmm_reference,
        exact_amplitude=lambda case, acc="float32": _bounded_amplitude(case.shape[2], acc),
        bound=PRODUCT_BOUND,
        draw_shape=draw_bmm,
        scale="tokens",
        companion_rows=small_companions,
        repro_call=_fixed_repro("torch.bmm(args[0], args[1])"),
        control_examples=(BMM_CONTROL,),
        aten_names=("aten::bmm",),
    ),
    OpSpec(
        name="addmm",
        entries=("torch.addmm",),
        shape_doc="(m, k, n): self (n,) shared or (m, n) per sample, mat1 (m, k), mat2 (k, n)",
        operands=_addmm_operands,
        operand_shapes=_addmm_shapes,
        call=_addmm_call,
        reference=_addmm_reference,
        exact_amplitude=_addmm_amplitude,
        option_choices={
            "beta": (1, 0, 2, 0.5),
            "alpha": (1, 2, 0.5, -1),
            "bias": ("vector", "matrix"),
        },
        bound=PRODUCT_BOUND + " (K + 1 terms: the bias is one)",
        draw_shape=draw_addmm,
        scale="tokens",
        repro_call=_addmm_repro,
        control_examples=_product_controls(beta=1, alpha=1, bias="vector"),
        aten_names=("aten::addmm",),
    ),
    OpSpec(
        name="linear",
        entries=("F.linear",),
        shape_doc="form 2d: (m, k, n); 3d: (m, s, k, n); weight (n, k), bias (n,) shared",
        operands=_linear_operands,
        operand_shapes=_linear_shapes,
        call=_linear_call,
        reference=_linear_reference,
        exact_amplitude=_linear_amplitude,
        option_choices={"bias": (True, False), "form": ("2d", "3d")},
        bound=PRODUCT_BOUND + " (K + 1 terms with a bias)",
        draw_shape=draw_linear,
        scale="tokens",
        repro_call=_fixed_repro("F.linear(*args)"),
        control_examples=_product_controls(bias=True, form="2d"),
        aten_names=("aten::linear",),
        padded=_linear_padded,
    ),
)
