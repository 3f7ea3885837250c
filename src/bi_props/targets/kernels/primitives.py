"""Building blocks for kernels that are batch-invariant by construction.

A result is batch-invariant when every output element is computed by the same sequence of
correctly rounded operations whatever the batch around it. PyTorch's CPU loops put an element in
a vectorised body, a scalar tail or another thread's chunk depending on the total size, i.e. on the
batch; only operations whose result is fixed by IEEE-754 are immune to that. Hence the rules every
kernel in this package follows:

1. Upcast bf16/fp16 to float32 (exact); compute in float32 (float64 for float64 inputs, and inside
   ``exp``/``log``/``sqrt``); round to the output dtype once at the end with ``.to(dtype)``
   (round-to-nearest-even in the vector and the scalar path alike).
2. Elementwise work uses only correctly rounded operations: add, sub, mul, div, plus comparisons,
   selections (``torch.where``, ``torch.maximum``, ``clamp``) and integer/bitwise ops. Never fused
   ops that may contract to an FMA in one path only (``addcmul``, ``addcdiv``, ``add(alpha=)``,
   ``lerp``, ``baddbmm``) and never library transcendentals: ``exp``, ``log`` and ``sqrt`` are
   implemented here from the operations above (even ``torch.sqrt`` is not correctly rounded in
   the stock CPU build of torch 2.13: ~17% of random float32 inputs are off by one ulp).
3. Reductions are a fixed pairwise tree of elementwise adds (or maxima) whose shape depends only on
   the reduced length, never on the number of rows.
4. Matrix products are elementwise products followed by ``tree_sum`` over K, processed in row
   (and column) chunks sized by a memory budget: chunking cannot change an element, whose tree
   depends only on K.
5. No kernel calls an aten op that ``install()`` overrides (mm, matmul, sum, softmax, ...), nor
   ``@``, ``einsum``, ``Tensor.sum``/``mean``/``max``, ``norm`` or ``F.*``: that would recurse.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

CHUNK_BYTES = 4 * 2**20
"""Memory budget for one chunk of elementwise products (measured fastest here: cache-sized)."""

EXP_CHUNK = 2**18
"""Elements per chunk of ``exp``'s float64 pipeline (keeps its ~30 temporaries in cache)."""

