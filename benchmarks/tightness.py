"""How tight is the reference bound, and what does it catch? (``python benchmarks/tightness.py
[OP ...]``)

Per op (mm, sum, rms_norm, softmax, fused_moe, attention, paged_decode_attention,
mixed_attention: a prefill chunk of the last 8 tokens over n keys), output dtype and
size n (K for mm, the row length for sum, rms_norm and softmax, both GEMMs' K for fused_moe, the
keys of a query row for the attention ops), over a few seeds of the catalogue's own ``general``
inputs, for a kernel declaring float32 internals:

- honest: float32 kernels in four summation orders (sequential, reversed, pairwise, blocks of 16),
  products and exp rounded to float32, the result rounded once to the output dtype; the attention
  ops in four forms (naive softmax, FlashAttention's online softmax over blocks of 16 keys and of
  one key, four split-KV splits normalised and combined), each summing forward and reversed, and
  online-1 visiting each row's keys in increasing score order (a rescale at every key: the order
  the bound's rescale terms are counted for). Ten seeds per row (SEEDS; fused_moe and the
  attention ops three: SLOW_SEEDS).
  ``ratio`` is the median over elements of allowed slack / the worst honest form's error (the
  error floored at the half ulp the final rounding costs anyway); ``use`` is the largest fraction
  of its slack any honest element used (above 1 would be a false alarm).
- tf32: the same kernel with the inputs' mantissas cut to 10 bits (float32 only: bf16 and fp16
  inputs already fit); ``b16``: an intermediate (mm and sum: split-K partials of 64 terms; softmax:
  the exps; rms_norm: x / rms before the weight; fused_moe: the activation; attention: P before
  P @ V) rounded to bf16 for a float32 output, to the output dtype for a 16-bit one; ``exp``: an
  exp off by a relative 1e-5 (about 84 ulps; softmax, fused_moe, attention). Shown as the share of
  output elements outside the bound ("yes" when every seed has one: the reference property fails
  on one element). With n <= 64 a 16-bit split-K kernel has one block, whose rounded partial is
  the result: nothing to catch. ``allowed`` is the median slack in the ulps the tool reports (the
  spacing of the output dtype at the value: ``ulp_size``). Elements whose correctly rounded value
  overflows the dtype are left out (the overflow rule judges them).

Prints a table (docs/properties.md's "Bounds and their tightness" is its output). About four
minutes on 2 cores, most of it attention at n = 4096.
"""

from __future__ import annotations

import functools
import math
import sys
import time
from collections.abc import Callable

import numpy as np

from bi_props.catalogue import OPS
from bi_props.execution import materialize as M
from bi_props.model.case import Case
from bi_props.model.compare import bits_to_float64, round_to_bits, ulp_size, unit_roundoff

SIZES = (16, 256, 4096)
DTYPES = ("float32", "bfloat16", "float16")
SEEDS = tuple(range(10))
"""Seeds per op, dtype and n. The ratio is a median over elements (16 rows of a row op): with 3
seeds the sum's ratio at n = 4096 read 13.1x, 16.1x or 17.8x per seed (8.7-23.5x over 30 seeds,
median 14.9x), so a 3-seed table put a bound on either side of 16x by chance (2026-12-05)."""
SLOW_SEEDS = (0, 1, 2)
"""fused_moe and the attention ops (a minute or more per seed at their largest n; each seed
gives 512 elements)."""
BLOCK = 64


def rnd(x: np.ndarray, dtype: str) -> np.ndarray:
    """Round float64 values once to ``dtype`` (and back to float64)."""
    return bits_to_float64(round_to_bits(np.asarray(x, dtype=np.float64), dtype), dtype)


def sequential(t: np.ndarray) -> np.ndarray:
    acc = np.zeros(t.shape[:-1], np.float32)
    for i in range(t.shape[-1]):
        acc = acc + t[..., i]
    return acc


def reversed_order(t: np.ndarray) -> np.ndarray:
    return sequential(t[..., ::-1])


def pairwise(t: np.ndarray) -> np.ndarray:
    p = np.moveaxis(t, -1, 0)
    if p.shape[0] == 0:
        return np.zeros(p.shape[1:], np.float32)
    while p.shape[0] > 1:
        half = p.shape[0] // 2
        paired = p[:half] + p[half : 2 * half]
        p = np.concatenate([paired, p[2 * half :]]) if p.shape[0] % 2 else paired
    return p[0]


