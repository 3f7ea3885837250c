"""The error-bound maths the references use: probabilistic sum bounds, the output rounding and
the exact-integer amplitude (public as ``bi_props.sum_error``, ``output_rounding``,
``product_reference``, ``bounded_amplitude``; docs/properties.md derives them).
"""

from __future__ import annotations

import math
import sys
from typing import Any

import numpy as np

from .compare import exact_integer_limit, smallest_normal, unit_roundoff
from .opspec import Reference

U32 = unit_roundoff("float32")


LAMBDA = 4.0
"""The confidence parameter of the probabilistic bounds below. Azuma-Hoeffding: a sum of
independent mean-zero rounding errors delta_k * s_k with |delta_k| <= u exceeds
LAMBDA * u * sqrt(sum s_k^2) with probability at most 2 exp(-LAMBDA^2 / 2) = 6.7e-4 per output
element (the inequality behind Higham & Mary's Theorem 2.4, for the worst distribution of
errors bounded by u). Round-to-nearest errors have a variance of at most u^2 / 3, so by the
variance form of the same inequality (Bernstein) the bound sits at 4 sqrt(3) = 6.9 standard
deviations: about 1e-11 per element. benchmarks/tightness.py measures what honest orders use
of it (at most half for the sum-like ops, over every case it runs; 2026-12-05)."""


SIXTEEN_BIT_CAP_ULPS = 32
"""A sum computed in a 16-bit type is allowed at most this many of that type's ulps of
max(|sum|, sqrt(sum t^2)) (the typical size of a sum of random-sign terms): honest 16-bit
accumulation of 4096 random-sign terms shows about 6 (one standard deviation); without the cap the
probabilistic bound would accept an all-zero bf16 output at K = 4096."""


def _bounded_amplitude(terms: int, acc: str = "float32", scale: float = 1.0) -> int:
    """Largest integer a with ``terms * a * a * scale`` within the accumulator's exact-integer
    range (2^24 for float32; the output's own for a kernel that accumulates in 16 bits).

    Then every partial sum of products of integers in [-a, a] is an integer the accumulator holds
    exactly, whatever the order, and the result is rounded once to the output dtype: the
    reference rounded once (to nearest even) is the only right answer, bit for bit.
    """
    limit = exact_integer_limit(acc)
    if terms == 0:
        return 8
    a = math.isqrt(int(limit / (max(terms, 1) * scale)))
    return min(a, 8)


def _deterministic(n: int, u: float) -> float:
    """The worst-case relative bound of n chained roundings, (1 + u)^n - 1 (Higham's gamma_n
    without its n u < 1 restriction), used only as a cap: the largest float where it overflows
    (a 16-bit sum of more than ~182,000 terms; math.expm1 raised there, an internal error that
    ``bi-props fuzz`` found on 2026-12-05), so that times a zero sum |t| it is still 0."""
    exponent = n * math.log1p(u)
    return math.expm1(exponent) if exponent < 709 else sys.float_info.max


def _gamma(n: int, u: float = U32) -> float:
    """Higham & Mary's probabilistic gamma~_n(lambda) = exp(lambda sqrt(n) u + n u^2 / (1 - u)) - 1
    (N. J. Higham and T. Mary, "A New Approach to Probabilistic Rounding Error Analysis", SIAM J.
    Sci. Comput. 41(5), 2019, Theorem 2.4: |theta_n| <= gamma~_n(lambda) with probability at
    least 1 - 2 exp(-lambda^2 (1 - u)^2 / 2); for an inner product of length n, Theorem 3.1, at
    least 1 - 2 n exp(-lambda^2 (1 - u)^2 / 2)), capped by the deterministic bound. Finite."""
    probabilistic = math.expm1(LAMBDA * math.sqrt(max(n, 0)) * u + n * u * u / (1 - u))
    return min(probabilistic, _deterministic(n, u))


def _sum_error(total: Any, squares: Any, absolute: Any, n: int, u: float) -> Any:
    """Allowed error of a sum of n terms (products already rounded or not) in any value-oblivious
    order and grouping (sequential, blocked, split, pairwise), accumulated with unit roundoff u.

    Every addition rounds its partial sum s: the error is sum(delta_k s_k) + sum(delta_i t_i)
    over the additions and the products. By Azuma-Hoeffding it is within
    LAMBDA * u * sqrt(sum s_k^2 + sum t_i^2) except with probability 2 exp(-LAMBDA^2 / 2). The
    partial sums depend on the order: the drawn terms are exchangeable (independent draws), and
    for a node summing m of them E[s^2] = m^2 mean^2 + m var (n - m) / (n - 1); a sequential
    chain (nodes of every size 2..n) has the largest total. Twice that expectation stands for
    the realized one (a single dominant term at the start of the chain doubles it). Hence

        LAMBDA * u * sqrt(sum t^2 + 2 (c2 mean^2 + c1 var)),
        c2 = sum_{m=2..n} m^2,  c1 = sum_{m=2..n} m (n - m) / (n - 1),

    capped by the deterministic (1 + u)^n - 1 times sum |t|. It grows like u n for cancelling
    terms and u n^1.5 |mean| for same-sign ones, as reordering errors really do. In a 16-bit
    accumulator it is also capped at SIXTEEN_BIT_CAP_ULPS ulps of max(|sum|, sqrt(sum t^2)).
    """
    return _sum_error_parts(total, squares, absolute, n, u)[0]


