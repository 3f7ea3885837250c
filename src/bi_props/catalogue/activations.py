"""Activations: silu and the gated ones (SwiGLU / GeGLU: vLLM's silu_and_mul, gelu_and_mul).

One op's helpers, shape strategy and OpSpec (in ``OPS``) side by side (``bi_props.catalogue``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..model.bounds import (
    _output_rounding,
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
    _entry_function,
    _fixed_repro,
    _never_exact,
    _rows_padded,
    _stock_or_import,
    _x_operand,
    _x_shape,
)


def _silu_call(entry: str, args: Sequence[Any], case: Case, lengths: Sequence[int]) -> Any:
    import torch

    return torch.nn.functional.silu(args[0])


def _silu_reference(
    x: Sequence[np.ndarray], case: Case, lengths: Sequence[int], acc: str = "float32"
):
    """x / (1 + exp(-x)) in float32: exp (1-2 ulp), one add, one division: relative error
    <= u (|x| + 4), the |x| from exp's argument scaling its own relative error. Where exp(-x)
    overflows float32 (x < -88.72) a float32 kernel returns -0.0 for a true value of magnitude
    below 3e-37: that flush is allowed (found in stock CPU silu by this very reference)."""
    dtype = case.dtype
    with np.errstate(all="ignore"):
        value = x[0] / (1.0 + np.exp(-x[0]))
        error = unit_roundoff(acc) * (np.abs(x[0]) + 4) * np.abs(value)
        error = np.where(x[0] < -88.72, np.abs(value), error)
    return (Reference(value, _output_rounding(value, error, dtype, None, acc), dtype, acc),)


GELU_APPROXIMATIONS = ("none", "tanh")


def _gated_operands(case: Case) -> tuple[Operand, ...]:
    return (Operand("x", 0),)


def _gated_shapes(case: Case, rows: int) -> tuple[tuple[int, ...], ...]:
    _, h = case.shape
    return ((rows, 2 * h),)


def _silu_and_mul_call(entry: str, args: Sequence[Any], case: Case, lengths: Sequence[int]):
    return _entry_function(entry)(args[0])


def _gelu_and_mul_call(entry: str, args: Sequence[Any], case: Case, lengths: Sequence[int]):
    return _entry_function(entry)(args[0], case.opt("approximate", "none"))


GATED_BOUND = (
    "silu: relative u_acc (|a| + 6) on silu(a) b (exp, one add, one division, the product; the"
    " flush to 0 where exp(-a) overflows); gelu: absolute u_acc (3 |a| + 4 |gelu(a)|) |b| (1 +"
    " erf or 1 + tanh rounds absolutely, then two products); plus one rounding to the output"
    " dtype and the smallest normal (16-bit internals: the activation rounded once more)"
)


def _erf(z: np.ndarray) -> np.ndarray:
    import math

    return np.vectorize(math.erf, otypes=[np.float64])(z) if z.size else z.copy()


def _gelu_value(a: np.ndarray, approximate: str) -> np.ndarray:
    if approximate == "tanh":
        inner = math.sqrt(2.0 / math.pi) * (a + 0.044715 * a * a * a)
        return 0.5 * a * (1.0 + np.tanh(inner))
    return 0.5 * a * (1.0 + _erf(a / math.sqrt(2.0)))


def _gated_reference(kind: str):
    def reference(
        x: Sequence[np.ndarray], case: Case, lengths: Sequence[int], acc: str = "float32"
    ):
        """act(a) * b in float64, a = x[:, :h], b = x[:, h:], for a kernel computing in ``acc``.

        silu: exp (a couple of ulps), 1 + e, a / (1 + e), times b: relative <= u (|a| + 6);
        where exp(-a) overflows float32 (a < -88.72) a signed zero is allowed. gelu: erf (or tanh
        of the cubic) within ~3 u absolute, 1 + that rounds absolutely (u), then 0.5 a (...) and
        the product with b: |error| <= u (3 |a| + 4 |gelu(a)|) |b| (absolute: 1 + erf cancels for
        a << 0, as every float32 kernel computes it). A 16-bit-internal kernel may round act(a)
        in the output dtype before the product (output_rounding's intermediate slack)."""
        (v,) = x
        h, u = case.shape[1], unit_roundoff(acc)
        a, b = v[:, :h], v[:, h:]
        with np.errstate(all="ignore"):
            if kind == "silu":
                act = a / (1.0 + np.exp(-a))
                value = act * b
                error = u * (np.abs(a) + 6) * np.abs(value)
                error = np.where(a < -88.72, np.abs(value), error)
            else:
                act = _gelu_value(a, case.opt("approximate", "none"))
                value = act * b
                error = u * (3 * np.abs(a) + 4 * np.abs(act)) * np.abs(b)
        bound = _output_rounding(value, error, out_dtype(case), None, acc)
        return (Reference(value, bound, out_dtype(case), acc),)

    return reference


_STOCK_SILU_AND_MUL = '''
def silu_and_mul(x):
    """Stock composite (vLLM's SiluAndMul.forward_native): silu(x[..., :h]) * x[..., h:]."""
    h = x.shape[-1] // 2
    return F.silu(x[..., :h]) * x[..., h:]
'''


_STOCK_GELU_AND_MUL = '''
def gelu_and_mul(x, approximate="none"):
    """Stock composite (vLLM's GeluAndMul.forward_native): gelu(x[..., :h]) * x[..., h:]."""
    h = x.shape[-1] // 2
    return F.gelu(x[..., :h], approximate=approximate) * x[..., h:]
'''


def _silu_and_mul_repro(case: Case) -> tuple[str, str]:
    return _stock_or_import(case, _STOCK_SILU_AND_MUL, "silu_and_mul"), "silu_and_mul(args[0])"


def _gelu_and_mul_repro(case: Case) -> tuple[str, str]:
    definition = _stock_or_import(case, _STOCK_GELU_AND_MUL, "gelu_and_mul")
    return definition, f"gelu_and_mul(args[0], {case.opt('approximate', 'none')!r})"


_ONE_BITS = {"bfloat16": 0x3F80, "float16": 0x3C00}


def _sweep_whole(case: Case, patterns: np.ndarray) -> np.ndarray:
    """silu's exhaustive sweep: the input is the patterns."""
    return patterns


def _sweep_gated(case: Case, patterns: np.ndarray) -> np.ndarray:
    """A gated activation's sweep: the patterns as the activation half, 1.0 as the other (the
    product is then the activation itself, rounded once more)."""
    ones = np.full(patterns.shape, _ONE_BITS[case.dtype], dtype=np.uint16)
    return np.concatenate([patterns, ones], axis=1)


def draw_rows_by_dim(draw: Any, ctx: Any) -> Shape:
    """(m, n): silu."""
    return (draw(ctx.rows), draw(ctx.dim)), {}


def draw_gated(draw: Any, ctx: Any) -> Shape:
    """silu_and_mul: (m, h), x of (m, 2h)."""
    return (draw(ctx.rows), draw(ctx.dim)), {}


def draw_gelu_and_mul(draw: Any, ctx: Any) -> Shape:
    options = {"approximate": draw(ctx.option("approximate"))}
    return (draw(ctx.rows), draw(ctx.dim)), options


OPS: tuple[OpSpec, ...] = (
    OpSpec(
        name="silu",
        entries=("F.silu",),
        shape_doc="(m, n): input (m, n) per sample; SwiGLU's activation",
        operands=_x_operand,
        operand_shapes=_x_shape,
        call=_silu_call,
        reference=_silu_reference,
        exact_amplitude=_never_exact,
        bound="relative u_acc (|x| + 4) (exp, one add, one division); the flush to -0.0"
        " where exp(-x) overflows",
        draw_shape=draw_rows_by_dim,
        scale="tokens",
        repro_call=_fixed_repro("F.silu(args[0])"),
        # Stock CPU silu: the needle alone (15 elements) is all vector tail, a scalar formula;
        # inside a batch of 256 rows its elements are in full vectors (x86 ATen, 2026-12-04).
        control_examples=(ControlExample((1, 15), (255,)),),
        aten_names=("aten::silu",),
        sweep=_sweep_whole,
        padded=_rows_padded,
    ),
    OpSpec(
        name="silu_and_mul",
        entries=("bi_props.ops.silu_and_mul",),
        shape_doc="(m, h): x (m, 2h) per sample; returns silu(x[:, :h]) * x[:, h:], (m, h)"
        " (vLLM's SwiGLU activation)",
        operands=_gated_operands,
        operand_shapes=_gated_shapes,
        call=_silu_and_mul_call,
        reference=_gated_reference("silu"),
        exact_amplitude=_never_exact,
        bound=GATED_BOUND,
        draw_shape=draw_gated,
        scale="tokens",
        repro_call=_silu_and_mul_repro,
        # A transposed input: the batch moves the needle's elements between the vector body and
        # the scalar tail of silu (x86 ATen). Where the tail falls depends on the vector width,
        # so one example per width: (4, 95) with AVX-512 (16 floats; 2026-12-04), (1, 127) with
        # AVX2 only (8 floats; an AMD EPYC without AVX-512, 2026-12-06, where (4, 95) is
        # invariant; (1, 127) showed variance with each of 4 seeds tried, smaller ones with
        # some). The control stops at the first that shows variance.
        control_examples=(
            ControlExample((4, 95), (15,), layouts=("transposed",)),
            ControlExample((1, 127), (15,), layouts=("transposed",)),
        ),
        sweep=_sweep_gated,
        padded=_rows_padded,
    ),
    OpSpec(
        name="gelu_and_mul",
        entries=("bi_props.ops.gelu_and_mul",),
        shape_doc="(m, h): x (m, 2h) per sample; returns gelu(x[:, :h], approximate) *"
        " x[:, h:], (m, h) (vLLM's GeGLU activation)",
        operands=_gated_operands,
        operand_shapes=_gated_shapes,
        call=_gelu_and_mul_call,
        reference=_gated_reference("gelu"),
        exact_amplitude=_never_exact,
        option_choices={"approximate": GELU_APPROXIMATIONS},
        bound=GATED_BOUND,
        draw_shape=draw_gelu_and_mul,
        scale="tokens",
        repro_call=_gelu_and_mul_repro,
        # As silu_and_mul's, tanh-approximated gelu (x86 ATen, 2026-12-04).
        control_examples=(
            ControlExample((4, 47), (15,), {"approximate": "tanh"}, layouts=("transposed",)),
        ),
        sweep=_sweep_gated,
        padded=_rows_padded,
    ),
)