def blocked(t: np.ndarray, block: int = 16, partial: str = "float32") -> np.ndarray:
    """Blocks summed sequentially, each partial rounded to ``partial``, then summed in order."""
    pad = (-t.shape[-1]) % block
    padded = np.concatenate([t, np.zeros((*t.shape[:-1], pad), np.float32)], -1)
    parts = sequential(padded.reshape(*t.shape[:-1], -1, block))
    parts = rnd(parts, partial).astype(np.float32)
    return sequential(parts)


ORDERS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "sequential": sequential,
    "reversed": reversed_order,
    "pairwise": pairwise,
    "blocked": blocked,
}


def tf32(x: np.ndarray) -> np.ndarray:
    bits = x.astype(np.float32).view(np.int32) & np.int32(~((1 << 13) - 1))
    return bits.view(np.float32).astype(np.float64)


def f32(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float64).astype(np.float32)


# Each kernel: (inputs as float64, summer, narrow dtype or None) -> float64 result before the
# final rounding. ``narrow`` rounds the op's intermediate to that dtype.


def mm_kernel(x, summer, narrow):
    a, b = x
    return _chain(f32(a[:, None, :] * b.T[None, :, :]), summer, narrow)


def _chain(terms, summer, narrow):
    """A product's or reduction's terms summed over the last axis: by ``summer``, or in split-K
    blocks whose partials are rounded to ``narrow``."""
    if narrow:
        return blocked(terms, BLOCK, narrow).astype(np.float64)
    return summer(terms).astype(np.float64)


def bmm_kernel(x, summer, narrow):
    a, b = x
    terms = f32(a[:, :, None, :] * np.swapaxes(b, 1, 2)[:, None, :, :])
    return _chain(terms, summer, narrow)


def addmm_kernel(x, summer, narrow):
    """beta = alpha = 1: the bias added to the float32 product, one more rounding."""
    bias, a, b = x
    return f32(bias + _chain(f32(a[:, None, :] * b.T[None, :, :]), summer, narrow)).astype(
        np.float64
    )


def linear_kernel(x, summer, narrow):
    v, w, bias = x
    return f32(bias + _chain(f32(v[:, None, :] * w[None, :, :]), summer, narrow)).astype(np.float64)


def mean_kernel(x, summer, narrow):
    return f32(sum_kernel(x, summer, narrow) / x[0].shape[-1]).astype(np.float64)


def sum_kernel(x, summer, narrow):
    return _chain(f32(x[0]), summer, narrow)


def rms_norm_kernel(x, summer, narrow, eps=2.0**-23):
    v, w = x
    h = v.shape[-1]
    total = summer(f32(v * v)).astype(np.float64)
    ms = f32(total / h)
    r = f32(1.0 / np.sqrt(f32(ms + eps)))[:, None]
    normed = f32(v * r)
    if narrow:
        normed = rnd(normed, narrow)
    return f32(normed * w).astype(np.float64)


def _shifted_exps(v, narrow, exp=None):
    """(x - max, exp(x - max)) in float32, the exps optionally rounded to ``narrow``."""
    shifted = f32(v - v.max(-1, keepdims=True))
    e = (exp or exact_exp)(shifted)
    return shifted, f32(rnd(e, narrow)) if narrow else e


def softmax_kernel(x, summer, narrow, exp=None):
    _, e = _shifted_exps(x[0], narrow, exp)
    s = summer(e).astype(np.float64)[:, None]
    return f32(e / s).astype(np.float64)


def sloppy_exp(x: np.ndarray) -> np.ndarray:
    """exp off by a relative 1e-5 (about 84 float32 ulps), its sign varying with x."""
    e = np.exp(x.astype(np.float64))
    with np.errstate(invalid="ignore"):
        return f32(e * (1 + 1e-5 * np.sign(np.sin(x.astype(np.float64) * 12345.678) + 0.5)))


def exact_exp(x: np.ndarray) -> np.ndarray:
    return f32(np.exp(x.astype(np.float64)))


def log_softmax_kernel(x, summer, narrow, exp=None):
    shifted, e = _shifted_exps(x[0], narrow, exp)
    lse = f32(np.log(summer(e).astype(np.float64)))[:, None]
    return f32(shifted - lse).astype(np.float64)


