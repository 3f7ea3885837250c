"""compare.py: correctly rounded float64 -> float32/float16/bfloat16, bit decoding, ULP distance,
bitwise and bounded comparison, and the numpy.testing-style mismatch message."""

from __future__ import annotations

import math
import re
from fractions import Fraction

import numpy as np
import pytest

from bi_props.model.compare import (
    FORMATS,
    Mismatch,
    bits_to_float64,
    compare_bits,
    compare_to_reference,
    round_to_bits,
    ulp_distance,
)

# bits_to_float64 of signalling-NaN patterns makes numpy warn "invalid value encountered in
# cast" (harmless: the result is a NaN); the tests that decode every pattern silence it.
DTYPES = ("float32", "float16", "bfloat16")
# significand bits (with the implicit one), smallest normal exponent, largest exponent
SPEC = {"float32": (24, -126, 127), "float16": (11, -14, 15), "bfloat16": (8, -126, 127)}
NP_DTYPE = {"float32": np.float32, "float16": np.float16}


# ---------------------------------------------------------------------------------------------
# An independent oracle: exact rational arithmetic, one round-half-even.


def oracle_value(x: float, dtype: str) -> float:
    """x rounded once, to nearest even, into ``dtype`` (returned as a float64)."""
    if math.isnan(x) or math.isinf(x) or x == 0:
        return x
    p, emin, emax = SPEC[dtype]
    exponent = max(math.frexp(abs(x))[1] - 1, emin)
    quantum = Fraction(2) ** (exponent - p + 1)
    rounded = round(Fraction(abs(x)) / quantum) * quantum  # Fraction rounds half to even
    largest = (2 - Fraction(2) ** (1 - p)) * Fraction(2) ** emax
    if rounded > largest:
        return math.copysign(math.inf, x)
    return math.copysign(float(rounded), x)


def encode(value: float, dtype: str) -> int:
    """Bit pattern of a value that is exactly representable in ``dtype``."""
    if dtype == "bfloat16":
        word = int(np.array([value], dtype=np.float32).view(np.uint32)[0])
        assert word & 0xFFFF == 0, "not a bfloat16 value"
        return word >> 16
    if dtype == "float16":
        return int(np.array([value], dtype=np.float16).view(np.uint16)[0])
    return int(np.array([value], dtype=np.float32).view(np.uint32)[0])


def oracle_bits(x: float, dtype: str) -> int:
    return encode(oracle_value(x, dtype), dtype)


def rtb(x: float, dtype: str) -> int:
    return int(round_to_bits(np.array([x]), dtype)[0])


def is_nan_bits(bits: int, dtype: str) -> bool:
    return bool(np.isnan(bits_to_float64(np.array([bits], dtype=FORMATS[dtype][0]), dtype)[0]))


def random_float64s(dtype: str, n: int, seed: int) -> np.ndarray:
    """Float64s spread over (and a little beyond) the dtype's range, plus exact ties and their
    float64 neighbours."""
    rng = np.random.default_rng(seed)
    p, emin, emax = SPEC[dtype]
    exponents = rng.integers(emin - p - 3, emax + 2, size=n)
    mantissas = rng.integers(0, 2**52, size=n, dtype=np.uint64)
    signs = rng.choice([-1.0, 1.0], size=n)
    spread = signs * np.ldexp(1.0 + mantissas.astype(np.float64) / 2.0**52, exponents)
    # Ties: a representable value plus half an ulp (subnormal quantum below emin).
    exponents = rng.integers(emin - 2, emax + 1, size=n)
    steps = rng.integers(0, 2 ** (p - 1), size=n)
    base = np.ldexp(1.0 + steps / 2.0 ** (p - 1), exponents)
    half_ulp = np.ldexp(1.0, np.maximum(exponents, emin) - p)
    ties = signs * (base + half_ulp)
    above = np.nextafter(ties, signs * np.inf)
    below = np.nextafter(ties, -signs * np.inf)
    return np.concatenate([spread, ties, above, below])


# ---------------------------------------------------------------------------------------------
# round_to_bits: hand-picked cases


