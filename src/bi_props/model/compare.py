"""Bit patterns, rounding, ULP distance and numpy.testing-style mismatch messages.

Everything here is numpy only: the controller judges observations without importing torch, and the
reference can never be routed through a switched-on kernel.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Bits of storage, bits of significand (with the implicit one), largest finite value.
FORMATS: dict[str, tuple[type, int, float]] = {
    "float64": (np.uint64, 53, float(np.finfo(np.float64).max)),
    "float32": (np.uint32, 24, float(np.finfo(np.float32).max)),
    "bfloat16": (np.uint16, 8, 3.3895313892515355e38),
    "float16": (np.uint16, 11, 65504.0),
}


INTEGER_DTYPES = ("int64",)
"""Integer outputs (an argmax, top-k indices): their "bits" are the values themselves, compared
exactly; an ulp between two of them is a difference of 1."""


def _hex_width(dtype: str) -> int:
    if dtype in INTEGER_DTYPES:
        return 16
    return np.dtype(FORMATS[dtype][0]).itemsize * 2


def unit_roundoff(dtype: str) -> float:
    """u = 2**-p: the relative error of one round-to-nearest in ``dtype``."""
    return 2.0 ** -FORMATS[dtype][1]


def smallest_subnormal(dtype: str) -> float:
    return {
        "float64": 5e-324,
        "float32": float(np.finfo(np.float32).smallest_subnormal),
        "bfloat16": 9.183549615799121e-41,
        "float16": 5.960464477539063e-08,
    }[dtype]


def smallest_normal(dtype: str) -> float:
    """Below this, a kernel may flush to zero (FTZ is common on accelerators and in exp paths)."""
    return {
        "float64": float(np.finfo(np.float64).tiny),
        "float32": float(np.finfo(np.float32).tiny),
        "bfloat16": float(np.finfo(np.float32).tiny),
        "float16": float(np.finfo(np.float16).tiny),
    }[dtype]


def exact_integer_limit(dtype: str) -> int:
    """Every integer of magnitude <= this is exactly representable in ``dtype``."""
    return 2 ** FORMATS[dtype][1]


def ulp_size(values: np.ndarray, dtype: str) -> np.ndarray:
    """The spacing of ``dtype``'s representable numbers at each |value| (the subnormal spacing
    below the smallest normal): one ulp, in which distances and allowed slacks are stated."""
    if dtype in INTEGER_DTYPES:  # an integer output's spacing is 1
        return np.ones(np.shape(values))
    p = FORMATS[dtype][1]
    with np.errstate(divide="ignore", invalid="ignore"):
        magnitude = np.maximum(np.abs(np.asarray(values, dtype=np.float64)), smallest_normal(dtype))
        exponent = np.floor(np.log2(magnitude))
    spacing = np.exp2(exponent - (p - 1))
    return np.where(np.isfinite(spacing), spacing, np.exp2(np.log2(FORMATS[dtype][2]) - (p - 1)))


def bits_to_float64(bits: np.ndarray, dtype: str) -> np.ndarray:
    """Decode stored bit patterns to float64 values (exact: every format here embeds in float64)."""
    bits = np.asarray(bits)
    if bits.ndim == 0:
        return bits_to_float64(bits.reshape(1), dtype).reshape(())
    if dtype == "float64":
        return bits.view(np.float64).copy()
    if dtype in INTEGER_DTYPES:
        return bits.astype(np.float64)
    if dtype == "float32":
        return bits.view(np.float32).astype(np.float64)
    if dtype == "float16":
        return bits.view(np.float16).astype(np.float64)
    if dtype == "bfloat16":
        return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    raise ValueError(f"no bit decoding for dtype {dtype!r}")


def _round_to_odd_float32(x: np.ndarray) -> np.ndarray:
    """float64 -> float32 rounding to odd, so that a second rounding to bfloat16 is correct."""
    with np.errstate(over="ignore", invalid="ignore"):
        nearest = x.astype(np.float32)
        back = nearest.astype(np.float64)
        inexact = (back != x) & np.isfinite(x) & np.isfinite(back)
        away = inexact & (np.abs(back) > np.abs(x))
        towards_zero = np.where(away, np.nextafter(nearest, np.float32(0)), nearest)
        bits = towards_zero.view(np.uint32).copy()
        bits[inexact] |= np.uint32(1)
    return bits.view(np.float32)


def round_to_bits(values: np.ndarray, dtype: str) -> np.ndarray:
    """Round float64 values once, to nearest even, into ``dtype``; return the bit patterns."""
    values = np.asarray(values, dtype=np.float64)
    if values.ndim == 0:
        return round_to_bits(values.reshape(1), dtype).reshape(())
    with np.errstate(over="ignore", invalid="ignore"):
        if dtype == "float64":
            return values.view(np.uint64).copy()
        if dtype in INTEGER_DTYPES:  # integer-valued references (exact below 2^53)
            return values.astype(np.int64)
        if dtype == "float32":
            return values.astype(np.float32).view(np.uint32)
        if dtype == "float16":
            return values.astype(np.float16).view(np.uint16)
        if dtype == "bfloat16":
            f32 = _round_to_odd_float32(values).view(np.uint32).astype(np.uint64)
            nan = np.isnan(values)
            lsb = (f32 >> 16) & 1
            rounded = ((f32 + 0x7FFF + lsb) >> 16).astype(np.uint16)
            rounded[nan] = np.uint16(0x7FC0)
            return rounded
    raise ValueError(f"no rounding for dtype {dtype!r}")


def ordered(bits: np.ndarray, dtype: str) -> np.ndarray:
    """Map bit patterns to integers whose order is the order of the floats (for ULP distance);
    integer outputs are their own order."""
    if dtype in INTEGER_DTYPES:
        return np.asarray(bits).astype(np.int64)
    width = np.dtype(FORMATS[dtype][0]).itemsize * 8
    b = bits.astype(np.int64) if width < 64 else bits.view(np.int64)
    sign = np.int64(1) << (width - 1) if width < 64 else np.int64(-(2**63))
    if width < 64:
        negative = (b & sign) != 0
        magnitude = b & (sign - 1)
        return np.where(negative, -magnitude, magnitude)
    negative = b < 0
    return np.where(negative, -(b & np.int64(2**63 - 1)), b)


def ulp_distance(actual: np.ndarray, desired: np.ndarray, dtype: str) -> np.ndarray:
    """Number of representable values between two bit patterns (0 for +0.0 vs -0.0)."""
    a, d = ordered(actual, dtype), ordered(desired, dtype)
    if dtype == "float64" or dtype in INTEGER_DTYPES:  # an int64 difference can overflow
        return np.abs(a.astype(object) - d.astype(object))
    return np.abs(a - d)


@dataclass(frozen=True)
class Mismatch:
    """Where two results disagree, in the style of numpy.testing."""

    what: str
    mismatched: int
    total: int
    first_index: tuple[int, ...]
    actual: float
    desired: float
    actual_bits: int
    desired_bits: int
    max_abs: float
    max_rel: float
    max_ulp: int
    dtype: str
    bound: float | None = None

    def __str__(self) -> str:
        width = _hex_width(self.dtype)
        pct = 100.0 * self.mismatched / max(self.total, 1)
        lines = [
            f"{self.what}",
            f"Mismatched elements: {self.mismatched} / {self.total} ({pct:.3g}%)",
            f"First mismatch at index {self.first_index}: "
            f"actual {self.actual!r} (0x{self.actual_bits:0{width}x}) vs "
            f"desired {self.desired!r} (0x{self.desired_bits:0{width}x})",
            f"Max absolute difference: {self.max_abs:.6g}",
            f"Max relative difference: {self.max_rel:.6g}",
            f"Max ULP difference ({self.dtype}): {self.max_ulp}",
        ]
        if self.bound is not None:
            lines.append(f"Allowed error at first mismatch: {self.bound:.6g}")
        return "\n".join(lines)


def _mismatch(
    what: str,
    bad: np.ndarray,
    actual_bits: np.ndarray,
    desired_bits: np.ndarray,
    dtype: str,
    bound: np.ndarray | None = None,
    desired_values: np.ndarray | None = None,
) -> Mismatch:
    a = bits_to_float64(actual_bits, dtype)
    d = bits_to_float64(desired_bits, dtype) if desired_values is None else desired_values
    first = np.unravel_index(int(np.flatnonzero(bad)[0]), bad.shape) if bad.ndim else ()
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        diff = np.abs(a - d)[bad]
        rel = diff / np.abs(d[bad])
    finite_diff = diff[np.isfinite(diff)]
    finite_rel = rel[np.isfinite(rel)]
    return Mismatch(
        what=what,
        mismatched=int(bad.sum()),
        total=int(bad.size),
        first_index=tuple(int(i) for i in first),
        actual=float(a[first]),
        desired=float(d[first]),
        actual_bits=int(actual_bits[first]),
        desired_bits=int(desired_bits[first]),
        max_abs=float(finite_diff.max()) if finite_diff.size else float("nan"),
        max_rel=float(finite_rel.max()) if finite_rel.size else float("nan"),
        max_ulp=int(ulp_distance(actual_bits, desired_bits, dtype)[bad].max()),
        dtype=dtype,
        bound=None if bound is None else float(bound[first]),
    )


def compare_bits(actual: np.ndarray, desired: np.ndarray, dtype: str, what: str) -> Mismatch | None:
    """Bitwise equality of two same-shaped bit-pattern arrays (NaN == NaN, -0.0 != +0.0)."""
    bad = actual != desired
    if not bad.any():
        return None
    return _mismatch(what, bad, actual, desired, dtype)


def compare_to_reference(
    actual: np.ndarray,
    reference: np.ndarray,
    tolerance: np.ndarray | None,
    dtype: str,
    what: str,
) -> Mismatch | None:
    """Actual bits against a float64 reference: bitwise when ``tolerance`` is None, else bounded.

    Bounded: ``|actual - reference| <= tolerance`` elementwise; NaN must meet NaN, an infinity must
    meet the same infinity, except that a reference within ``tolerance`` of the dtype's overflow
    threshold may round to the infinity of its sign.
    """
    desired = round_to_bits(reference, dtype)
    if tolerance is None:
        # Exact inputs: bitwise, except the sign of an exact zero, which depends on the order of
        # the additions (-0 + +0 = +0, -0 + -0 = -0) and so is not a property of the result.
        zero = (bits_to_float64(actual, dtype) == 0) & (bits_to_float64(desired, dtype) == 0)
        bad = (actual != desired) & ~zero
        return _mismatch(what, bad, actual, desired, dtype) if bad.any() else None
    a = bits_to_float64(actual, dtype)
    r = np.asarray(reference, dtype=np.float64)
    tol = np.broadcast_to(np.asarray(tolerance, dtype=np.float64), r.shape)
    with np.errstate(invalid="ignore", over="ignore"):
        close = np.abs(a - r) <= tol
        both_nan = np.isnan(a) & np.isnan(r)
        same_inf = np.isinf(a) & np.isinf(r) & (np.sign(a) == np.sign(r))
        largest = FORMATS[dtype][2] if dtype in FORMATS else np.inf  # integers never overflow
        overflow_ok = np.isinf(a) & np.isfinite(r) & (np.abs(r) + tol >= largest)
        overflow_ok &= np.sign(a) == np.sign(r)
        ok = close | both_nan | same_inf | overflow_ok
    if ok.all():
        return None
    return _mismatch(what, ~ok, actual, desired, dtype, tol, r)


def ulp_summary(
    actual: np.ndarray, reference: np.ndarray, tolerance: np.ndarray | None, dtype: str
) -> tuple[int, float]:
    """(observed, allowed) in ulps of ``dtype`` at the element that uses most of its allowed
    slack: the distance from the reference rounded once to ``dtype`` (0 for +0.0 vs -0.0), and
    the bound there divided by the ulp at the reference (0 when comparing bit for bit). Elements
    that are NaN or infinite on either side are left out; (0, 0.0) when nothing is left."""
    desired = round_to_bits(reference, dtype)
    a = bits_to_float64(actual, dtype)
    r = np.asarray(reference, dtype=np.float64)
    with np.errstate(invalid="ignore", over="ignore"):
        finite = np.isfinite(a) & np.isfinite(r) & np.isfinite(bits_to_float64(desired, dtype))
    if not finite.any():
        return 0, 0.0
    distance = ulp_distance(actual, desired, dtype)[finite].astype(np.int64)
    if tolerance is None:
        return int(distance.max()), 0.0
    tol = np.broadcast_to(np.asarray(tolerance, dtype=np.float64), r.shape)[finite]
    allowed = tol / ulp_size(r[finite], dtype)
    with np.errstate(divide="ignore", invalid="ignore"):
        use = np.where(allowed > 0, distance / allowed, np.where(distance > 0, np.inf, 0.0))
    worst = int(np.argmax(use))
    return int(distance[worst]), float(allowed[worst])