def silu_float32(a, narrow=None, exp=None):
    """a / (1 + exp(-a)), each step rounded to float32 (the exp optionally to ``narrow``)."""
    with np.errstate(over="ignore"):
        e = (exp or exact_exp)(f32(-a))
    if narrow:
        e = f32(rnd(e, narrow))
    return f32(a / f32(1.0 + e.astype(np.float64)))


def silu_kernel(x, summer, narrow, exp=None):
    return silu_float32(f32(x[0]), narrow, exp).astype(np.float64)


def silu_and_mul_kernel(x, summer, narrow, exp=None):
    h = x[0].shape[-1] // 2
    a, b = f32(x[0][:, :h]), f32(x[0][:, h:])
    return f32(silu_float32(a, narrow, exp) * b).astype(np.float64)


_ERF = np.vectorize(math.erf, otypes=[np.float64])


def gelu_and_mul_kernel(x, summer, narrow):
    """Exact-erf gelu(a) * b in float32: a / sqrt 2, erf (correctly rounded), 1 + erf, the
    half a product, times (1 + erf), times b; the erf optionally rounded to ``narrow``."""
    h = x[0].shape[-1] // 2
    a, b = f32(x[0][:, :h]), f32(x[0][:, h:])
    erf = f32(_ERF(f32(a * np.float32(1 / math.sqrt(2))).astype(np.float64)))
    if narrow:
        erf = f32(rnd(erf, narrow))
    gelu = f32(f32(0.5 * a) * f32(1.0 + erf.astype(np.float64)))
    return f32(gelu * b).astype(np.float64)


def layer_norm_kernel(x, summer, narrow):
    """Two-pass layer norm in float32: the mean, d = x - mean (optionally rounded to
    ``narrow``), the biased variance, rstd = 1 / sqrt(var + eps), d rstd w + b."""
    v, w, bias = x
    h = v.shape[-1]
    mean = f32(summer(f32(v)).astype(np.float64) / h)[:, None]
    d = f32(v - mean)
    if narrow:
        d = f32(rnd(d, narrow))
    var = f32(summer(f32(d.astype(np.float64) ** 2)).astype(np.float64) / h)
    rstd = f32(1.0 / np.sqrt(f32(var + 1e-5)))[:, None]
    return f32(f32(f32(d * rstd) * w) + bias).astype(np.float64)


def add_rms_norm_kernel(x, summer, narrow, eps=2.0**-23):
    """rms_norm of the float32 sum x + residual (the op's first output), not rounded to the
    output dtype first (the reference's form rounds it; the bound admits both)."""
    v, residual, w = x
    return rms_norm_kernel([f32(v + residual).astype(np.float64), w], summer, narrow, eps)


def rotary_kernel(x, summer, narrow):
    """vLLM's neox rotary embedding of the query in float32 (head_size = rot_dim = n): each
    rotated element two products (optionally rounded to ``narrow``) and one add."""
    positions, query, _, cache = x
    n = cache.shape[1]
    half = n // 2
    picked = f32(cache[positions.astype(np.int64)])
    c, s = picked[:, None, :half], picked[:, None, half:]
    h = f32(query).reshape(query.shape[0], -1, n)
    x1, x2 = h[..., :half], h[..., half:]

    def product(a, b):
        p = f32(a * b)
        return f32(rnd(p, narrow)) if narrow else p

    first = f32(product(x1, c) - product(x2, s))
    second = f32(product(x2, c) + product(x1, s))
    return np.concatenate([first, second], -1).reshape(query.shape).astype(np.float64)


ATTENTION_ROWS = 8
"""The attention benchmark computes the last this many query rows (they see n - 7 .. n keys)."""


def _scores(q, k, scale, visible, summer):
    """(H, R, J) float32 scores: each dot product summed by ``summer``, then scaled."""
    terms = f32(np.einsum("rhd,jhd->hrjd", q, k))
    s = f32(summer(terms).astype(np.float64) * scale)
    return np.where(visible[None], s, np.float32(-np.inf))


def _pv(weights, v, summer):
    """(R, H, D): sum_j weights (H, R, J) * v (J, H, D), the products rounded, by ``summer``."""
    terms = f32(np.einsum("hrj,jhd->rhdj", weights, v))
    return summer(terms).astype(np.float32)