def _chain_spread(squares: Any, total: Any, n: Any) -> Any:
    """sum t^2 + 2 (c2 mean^2 + c1 var): the squared terms plus twice the expected sum of squared
    partial sums of a chain over n exchangeable terms (``_sum_error`` derives it); n may be an
    array (one count per sum)."""
    n = np.maximum(np.asarray(n, dtype=np.float64), 1.0)
    with np.errstate(invalid="ignore", over="ignore"):
        mean = np.asarray(total, dtype=np.float64) / n
        var = np.maximum(np.asarray(squares, dtype=np.float64) / n - mean * mean, 0.0)
        c2 = n * (n + 1) * (2 * n + 1) / 6 - 1
        c1 = np.where(n > 1, n * (n + 1) / 6 - 1, 0.0)
        return squares + 2 * (c2 * mean * mean + c1 * var)


def _sum_error_parts(total: Any, squares: Any, absolute: Any, n: int, u: float) -> tuple[Any, Any]:
    """(``_sum_error``'s bound, where its probabilistic part decided rather than a cap): a
    composite bound combines probabilistic parts in quadrature (one Azuma-Hoeffding bound over
    all their roundings) but must add a capped part as it is."""
    n = max(int(n), 1)
    with np.errstate(invalid="ignore", over="ignore"):
        probabilistic = LAMBDA * u * np.sqrt(_chain_spread(squares, total, n))
        bound = np.minimum(probabilistic, _deterministic(n, u) * absolute)
        if u > U32:  # a 16-bit accumulator: 2 u is one ulp at the top of a binade
            typical = np.maximum(np.abs(total), np.sqrt(squares))
            bound = np.minimum(bound, SIXTEEN_BIT_CAP_ULPS * 2 * u * typical)
        return bound, bound >= probabilistic


def _output_rounding(
    value: np.ndarray,
    computed_error: np.ndarray,
    dtype: str,
    magnitude: Any = None,
    acc: str = "float32",
    last_counted: bool = False,
) -> np.ndarray:
    """The stated bound: ``computed_error`` (the internals, in ``acc``), one final rounding to
    ``dtype`` (u |value|), and an absolute slack of the smallest normal number of ``acc`` (a
    flushed intermediate), or of ``dtype`` where the result may lie below it (subnormal results
    may be flushed to zero). A kernel declaring 16-bit internals (``acc`` == the 16-bit output
    dtype) may also round up to two intermediates in that dtype (a product rounded before a bias
    is added, an exp stored in bf16): 2 u ``magnitude``, where ``magnitude`` bounds the
    intermediate (the sum of absolute terms; |value| if None). A float32-accumulating kernel
    gets no such slack: an intermediate rounded through a narrower type is exactly what the
    check must catch.

    The intermediate slack is capped at 2 u |value| + 2 ``computed_error``: an intermediate is a
    partial result, within |value| plus the partial sums whose size the internals' error already
    bounds (it is at least u times the largest of them: LAMBDA sqrt(spread) >= max |partial|),
    so its rounding costs at most u (|value| + computed_error / u). Without the cap a cancelling
    16-bit sum was allowed 2 u sum |t|: up to 7e4 ulps of its result.

    ``last_counted``: the op's ``computed_error`` already counts the rounding of its last
    operation in ``acc`` (a sum's last addition, a normalisation's last product). Where the
    output dtype *is* ``acc`` (float32 or float64 internals), rounding to it is then the
    identity and is not added again (before 2026-12-05 it was: a float32 rms_norm or softmax
    counted its last rounding twice). Not for 16-bit internals: a kernel declaring them may
    compute partly in float32 and round to the output at the end.
    """
    u = unit_roundoff(dtype)
    identity = last_counted and dtype == acc and dtype in ("float32", "float64")
    # The rounding to the output dtype: u |value|, and u times the error of the value rounded
    # (kept where the last rounding is the op's own: it counted u |exact value| only).
    final = 0.0 if identity else u
    magnitude = np.abs(value) if magnitude is None else magnitude
    narrow = acc == dtype and dtype not in ("float32", "float64")
    with np.errstate(invalid="ignore", over="ignore"):
        cap = 2 * u * np.abs(value) + 2 * np.asarray(computed_error, dtype=np.float64)
        intermediate = np.minimum(2 * u * magnitude, cap) if narrow else 0.0
        bound = (1 + u) * computed_error + final * np.abs(value) + intermediate
        # A flushed intermediate in ``acc`` costs at most its smallest normal; the result itself
        # may be flushed only where it can lie below the *output's* smallest normal. For a
        # float16 output of float32 internals the old slack of float16's smallest normal
        # everywhere allowed a softmax of 4,096 keys ~500 ulps (its probabilities near 2^-14).
        output_flush = np.where(np.abs(value) - bound <= smallest_normal(dtype), 1.0, 0.0)
        flush = np.maximum(smallest_normal(acc), output_flush * smallest_normal(dtype))
    return bound + flush


def _product_reference(
    a: np.ndarray, b: np.ndarray, k: int, dtype: str, acc: str = "float32"
) -> Reference:
    """A product of K terms summed in ``acc`` in any value-oblivious order (_sum_error)."""
    with np.errstate(all="ignore"):
        value = a @ b
        magnitude = np.abs(a) @ np.abs(b)
        squares = (a * a) @ (b * b)
    error = _sum_error(value, squares, magnitude, k, unit_roundoff(acc))
    return Reference(value, _output_rounding(value, error, dtype, magnitude, acc), dtype, acc)


# Public names of the bound helpers, for users' references (docs/ops.md).
sum_error = _sum_error
output_rounding = _output_rounding
product_reference = _product_reference
bounded_amplitude = _bounded_amplitude