@pytest.mark.parametrize(
    ("dtype", "one", "fraction_bits"),
    [("float32", 0x3F800000, 23), ("float16", 0x3C00, 10), ("bfloat16", 0x3F80, 7)],
)
def test_ties_round_to_even(dtype, one, fraction_bits):
    half_ulp = 2.0 ** -(fraction_bits + 1)
    # 1 + half ulp: a tie between 1 (even) and 1 + ulp (odd) -> 1.
    assert rtb(1.0 + half_ulp, dtype) == one
    # 1 + 3 half ulps: a tie between 1 + ulp (odd) and 1 + 2 ulp (even) -> 1 + 2 ulp.
    assert rtb(1.0 + 3 * half_ulp, dtype) == one + 2
    # Just above / just below the tie.
    assert rtb(np.nextafter(1.0 + half_ulp, 2.0), dtype) == one + 1
    assert rtb(np.nextafter(1.0 + half_ulp, 0.0), dtype) == one
    assert rtb(np.nextafter(1.0 + 3 * half_ulp, 0.0), dtype) == one + 1
    # The same with a negative sign.
    sign = 1 << (np.dtype(FORMATS[dtype][0]).itemsize * 8 - 1)
    assert rtb(-(1.0 + half_ulp), dtype) == sign | one
    assert rtb(-(1.0 + 3 * half_ulp), dtype) == sign | (one + 2)


@pytest.mark.parametrize(
    ("dtype", "one", "fraction_bits"),
    [("float16", 0x3C00, 10), ("bfloat16", 0x3F80, 7)],
)
def test_no_double_rounding_through_float32(dtype, one, fraction_bits):
    """Slightly above a 16-bit tie, by less than float32 can see: rounding first to float32 would
    land on the tie and then go to even; a single rounding goes up."""
    x = 1.0 + 2.0 ** -(fraction_bits + 1) + 2.0**-40
    assert float(np.float32(x)) == 1.0 + 2.0 ** -(fraction_bits + 1)  # float32 would hit the tie
    assert rtb(x, dtype) == one + 1
    assert rtb(-x, dtype) == (0x8000 | (one + 1))


@pytest.mark.parametrize(
    ("dtype", "neg_zero", "pos_inf", "neg_inf"),
    [
        ("float32", 0x80000000, 0x7F800000, 0xFF800000),
        ("float16", 0x8000, 0x7C00, 0xFC00),
        ("bfloat16", 0x8000, 0x7F80, 0xFF80),
    ],
)
def test_signed_zero_infinities_and_nan(dtype, neg_zero, pos_inf, neg_inf):
    assert rtb(0.0, dtype) == 0
    assert rtb(-0.0, dtype) == neg_zero
    assert rtb(math.inf, dtype) == pos_inf
    assert rtb(-math.inf, dtype) == neg_inf
    for nan in (math.nan, -math.nan, float(np.array([0x7FF0000000000001]).view(np.float64)[0])):
        assert is_nan_bits(rtb(nan, dtype), dtype)
    # A tiny value keeps its sign when it rounds to zero.
    assert rtb(1e-300, dtype) == 0
    assert rtb(-1e-300, dtype) == neg_zero