def attention_rows(q, k, v, scale, visible, variant, summer, narrow, exp):
    """Causal/decode attention in float32 for query rows q (R, H, D) over keys k, v (J, H, D):
    ``variant`` naive (max, exp, sum, divide, P @ V), online-<B> (FlashAttention's running max
    over blocks of B keys, the accumulator rescaled) or split-<S> (S contiguous key splits, each
    normalised, then combined by their rescaled sums); ``narrow`` rounds P to that dtype before
    P @ V; ``exp`` computes the exps."""
    s = _scores(q, k, scale, visible, summer)
    if variant == "naive":
        m = s.max(-1, keepdims=True)
        e = exp(f32(s - m))
        p = f32(e / summer(e)[..., None])
        if narrow:
            p = f32(rnd(p, narrow))
        return _pv(p, v, summer).astype(np.float64)
    kind, _, size = variant.partition("-")
    size = int(size)
    keys = s.shape[-1]
    if kind == "online":
        bounds = [(b, min(b + size, keys)) for b in range(0, keys, size)]
    else:
        step = -(-keys // size)
        bounds = [(b, min(b + step, keys)) for b in range(0, keys, step)]
    h, r = s.shape[0], s.shape[1]
    m = np.full((h, r, 1), -np.inf, np.float32)
    norm = np.zeros((h, r, 1), np.float32)
    acc = np.zeros((r, h, v.shape[-1]), np.float32)
    parts = []
    for lo, hi in bounds:
        sb = s[..., lo:hi]
        mb = sb.max(-1, keepdims=True)
        if kind == "online":
            mb = np.maximum(m, mb)
        safe = np.where(np.isfinite(mb), mb, np.float32(0))
        e = np.where(np.isfinite(sb), exp(f32(sb - safe)), np.float32(0))
        if narrow:
            e = f32(rnd(e, narrow))
        pv = _pv(e, v[lo:hi], summer)
        if kind == "online":
            alpha = np.where(np.isfinite(m), exp(f32(m - safe)), np.float32(0))
            norm = f32(f32(norm * alpha) + summer(e)[..., None])
            acc = f32(f32(acc * np.moveaxis(alpha, 0, 1)) + pv)
            m = mb
        else:
            parts.append((mb, summer(e)[..., None], pv))
    if kind == "online":
        return f32(acc / np.moveaxis(norm, 0, 1)).astype(np.float64)
    top = np.max([mb for mb, _, _ in parts], axis=0)
    out = np.zeros_like(acc)
    total = np.zeros_like(norm)
    for mb, lb, pv in parts:  # each split normalised, then re-weighted
        w = np.where(np.isfinite(mb), exp(f32(mb - top)), np.float32(0))
        weight = f32(w * lb)
        outb = f32(pv / np.maximum(np.moveaxis(lb, 0, 1), np.float32(1e-38)))
        out = f32(out + f32(outb * np.moveaxis(weight, 0, 1)))
        total = f32(total + weight)
    return f32(out / np.moveaxis(total, 0, 1)).astype(np.float64)


def attention_rows_by_score(q, k, v, scale, visible, summer, narrow, exp):
    """online-1 with each query row's keys visited in increasing score order (the same keys and
    values, so the same exact result): every key raises the running max, so the normaliser and
    the accumulator are rescaled, and rounded, at every key. On random scores an online softmax
    rescales about ln n times; this is the order the bound's rescale terms are counted for
    (data whose scores grow with position, as recent tokens' often do)."""
    s = _scores(q, k, scale, visible, summer)
    out = np.zeros((q.shape[0], q.shape[1], v.shape[-1]))
    for h in range(q.shape[1]):
        for r in range(q.shape[0]):
            order = np.argsort(s[h, r], kind="stable")
            one = (slice(r, r + 1), slice(h, h + 1))
            out[one] = attention_rows(
                q[one],
                k[order][:, one[1]],
                v[order][:, one[1]],
                scale,
                visible[one[0]][:, order],
                "online-1",
                summer,
                narrow,
                exp,
            )
    return out


ATTENTION_VARIANTS = ("naive", "online-16", "online-1", "split-4")
ATTENTION_OPS = ("attention", "paged_decode_attention", "mixed_attention")


def _attention_inputs(op: str, x, case: Case):
    """(q rows, k, v, scale, visible, row selection of the reference) for the benchmark."""
    import math

    if op == "mixed_attention":  # a prefill chunk of the last rows over all n keys
        q, k, v = x
        n, queries, heads, kv_heads, head_dim = case.shape
        rows = slice(0, queries)  # the reference holds the query rows only
        index = np.arange(n - queries, n)
        visible = index[:, None] >= np.arange(n)[None, :]  # aligned to the end
        q_rows = q[n - queries :]
    elif op == "attention":
        q, k, v = x
        n, heads, kv_heads, head_dim = case.shape
        rows = slice(max(n - ATTENTION_ROWS, 0), n)
        index = np.arange(n)[rows]
        visible = index[:, None] >= np.arange(n)[None, :]
        q_rows = q[rows]
    else:
        q, k, v = x
        n, heads, kv_heads, head_dim, _ = case.shape
        rows = slice(0, 1)
        visible = np.ones((1, n), dtype=bool)
        q_rows = q[n - 1 : n]
    group = heads // kv_heads
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    return q_rows, k, v, 1.0 / math.sqrt(head_dim), visible, rows


def measure_attention(op: str, dtype: str, n: int) -> dict[str, float | str]:
    ratios, uses, caught_tf32, caught_b16, caught_exp, allowed = [], [], [], [], [], []
    narrow = "bfloat16" if dtype == "float32" else dtype
    shape = {
        "attention": (n, 2, 1, 32),
        "mixed_attention": (n, min(n, ATTENTION_ROWS), 2, 1, 32),
    }.get(op, (n, 2, 1, 32, 16))
    options = {"placement": 0} if op == "paged_decode_attention" else {}
    for seed in SLOW_SEEDS:
        case = Case(
            op, OPS[op].entries[0], dtype, shape, ("contiguous",) * 3, "general", seed, options
        )
        x = [M.to_float64(t) for t in M.operands(case, M.needle(case), "cpu")]
        (ref,) = OPS[op].references(x, case, [n], "float32")
        q, k, v, scale, visible, rows = _attention_inputs(op, x, case)
        value = ref.value[rows]
        tol = np.broadcast_to(ref.tolerance, ref.value.shape)[rows]

        def run(
            variant,
            summer=sequential,
            narrow=None,
            exp=exact_exp,
            inputs=(q, k, v),
            scale=scale,
            visible=visible,
        ):
            out = attention_rows(*inputs, scale, visible, variant, summer, narrow, exp)
            return rnd(out, dtype)

        honest = [
            run(variant, summer)
            for variant in ATTENTION_VARIANTS
            for summer in (sequential, reversed_order)
        ]
        by_score = attention_rows_by_score(q, k, v, scale, visible, sequential, None, exact_exp)
        honest.append(rnd(by_score, dtype))
        worst = np.max([np.abs(h - value) for h in honest], axis=0)
        floor = unit_roundoff(dtype) * np.abs(value)
        allowed.append(np.ravel(tol / ulp_size(value, dtype)))
        ratios.append(np.median(tol / np.maximum(worst, floor)))
        uses.append(float(np.max(worst / tol)))
        if dtype == "float32":
            bad = run("naive", inputs=tuple(tf32(t) for t in (q, k, v)))
            caught_tf32.append(np.mean(np.abs(bad - value) > tol))
        caught_b16.append(np.mean(np.abs(run("naive", narrow=narrow) - value) > tol))
        caught_exp.append(np.mean(np.abs(run("naive", exp=sloppy_exp) - value) > tol))
    return _row(allowed, ratios, uses, caught_tf32, caught_b16, caught_exp, False)


MOE_SIZES = (16, 256, 1024)
"""fused_moe's n is both GEMMs' K (hidden = intermediate = n): 4096 would need 2 GB of terms."""


def _gemm(x, w, summer, narrow=None):
    """x (T, K) @ w (N, K).T in float32, products rounded, summed by ``summer``."""
    terms = f32(x[:, None, :] * w[None, :, :])
    if narrow:
        return blocked(terms, BLOCK, narrow).astype(np.float32)
    return summer(terms).astype(np.float32)


def fused_moe_kernel(x, summer, narrow, exp=None):
    """vLLM's fused_moe in float32: topk by logit, softmax over the selected, per expert
    w2 silu_and_mul(w1 x), the weighted sum; ``narrow`` rounds the activation to that dtype (the
    intermediate cache of a 16-bit kernel); ``exp`` computes the exps."""
    exp = exp or exact_exp
    hidden, w1, w2, gating = (f32(t) for t in x)
    topk = 2
    ids = np.argsort(-gating.astype(np.float64), axis=-1, kind="stable")[:, :topk]
    selected = np.take_along_axis(gating, ids, axis=-1)
    e = exp(f32(selected - selected.max(-1, keepdims=True)))
    p = f32(e / summer(e)[:, None])
    inter = w2.shape[-1]
    out = np.zeros(hidden.shape, np.float32)
    for slot in range(topk):
        y = np.zeros(hidden.shape, np.float32)
        for expert in np.unique(ids[:, slot]):
            rows = ids[:, slot] == expert
            h = _gemm(hidden[rows], w1[expert], summer)
            g, v = h[:, :inter], h[:, inter:]
            act = f32(f32(g / f32(1 + exp(f32(-g)))) * v)
            if narrow:
                act = f32(rnd(act, narrow))
            y[rows] = _gemm(act, w2[expert], summer)
        out = f32(out + f32(p[:, slot : slot + 1] * y))
    return out.astype(np.float64)


OPS_UNDER_TEST = {
    "mm": (mm_kernel, lambda n: (8, n, 16), {}),
    "matmul": (mm_kernel, lambda n: (8, n, 16), {"form": "2d"}),
    "bmm": (bmm_kernel, lambda n: (2, 8, n, 16), {}),
    "addmm": (addmm_kernel, lambda n: (8, n, 16), {"alpha": 1, "beta": 1, "bias": "vector"}),
    "linear": (linear_kernel, lambda n: (8, n, 16), {"bias": True, "form": "2d"}),
    "sum": (sum_kernel, lambda n: (16, n), {"dim": -1}),
    "mean": (mean_kernel, lambda n: (16, n), {"dim": -1, "dtype": None, "keepdim": False}),
    "rms_norm": (rms_norm_kernel, lambda n: (16, n), {}),
    "softmax": (softmax_kernel, lambda n: (16, n), {"dim": -1}),
    "log_softmax": (log_softmax_kernel, lambda n: (16, n), {"dim": -1}),
    "silu": (silu_kernel, lambda n: (16, n), {}),
    "silu_and_mul": (silu_and_mul_kernel, lambda n: (16, n), {}),
    "gelu_and_mul": (gelu_and_mul_kernel, lambda n: (16, n), {"approximate": "none"}),
    "layer_norm": (layer_norm_kernel, lambda n: (16, n), {"affine": True, "eps": 1e-5}),
    "rotary_embedding": (rotary_kernel, lambda n: (16, 2, 1, n, n, 32), {"is_neox": True}),
    "add_rms_norm": (add_rms_norm_kernel, lambda n: (16, n), {}),
    "fused_add_rms_norm": (
        functools.partial(add_rms_norm_kernel, eps=1e-6),
        lambda n: (16, n),
        {"eps": 1e-6},
    ),
    "fused_moe": (fused_moe_kernel, lambda n: (4, n, n, 4, 2), {"renormalize": True}),
}


EXP_OPS = ("softmax", "log_softmax", "silu", "silu_and_mul", "fused_moe")  # take an ``exp``
ONE_CHAIN = ("mm", "matmul", "bmm", "sum", "mean")  # a split-K of one block is the result


def measure(op: str, dtype: str, n: int) -> dict[str, float | str]:
    if op in ATTENTION_OPS:
        return measure_attention(op, dtype, n)
    kernel, shape_of, options = OPS_UNDER_TEST[op]
    ratios, uses, caught_tf32, caught_b16, caught_exp, allowed = [], [], [], [], [], []
    narrow = "bfloat16" if dtype == "float32" else dtype
    for seed in SLOW_SEEDS if op == "fused_moe" else SEEDS:
        probe = Case(op, "", dtype, shape_of(n), (), "general", seed, options)
        layouts = ("contiguous",) * len(OPS[op].operands(probe))
        case = Case(op, OPS[op].entries[0], dtype, shape_of(n), layouts, "general", seed, options)
        x = [M.to_float64(t) for t in M.operands(case, M.needle(case), "cpu")]
        ref = OPS[op].references(x, case, [case.shape[0]], "float32")[0]  # y of (y, residual)
        value, tol = ref.value, np.broadcast_to(ref.tolerance, ref.value.shape)
        # elements whose correctly rounded value overflows the dtype are judged by the overflow
        # rule (an infinity of the right sign passes), not by a distance: left out here
        finite = np.isfinite(rnd(value, dtype))
        value, tol = np.where(finite, value, 0.0), np.where(finite, tol, 1.0)

        def keep(result, finite=finite):
            return np.where(finite, rnd(result, dtype), 0.0)

        worst = np.max(
            [np.abs(keep(kernel(x, order, None)) - value) for order in ORDERS.values()],
            axis=0,
        )
        floor = unit_roundoff(dtype) * np.abs(value)
        allowed.append((tol / ulp_size(value, dtype))[finite])
        with np.errstate(divide="ignore", invalid="ignore"):  # exact zeros: left out below
            ratios.append(np.median((tol / np.maximum(worst, floor))[finite]))
        uses.append(float(np.max((worst / tol)[finite])))

        def caught(bad, finite=finite, value=value, tol=tol):
            return np.mean((np.abs(bad - value) > tol)[finite])

        if dtype == "float32":
            caught_tf32.append(caught(keep(kernel([tf32(t) for t in x], sequential, None))))
        caught_b16.append(caught(keep(kernel(x, sequential, narrow))))
        if op in EXP_OPS:
            caught_exp.append(caught(keep(kernel(x, sequential, None, sloppy_exp))))
    one_block = op in ONE_CHAIN and n <= BLOCK and dtype != "float32"
    return _row(allowed, ratios, uses, caught_tf32, caught_b16, caught_exp, one_block)


def _share(values: list[float], same: bool = False) -> str:
    """'yes (share of elements caught)' when every seed's kernel is caught somewhere."""
    if not values:
        return "n/a"
    if same:  # one split-K block: the partial is the result, rounded once either way
        return "n/a (one block)"
    worst_case = min(values)  # caught only if every seed is caught
    return f"{'yes' if worst_case > 0 else 'NO'} ({100 * float(np.mean(values)):.0f}%)"


def _row(allowed, ratios, uses, tf32_caught, b16_caught, exp_caught, one_block) -> dict:
    return {
        "allowed": float(np.median(np.concatenate(allowed))),
        "ratio": float(np.median(ratios)),
        "use": float(max(uses)),
        "tf32": _share(tf32_caught),
        "b16": _share(b16_caught, one_block),
        "exp": _share(exp_caught),
    }


RATIO_GOAL = 16.0  # the goal: every bound within 16x of honest reordering


def summary(results: dict[tuple[str, str, int], dict]) -> list[str]:
    """The summary table (docs/performance.md): per op, the float32 ratio at each n, the worst
    16-bit ratio, the largest share of its bound an honest kernel used, and whether every ratio
    is within the goal."""
    lines = [
        "| op | float32 ratio, n = 16 / 256 / 4096 (fused_moe: 1024) | worst 16-bit ratio "
        f"| max use | within {RATIO_GOAL:g}x |",
        "| --- | --- | ---: | ---: | --- |",
    ]
    for op in dict.fromkeys(key[0] for key in results):
        rows = {key: r for key, r in results.items() if key[0] == op}
        f32_ratios = [r["ratio"] for (_, d, _), r in rows.items() if d == "float32"]
        b16 = max(r["ratio"] for (_, d, _), r in rows.items() if d != "float32")
        use = max(r["use"] for r in rows.values())
        ok = max([*f32_ratios, b16]) <= RATIO_GOAL and use <= 1
        ratios = " / ".join(f"{ratio:.1f}x" for ratio in f32_ratios)
        lines.append(f"| {op} | {ratios} | {b16:.1f}x | {use:.2f} | {'yes' if ok else '**no**'} |")
    return lines


def main() -> int:
    start = time.perf_counter()
    ops = sys.argv[1:] or [*OPS_UNDER_TEST, *ATTENTION_OPS]
    header = (
        "| op | dtype | n | allowed (ulps, median) | ratio to honest | max use "
        "| TF32 caught | 16-bit intermediate caught | exp 1e-5 off caught |"
    )
    print(header)
    print("| --- | --- | ---: | ---: | ---: | ---: | --- | --- | --- |")
    results = {}
    for op in ops:
        for dtype in DTYPES:
            for n in MOE_SIZES if op == "fused_moe" else SIZES:
                r = results[op, dtype, n] = measure(op, dtype, n)
                print(
                    f"| {op} | {dtype} | {n} | {r['allowed']:.3g} | {r['ratio']:.1f}x "
                    f"| {r['use']:.2f} | {r['tf32']} | {r['b16']} | {r['exp']} |",
                    flush=True,
                )
    print()
    print("\n".join(summary(results)))
    print(f"\n{time.perf_counter() - start:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
