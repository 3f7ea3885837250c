"""How tight is the reference bound, and what does it catch? (``python benchmarks/tightness.py``)

Per op (mm, sum, rms_norm, softmax), output dtype and size n (K for mm, the row length otherwise),
over a few seeds of the catalogue's own ``general`` inputs, for a kernel declaring float32
internals:

- honest: float32 kernels in four summation orders (sequential, reversed, pairwise, blocks of 16),
  products and exp rounded to float32, the result rounded once to the output dtype. ``ratio`` is
  the median over elements of allowed slack / the worst honest order's error (the error floored at
  the half ulp the final rounding costs anyway); ``use`` is the largest fraction of its slack any
  honest element used (above 1 would be a false alarm).
- tf32: the same kernel with both inputs' mantissas cut to 10 bits (float32 only: bf16 and fp16
  inputs already fit); ``b16``: an intermediate (mm and sum: split-K partials of 64 terms; softmax:
  the exps; rms_norm: x / rms before the weight) rounded to bf16 for a float32 output, to the
  output dtype for a 16-bit one. Shown as the share of output elements outside the bound
  ("yes" when every seed has one: the reference property fails on one element). With n <= 64 a
  16-bit split-K kernel has one block, whose rounded partial is the result: nothing to catch.
  ``allowed`` is the median slack in ulps of the output (the ulp at |value|, 2 u |value|).

Prints a table (the README's "Bounds and their tightness" quotes it). About a minute on 2 cores.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import numpy as np

from bi_props.catalogue import OPS
from bi_props.execution import materialize as M
from bi_props.model.case import Case
from bi_props.model.compare import bits_to_float64, round_to_bits, unit_roundoff

SIZES = (16, 256, 4096)
DTYPES = ("float32", "bfloat16", "float16")
SEEDS = (0, 1, 2)
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
    terms = f32(a[:, None, :] * b.T[None, :, :])
    if narrow:
        return blocked(terms, BLOCK, narrow).astype(np.float64)
    return summer(terms).astype(np.float64)


def sum_kernel(x, summer, narrow):
    terms = f32(x[0])
    if narrow:
        return blocked(terms, BLOCK, narrow).astype(np.float64)
    return summer(terms).astype(np.float64)


def rms_norm_kernel(x, summer, narrow):
    v, w = x
    h = v.shape[-1]
    total = summer(f32(v * v)).astype(np.float64)
    ms = f32(total / h)
    r = f32(1.0 / np.sqrt(f32(ms + 2.0**-23)))[:, None]
    normed = f32(v * r)
    if narrow:
        normed = rnd(normed, narrow)
    return f32(normed * w).astype(np.float64)


def softmax_kernel(x, summer, narrow):
    v = x[0]
    shifted = f32(v - v.max(-1, keepdims=True))
    e = f32(np.exp(shifted.astype(np.float64)))
    if narrow:
        e = f32(rnd(e, narrow))
    s = summer(e).astype(np.float64)[:, None]
    return f32(e / s).astype(np.float64)


OPS_UNDER_TEST = {
    "mm": (mm_kernel, lambda n: (8, n, 16), {}),
    "sum": (sum_kernel, lambda n: (16, n), {"dim": -1}),
    "rms_norm": (rms_norm_kernel, lambda n: (16, n), {}),
    "softmax": (softmax_kernel, lambda n: (16, n), {"dim": -1}),
}


def measure(op: str, dtype: str, n: int) -> dict[str, float | str]:
    kernel, shape_of, options = OPS_UNDER_TEST[op]
    ratios, uses, caught_tf32, caught_b16, allowed = [], [], [], [], []
    narrow = "bfloat16" if dtype == "float32" else dtype
    for seed in SEEDS:
        probe = Case(op, "", dtype, shape_of(n), (), "general", seed, options)
        layouts = ("contiguous",) * len(OPS[op].operands(probe))
        case = Case(op, OPS[op].entries[0], dtype, shape_of(n), layouts, "general", seed, options)
        x = [M.to_float64(t) for t in M.operands(case, M.needle(case), "cpu")]
        (ref,) = OPS[op].references(x, case, [case.shape[0]], "float32")
        value, tol = ref.value, np.broadcast_to(ref.tolerance, ref.value.shape)
        worst = np.max(
            [np.abs(rnd(kernel(x, order, None), dtype) - value) for order in ORDERS.values()],
            axis=0,
        )
        floor = unit_roundoff(dtype) * np.abs(value)
        ulp = 2 * unit_roundoff(dtype) * np.maximum(np.abs(value), 1e-30)
        allowed.append(np.ravel(tol / ulp))
        ratios.append(np.median(tol / np.maximum(worst, floor)))
        uses.append(float(np.max(worst / tol)))
        if dtype == "float32":
            bad = rnd(kernel([tf32(t) for t in x], sequential, None), dtype)
            caught_tf32.append(np.mean(np.abs(bad - value) > tol))
        bad = rnd(kernel(x, sequential, narrow), dtype)
        caught_b16.append(np.mean(np.abs(bad - value) > tol))
    allowed_ulps = np.median(np.concatenate(allowed))
    one_block = op in ("mm", "sum") and n <= BLOCK and dtype != "float32"

    def share(values: list[float], same: bool = False) -> str:
        if not values:
            return "n/a"
        if same:  # one split-K block: the partial is the result, rounded once either way
            return "n/a (one block)"
        worst_case = min(values)  # caught only if every seed is caught
        return f"{'yes' if worst_case > 0 else 'NO'} ({100 * float(np.mean(values)):.0f}%)"

    return {
        "allowed": float(allowed_ulps),
        "ratio": float(np.median(ratios)),
        "use": float(max(uses)),
        "tf32": share(caught_tf32),
        "b16": share(caught_b16, one_block),
    }


def main() -> int:
    start = time.perf_counter()
    header = (
        "| op | dtype | n | allowed (ulps, median) | ratio to honest | max use "
        "| TF32 caught | 16-bit intermediate caught |"
    )
    print(header)
    print("| --- | --- | ---: | ---: | ---: | ---: | --- | --- |")
    for op in OPS_UNDER_TEST:
        for dtype in DTYPES:
            for n in SIZES:
                r = measure(op, dtype, n)
                print(
                    f"| {op} | {dtype} | {n} | {r['allowed']:.3g} | {r['ratio']:.1f}x "
                    f"| {r['use']:.2f} | {r['tf32']} | {r['b16']} |",
                    flush=True,
                )
    print(f"\n{time.perf_counter() - start:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