@pytest.mark.parametrize("dtype", DTYPES)
def test_overflow_threshold(dtype):
    p, _, emax = SPEC[dtype]
    largest = FORMATS[dtype][2]
    assert largest == (2 - 2.0 ** (1 - p)) * 2.0**emax
    threshold = largest + 2.0 ** (emax - p)  # largest + half an ulp: a tie, "even" is infinity
    largest_bits, inf_bits = encode(largest, dtype), encode(math.inf, dtype)
    assert rtb(largest, dtype) == largest_bits
    assert rtb(np.nextafter(threshold, 0.0), dtype) == largest_bits
    assert rtb(threshold, dtype) == inf_bits
    assert rtb(np.nextafter(threshold, math.inf), dtype) == inf_bits
    assert rtb(1e300, dtype) == inf_bits
    assert rtb(-threshold, dtype) == encode(-math.inf, dtype)
    assert rtb(-np.nextafter(threshold, 0.0), dtype) == encode(-largest, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_subnormals(dtype):
    p, emin, _ = SPEC[dtype]
    tiny = 2.0 ** (emin - p + 1)  # smallest subnormal
    assert rtb(tiny, dtype) == 1
    assert rtb(tiny / 2, dtype) == 0  # tie between 0 (even) and 1
    assert rtb(np.nextafter(tiny / 2, 1.0), dtype) == 1
    assert rtb(1.5 * tiny, dtype) == 2  # tie between 1 and 2 (even)
    assert rtb(2.5 * tiny, dtype) == 2  # tie between 2 (even) and 3
    assert rtb(np.nextafter(2.5 * tiny, 1.0), dtype) == 3
    assert rtb(-tiny, dtype) == encode(-tiny, dtype)
    # Largest subnormal and smallest normal.
    smallest_normal = 2.0**emin
    assert rtb(smallest_normal - tiny, dtype) == (1 << (p - 1)) - 1
    assert rtb(smallest_normal, dtype) == 1 << (p - 1)
    assert rtb(smallest_normal - tiny / 2, dtype) == 1 << (p - 1)  # tie: normal is even


def test_zero_dimensional_input():
    for dtype in (*DTYPES, "float64"):
        out = round_to_bits(np.float64(1.0), dtype)
        assert out.shape == ()
        assert out.dtype == FORMATS[dtype][0]
        assert bits_to_float64(out, dtype).shape == ()
        assert float(bits_to_float64(out, dtype)) == 1.0


def test_output_dtype_and_shape():
    x = np.arange(12, dtype=np.float64).reshape(3, 4) / 7
    for dtype in (*DTYPES, "float64"):
        out = round_to_bits(x, dtype)
        assert out.shape == (3, 4)
        assert out.dtype == FORMATS[dtype][0]


def test_unknown_dtype_raises():
    with pytest.raises(ValueError, match="int8"):
        round_to_bits(np.array([1.0]), "int8")
    with pytest.raises(ValueError, match="int8"):
        bits_to_float64(np.array([1], dtype=np.uint8), "int8")


# ---------------------------------------------------------------------------------------------
# round_to_bits: random cross-checks


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_matches_numpy_astype(dtype):
    x = random_float64s(dtype, 20000, seed=1)
    with np.errstate(over="ignore"):
        expected = x.astype(NP_DTYPE[dtype]).view(FORMATS[dtype][0])
    np.testing.assert_array_equal(round_to_bits(x, dtype), expected)


@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_exact_rational_oracle(dtype):
    x = random_float64s(dtype, 1500, seed=2)
    got = round_to_bits(x, dtype)
    wrong = [
        (v, int(g), oracle_bits(v, dtype))
        for v, g in zip(x.tolist(), got, strict=True)
        if int(g) != oracle_bits(v, dtype)
    ]
    assert not wrong, f"{len(wrong)} wrong, e.g. (value, got, want) = {wrong[:3]}"


def test_bfloat16_random_ties_are_not_double_rounded():
    """Sticky bits below float32's precision decide bfloat16 ties: a double-rounding
    implementation (like torch's float64 -> bfloat16 cast) gets these wrong."""
    rng = np.random.default_rng(3)
    steps = rng.integers(0, 128, size=500)
    exponents = rng.integers(-100, 100, size=500)
    tie = np.ldexp(1.0 + steps / 128 + 1 / 256, exponents)
    nudged = tie + np.ldexp(1.0, exponents - 40)  # invisible to float32
    got = round_to_bits(nudged, "bfloat16")
    expected = [oracle_bits(v, "bfloat16") for v in nudged.tolist()]
    np.testing.assert_array_equal(got, np.array(expected, dtype=np.uint16))
    # And they really are traps for a double rounding.
    double = (
        nudged.astype(np.float32).view(np.uint32)
        + 0x7FFF
        + ((nudged.astype(np.float32).view(np.uint32) >> 16) & 1)
    ) >> 16
    assert (double.astype(np.uint16) != got).sum() > 200


# ---------------------------------------------------------------------------------------------
# bits_to_float64


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_every_16_bit_pattern_round_trips(dtype):
    bits = np.arange(2**16, dtype=np.uint16)
    values = bits_to_float64(bits, dtype)
    assert values.dtype == np.float64
    back = round_to_bits(values, dtype)
    nan = np.isnan(values)
    np.testing.assert_array_equal(back[~nan], bits[~nan])
    assert np.isnan(bits_to_float64(back[nan], dtype)).all()
    # NaN exactly where the exponent is all ones and the fraction nonzero.
    exp_mask, frac_mask = (0x7C00, 0x03FF) if dtype == "float16" else (0x7F80, 0x007F)
    expected_nan = ((bits & exp_mask) == exp_mask) & ((bits & frac_mask) != 0)
    np.testing.assert_array_equal(nan, expected_nan)


def test_bfloat16_decoding_values():
    bits = np.array([0x3F80, 0xBF80, 0x4000, 0x7F7F, 0x0001, 0x8000, 0x7F80], dtype=np.uint16)
    expected = [1.0, -1.0, 2.0, FORMATS["bfloat16"][2], 2.0**-133, -0.0, math.inf]
    got = bits_to_float64(bits, "bfloat16")
    assert got.tolist() == expected
    assert math.copysign(1.0, got[5]) == -1.0


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_wide_patterns_round_trip(dtype):
    rng = np.random.default_rng(4)
    kind = FORMATS[dtype][0]
    bits = rng.integers(0, np.iinfo(kind).max, size=20000, dtype=kind, endpoint=True)
    values = bits_to_float64(bits, dtype)
    nan = np.isnan(values)
    np.testing.assert_array_equal(round_to_bits(values, dtype)[~nan], bits[~nan])
    np.testing.assert_array_equal(values[~nan], bits[~nan].view(np.dtype(dtype))[...])


# ---------------------------------------------------------------------------------------------
# ulp_distance


def _bits(values, dtype):
    return round_to_bits(np.asarray(values, dtype=np.float64), dtype)


@pytest.mark.parametrize("dtype", [*DTYPES, "float64"])
def test_ulp_distance_zero_and_neighbours(dtype):
    p, emin, _ = SPEC.get(dtype, (53, -1022, 1023))
    tiny = 2.0 ** (emin - p + 1)
    assert ulp_distance(_bits([0.0], dtype), _bits([-0.0], dtype), dtype).tolist() == [0]
    assert ulp_distance(_bits([1.5], dtype), _bits([1.5], dtype), dtype).tolist() == [0]
    # Neighbours, on either side of a binade edge and of zero.
    one_up = 1.0 + 2.0 ** (1 - p)
    one_down = 1.0 - 2.0**-p
    pairs = [
        (1.0, one_up),
        (1.0, one_down),
        (-1.0, -one_up),
        (0.0, tiny),
        (-0.0, tiny),
        (0.0, -tiny),
        (-0.0, -tiny),
        (2.0**emin, 2.0**emin - tiny),
    ]
    for a, b in pairs:
        d = ulp_distance(_bits([a], dtype), _bits([b], dtype), dtype)
        assert d.tolist() == [1], (dtype, a, b, d)
        assert ulp_distance(_bits([b], dtype), _bits([a], dtype), dtype).tolist() == [1]
    # Across zero: -tiny, (-0 == +0), +tiny.
    assert ulp_distance(_bits([-tiny], dtype), _bits([tiny], dtype), dtype).tolist() == [2]
    # Between 1 and 2 there are 2**(p-1) steps.
    assert ulp_distance(_bits([1.0], dtype), _bits([2.0], dtype), dtype).tolist() == [2 ** (p - 1)]


@pytest.mark.filterwarnings("ignore:invalid value encountered in cast:RuntimeWarning")
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_ulp_distance_counts_representable_values(dtype):
    """For every pair of finite 16-bit values of a random sample, the distance is the number of
    steps in the sorted list of all distinct finite values."""
    bits = np.arange(2**16, dtype=np.uint16)
    values = bits_to_float64(bits, dtype)
    finite = bits[np.isfinite(values) & ~((values == 0) & np.signbit(values))]
    ordered_values = np.sort(bits_to_float64(finite, dtype))
    rank = {v: i for i, v in enumerate(ordered_values.tolist())}
    rng = np.random.default_rng(5)
    a = rng.choice(finite, 3000)
    b = rng.choice(finite, 3000)
    expected = [
        abs(rank[x] - rank[y])
        for x, y in zip(
            bits_to_float64(a, dtype).tolist(), bits_to_float64(b, dtype).tolist(), strict=True
        )
    ]
    assert ulp_distance(a, b, dtype).tolist() == expected


def test_ulp_distance_is_elementwise_and_shaped():
    a = _bits([[1.0, 2.0], [-1.0, 0.0]], "float32")
    b = _bits([[1.0, 4.0], [1.0, -0.0]], "float32")
    d = ulp_distance(a, b, "float32")
    assert d.shape == (2, 2)
    assert d[0, 0] == 0 and d[1, 1] == 0
    assert d[0, 1] == 2**23
    assert d[1, 0] == 2 * 0x3F800000


def test_ulp_distance_float64_opposite_signs_does_not_overflow():
    four = int(np.array([4.0]).view(np.uint64)[0])
    d = ulp_distance(_bits([4.0], "float64"), _bits([-4.0], "float64"), "float64")
    assert int(d[0]) == 2 * four


# ---------------------------------------------------------------------------------------------
# compare_bits and Mismatch


def test_compare_bits_identical_including_nan_payloads():
    a = np.array([0x7FC00001, 0xFFC00000, 0x3F800000, 0x80000000], dtype=np.uint32)
    assert compare_bits(a, a.copy(), "float32", "x") is None
    h = np.array([[0x7E01, 0x3C00], [0xFE00, 0x0000]], dtype=np.uint16)
    assert compare_bits(h, h.copy(), "float16", "x") is None


def test_compare_bits_distinguishes_nan_payloads_and_zero_signs():
    a = np.array([0x7FC00001, 0x00000000], dtype=np.uint32)
    b = np.array([0x7FC00000, 0x00000000], dtype=np.uint32)
    m = compare_bits(a, b, "float32", "x")
    assert m is not None and m.mismatched == 1 and m.first_index == (0,)
    zeros = compare_bits(_bits([-0.0], "bfloat16"), _bits([0.0], "bfloat16"), "bfloat16", "z")
    assert zeros is not None and zeros.max_ulp == 0


def test_compare_bits_reports_count_first_index_and_max_ulp():
    desired = _bits(np.ones((3, 4)), "bfloat16")
    actual = desired.copy()
    actual[1, 2] += 3
    actual[2, 0] += 7
    actual[0, 3] += 1
    m = compare_bits(actual, desired, "bfloat16", "needle vs batch")
    assert isinstance(m, Mismatch)
    assert (m.mismatched, m.total) == (3, 12)
    assert m.first_index == (0, 3)
    assert m.max_ulp == 7
    assert m.actual == 1.0 + 2.0**-7 and m.desired == 1.0
    assert (m.actual_bits, m.desired_bits) == (0x3F81, 0x3F80)
    assert m.max_abs == 7 * 2.0**-7
    assert m.max_rel == pytest.approx(7 * 2.0**-7)
    assert m.dtype == "bfloat16" and m.bound is None


def test_compare_bits_zero_dimensional():
    a, b = _bits(1.0, "float32"), _bits(2.0, "float32")
    assert a.shape == ()
    assert compare_bits(a, a.copy(), "float32", "x") is None
    m = compare_bits(a, b, "float32", "x")
    assert m is not None
    assert (m.mismatched, m.total, m.first_index) == (1, 1, ())
    assert m.max_ulp == 2**23


def test_mismatch_message_reads_like_numpy_testing():
    desired = _bits([1.0, 2.0, 3.0, 4.0], "float32")
    actual = desired.copy()
    actual[2] += 2
    m = compare_bits(actual, desired, "float32", "second run (actual) vs first run (desired)")
    text = str(m)
    lines = text.splitlines()
    assert lines[0] == "second run (actual) vs first run (desired)"
    assert lines[1] == "Mismatched elements: 1 / 4 (25%)"
    assert "First mismatch at index (2,)" in lines[2]
    actual_value = float(bits_to_float64(actual[2:3], "float32")[0])
    assert f"actual {actual_value!r} (0x{int(actual[2]):08x})" in lines[2]
    assert "desired 3.0 (0x40400000)" in lines[2]
    assert re.fullmatch(r"Max absolute difference: [0-9.e+-]+", lines[3])
    assert float(lines[3].split(": ")[1]) == pytest.approx(actual_value - 3.0, rel=1e-5)
    assert float(lines[4].split(": ")[1]) == pytest.approx((actual_value - 3.0) / 3, rel=1e-5)
    assert lines[5] == "Max ULP difference (float32): 2"
    assert "Allowed error" not in text


def test_mismatch_message_hex_width_follows_dtype():
    m = compare_bits(_bits([1.5], "float16"), _bits([1.0], "float16"), "float16", "w")
    assert "(0x3e00) vs desired 1.0 (0x3c00)" in str(m)
    m = compare_bits(_bits([-0.0], "bfloat16"), _bits([0.0], "bfloat16"), "bfloat16", "w")
    assert "actual -0.0 (0x8000) vs desired 0.0 (0x0000)" in str(m)


# ---------------------------------------------------------------------------------------------
# compare_to_reference


def test_bitwise_mode_accepts_the_correct_rounding_only():
    ref = np.array([1.0 + 2.0**-9, 3.0, -0.5])
    exact = round_to_bits(ref, "bfloat16")
    assert compare_to_reference(exact, ref, None, "bfloat16", "out") is None
    off = exact.copy()
    off[0] += 1  # one ulp off: bitwise mode rejects it
    m = compare_to_reference(off, ref, None, "bfloat16", "out")
    assert m is not None and m.mismatched == 1 and m.first_index == (0,) and m.max_ulp == 1
    assert m.bound is None
    # Except the sign of an exact zero: it depends on the order of the additions, not the result.
    zero = compare_to_reference(_bits([-0.0], "float32"), np.array([0.0]), None, "float32", "z")
    assert zero is None
    tiny = compare_to_reference(_bits([2.0**-149], "float32"), np.zeros(1), None, "float32", "t")
    assert tiny is not None


def test_bounded_mode_inside_and_outside_the_bound():
    ref = np.array([1.0, 2.0, -4.0])
    tol = np.array([0.01, 0.1, 0.5])
    inside = _bits([1.0078125, 2.0625, -4.5], "bfloat16")
    assert compare_to_reference(inside, ref, tol, "bfloat16", "out") is None
    outside = _bits([1.0078125, 2.125, -4.5], "bfloat16")
    m = compare_to_reference(outside, ref, tol, "bfloat16", "out within the bound")
    assert m is not None
    assert (m.mismatched, m.total, m.first_index) == (1, 3, (1,))
    assert m.actual == 2.125 and m.desired == 2.0
    assert m.bound == 0.1
    assert m.max_abs == 0.125
    assert "Allowed error at first mismatch: 0.1" in str(m)


def test_bounded_mode_scalar_tolerance_broadcasts():
    ref = np.linspace(-1, 1, 7)
    got = _bits(ref + 1e-3, "float32")
    assert compare_to_reference(got, ref, 2e-3, "float32", "x") is None
    assert compare_to_reference(got, ref, 5e-4, "float32", "x").mismatched == 7


def test_bounded_mode_nan_and_infinities():
    tol = np.array([1.0, 1.0, 1.0])
    ref = np.array([np.nan, np.inf, -np.inf])
    good = _bits([np.nan, np.inf, -np.inf], "float16")
    assert compare_to_reference(good, ref, tol, "float16", "x") is None
    for bad in (
        [1.0, np.inf, -np.inf],
        [np.nan, -np.inf, -np.inf],
        [np.nan, np.inf, 65504.0],
        [np.nan, 65504.0, -np.inf],
    ):
        m = compare_to_reference(_bits(bad, "float16"), ref, tol, "float16", "x")
        assert m is not None and m.mismatched == 1, bad
    # A NaN result where the reference is finite is never within tolerance.
    m = compare_to_reference(_bits([np.nan], "float32"), np.array([1.0]), np.inf, "float32", "x")
    assert m is not None


@pytest.mark.parametrize("dtype", DTYPES)
def test_overflow_to_infinity_only_near_the_largest_value(dtype):
    largest = FORMATS[dtype][2]
    inf = _bits([np.inf], dtype)
    ninf = _bits([-np.inf], dtype)
    near = np.array([largest * (1 - 2.0**-12)])
    # The reference, plus its tolerance, reaches the largest finite value: infinity is allowed.
    tol = largest * 2.0**-11
    assert compare_to_reference(inf, near, tol, dtype, "x") is None
    assert compare_to_reference(ninf, -near, tol, dtype, "x") is None
    # ...but not the infinity of the other sign.
    assert compare_to_reference(ninf, near, tol, dtype, "x") is not None
    # Tolerance too small to reach the largest value: infinity is an error.
    assert compare_to_reference(inf, near, largest * 2.0**-14, dtype, "x") is not None
    # Far from the largest value, with a modest tolerance.
    assert compare_to_reference(inf, np.array([largest / 4]), largest / 8, dtype, "x") is not None


def test_compare_to_reference_zero_dimensional():
    ref = np.float64(1.0 + 2.0**-9)
    assert compare_to_reference(round_to_bits(ref, "bfloat16"), ref, None, "bfloat16", "x") is None
    assert (
        compare_to_reference(
            _bits(1.0, "float32"), np.float64(1.0), np.float64(0.0), "float32", "x"
        )
        is None
    )
    m = compare_to_reference(
        _bits(1.5, "float32"), np.float64(1.0), np.float64(0.25), "float32", "x"
    )
    assert m is not None and m.first_index == () and m.total == 1 and m.bound == 0.25


def test_bounded_mismatch_reports_reference_value_not_rounded():
    """The desired value in the message is the float64 reference; its bits are the rounding."""
    ref = np.array([1.0 + 2.0**-12])
    m = compare_to_reference(_bits([1.5], "bfloat16"), ref, np.array([0.0]), "bfloat16", "x")
    assert m is not None
    assert m.desired == 1.0 + 2.0**-12
    assert m.desired_bits == 0x3F80