_HALF = (torch.float16, torch.bfloat16)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype a kernel computes in: float32 for fp32/bf16/fp16, float64 for float64, int64 for
    integers and bool (exact), complex64/128 for complex."""
    if dtype == torch.float64:
        return torch.float64
    if dtype == torch.float32 or dtype in _HALF:
        return torch.float32
    if dtype.is_complex:
        return torch.complex128 if dtype == torch.complex128 else torch.complex64
    return torch.int64


def upcast(x: Tensor) -> Tensor:
    """``x`` in its compute dtype (exact: every bf16/fp16 value is a float32 value)."""
    return x.to(compute_dtype(x.dtype))


def _tree(x: Tensor, dim: int, op: Callable[..., Tensor]) -> Tensor:
    """Pairwise tree over ``dim`` as if padded with the identity to a power of two.

    Level one pairs element i with i + h (h = largest power of two below n); the 2h - n elements
    without a partner pass through unchanged, which is what pairing them with -0.0 (sum) or -inf
    (max) would give. Every later level halves a power of two. The tree is a function of n only.
    """
    n = x.shape[dim]
    if n == 1:
        return x.select(dim, 0).clone()
    h = 1 << ((n - 1).bit_length() - 1)
    shape = list(x.shape)
    shape[dim] = h
    head = torch.empty(shape, dtype=x.dtype, device=x.device)
    op(x.narrow(dim, 0, n - h), x.narrow(dim, h, n - h), out=head.narrow(dim, 0, n - h))
    if 2 * h > n:
        head.narrow(dim, n - h, 2 * h - n).copy_(x.narrow(dim, n - h, 2 * h - n))
    while h > 1:
        h //= 2
        head = op(head.narrow(dim, 0, h), head.narrow(dim, h, h))
    return head.squeeze(dim)


def tree_sum(x: Tensor, dim: int) -> Tensor:
    """Sum over ``dim`` (removed) by a fixed pairwise tree of elementwise adds.

    Each add is correctly rounded, so an output element depends only on its own inputs and the
    length of ``dim``, not on how many other rows are reduced alongside. Empty: +0.
    """
    dim = dim % x.dim()
    if x.shape[dim] == 0:
        shape = x.shape[:dim] + x.shape[dim + 1 :]
        return torch.zeros(shape, dtype=x.dtype, device=x.device)
    return _tree(x, dim, torch.add)


def tree_max(x: Tensor, dim: int) -> Tensor:
    """Maximum over ``dim`` (removed) by the same fixed tree, with ``torch.maximum``.

    ``maximum`` is exact; only the sign of a zero result may depend on the code path, so zeros are
    canonicalised to +0.0 (``m + 0.0`` changes nothing else). NaN propagates.
    """
    dim = dim % x.dim()
    if x.shape[dim] == 0:
        raise RuntimeError("tree_max(): cannot reduce over a zero-size dimension")
    m = _tree(x, dim, torch.maximum)
    if m.is_floating_point():
        m.add_(0.0)
    return m


def matmul_tree(a: Tensor, b: Tensor, chunk_bytes: int = CHUNK_BYTES) -> Tensor:
    """Batched product (B, M, K) x (B, K, N) -> (B, M, N) in the inputs' (common) dtype.

    Output element (i, j) is ``tree_sum_k(a[i, k] * b[k, j])``: correctly rounded products and a
    tree that depends only on K. Rows (and, for very wide K x N, columns) are processed in chunks
    sized by a memory budget; that changes which elements share a temporary tensor, never any
    element's operations.
    """
    batch, m, k = a.shape
    n = b.shape[2]
    out = torch.empty((batch, m, n), dtype=a.dtype, device=a.device)
    if k == 0 or out.numel() == 0:
        return out.zero_()
    a = a.contiguous()
    b = b.contiguous()
    size = a.element_size()
    cols = min(n, max(1, chunk_bytes // (k * size)))
    rows = max(1, chunk_bytes // (k * cols * size))
    if rows >= m and cols == n:  # whole matrices: several batch entries per chunk
        step = max(1, rows // m)
        for b0 in range(0, batch, step):
            prod = a[b0 : b0 + step, :, :, None] * b[b0 : b0 + step, None, :, :]
            out[b0 : b0 + step] = tree_sum(prod, 2)
        return out
    for bi in range(batch):
        for m0 in range(0, m, rows):
            for n0 in range(0, n, cols):
                prod = a[bi, m0 : m0 + rows, :, None] * b[bi, None, :, n0 : n0 + cols]
                out[bi, m0 : m0 + rows, n0 : n0 + cols] = tree_sum(prod, 1)
    return out


# --- exp, log and sqrt from correctly rounded operations (computed in float64) ------------------

_LN2_HI = 6.93147180369123816490e-01  # ln 2 with its low 32 bits zero: n * _LN2_HI is exact
_LN2_LO = 1.90821492927058770002e-10  # ln 2 - _LN2_HI
_INV_LN2 = 1.44269504088896338700e00
_ROUND_MAGIC = 6755399441055744.0  # 1.5 * 2**52: (t + M) - M rounds t to nearest-even integer
_EXP_CLAMP = 1000.0  # beyond it float64 exp is 0 or inf anyway; keeps the exponents in range
_SQRT2 = 1.4142135623730951
_EXP_FIELD = 0x7FF0000000000000
_MANTISSA = 0x000FFFFFFFFFFFFF
_ONE_BITS = 0x3FF0000000000000
_MIN_NORMAL = 2.2250738585072014e-308


def _pow2(n: Tensor) -> Tensor:
    """2**n (float64) for int64 ``n`` in the normal range, by writing the exponent field."""
    return ((n + 1023) << 52).view(torch.float64)


def _exp64(x: Tensor, degree: int) -> Tensor:
    """exp of a float64 tensor: exp(x) = 2**n * exp(r), |r| <= ln2/2, r by Cody-Waite."""
    x = x.clamp(-_EXP_CLAMP, _EXP_CLAMP)  # a selection: exact; NaN stays NaN
    n = x * _INV_LN2
    n.add_(_ROUND_MAGIC).sub_(_ROUND_MAGIC)
    r = x - n * _LN2_HI
    r.sub_(n * _LN2_LO)
    # Taylor polynomial by Horner; |r|**(d+1)/(d+1)! bounds the truncation.
    p = torch.full_like(r, 1.0 / _factorial(degree))
    for i in range(degree - 1, -1, -1):
        p.mul_(r).add_(1.0 / _factorial(i))
    ni = n.to(torch.int64)  # |n| <= 1443
    n1 = ni >> 1
    # p * 2**n1 is exact (normal range); the final multiply rounds once, to a subnormal if due.
    return p.mul_(_pow2(n1)).mul_(_pow2(ni - n1))


def _factorial(i: int) -> float:
    out = 1.0
    for j in range(2, i + 1):
        out *= j
    return out


def exp(x: Tensor) -> Tensor:
    """e**x for float32 or float64 ``x``, same dtype out, computed in float64 and rounded once.

    Float32: degree-11 polynomial (truncation < 1e-14 relative), so the result is the correctly
    rounded float32 except within ~1e-14 of a rounding boundary, and always within 1 ulp.
    Float64: degree 13 (truncation < 1e-17), a few float64 ulps. exp(0) = 1 exactly, exp(-inf) = 0,
    exp(inf) = inf, NaN -> NaN.
    """
    if x.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"exp(): expected float32 or float64, got {x.dtype}")
    degree = 13 if x.dtype == torch.float64 else 11
    flat = x.reshape(-1)
    out = torch.empty(flat.shape, dtype=x.dtype, device=x.device)
    for i in range(0, flat.numel(), EXP_CHUNK):  # elementwise: chunking changes no value
        out[i : i + EXP_CHUNK] = _exp64(flat[i : i + EXP_CHUNK].to(torch.float64), degree)
    return out.reshape(x.shape)


def _log64(x: Tensor, terms: int) -> Tensor:
    """log of a float64 tensor: x = 2**e * m, m in [sqrt(1/2), sqrt(2)), log m = 2 atanh(s)."""
    tiny = x < _MIN_NORMAL  # subnormals (and <= 0, fixed up below): scale by 2**54 first
    xs = torch.where(tiny, x * 2.0**54, x)
    bits = xs.view(torch.int64)
    e = ((bits & _EXP_FIELD) >> 52) - 1023 - tiny.to(torch.int64) * 54
    m = ((bits & _MANTISSA) | _ONE_BITS).view(torch.float64)  # [1, 2)
    big = m > _SQRT2
    m = torch.where(big, m * 0.5, m)  # exact
    e = e + big.to(torch.int64)
    f = m - 1.0  # exact (Sterbenz)
    s = f / (m + 1.0)
    z = s * s
    # 2 atanh(s) = 2s (1 + z/3 + z**2/5 + ...); s**2 <= 0.0295
    series = torch.full_like(z, 1.0 / (2 * terms + 1))
    for k in range(terms - 1, -1, -1):
        series.mul_(z).add_(1.0 / (2 * k + 1))
    log_m = (s + s) * series
    ef = e.to(torch.float64)
    y = ef * _LN2_HI + (ef * _LN2_LO + log_m)
    y = torch.where(x == float("inf"), x, y)
    y = torch.where(x == 0, torch.full_like(y, float("-inf")), y)
    return torch.where((x < 0) | torch.isnan(x), torch.full_like(y, float("nan")), y)


def log(x: Tensor) -> Tensor:
    """Natural log for float32 or float64 ``x``, same dtype out, computed in float64, rounded once.

    Float32: 8 series terms (truncation < 1e-14); float64: 13 terms (< 1e-19), a few ulps.
    log(1) = 0 exactly, log(+-0) = -inf, log(x < 0) = NaN, log(inf) = inf, NaN -> NaN.
    """
    if x.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"log(): expected float32 or float64, got {x.dtype}")
    terms = 13 if x.dtype == torch.float64 else 8
    return _log64(x.to(torch.float64), terms).to(x.dtype)


def sqrt(x: Tensor) -> Tensor:
    """Square root for float32 or float64 ``x``, same dtype out, by Newton's method in float64.

    Each step y = (y + x / y) * 0.5 is made of correctly rounded operations; six steps from a
    bit-level first guess leave float64 error ~1 ulp, which rounds to the correctly rounded
    float32 (sqrt of a 24-bit float is never within 2**-50 relative of a float32 midpoint).
    sqrt(+-0) = +-0, sqrt(inf) = inf, negative or NaN -> NaN.
    """
    if x.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"sqrt(): expected float32 or float64, got {x.dtype}")
    d = x.to(torch.float64)
    tiny = d < 2.0**-1000  # keep the first guess in the normal range
    ds = torch.where(tiny, d * 2.0**200, d)
    bits = ds.view(torch.int64)
    y = (((bits - _ONE_BITS) >> 1) + _ONE_BITS).view(torch.float64)  # within ~6% of sqrt
    for _ in range(6):
        y = (y + ds / y) * 0.5
    y = torch.where(tiny, y * 2.0**-100, y)
    y = torch.where((d == 0) | (d == float("inf")), d, y)
    y = torch.where((d < 0) | torch.isnan(d), torch.full_like(y, float("nan")), y)
    return y.to(x.dtype)
