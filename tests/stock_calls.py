"""Stock PyTorch calls and float32 summation orders written out in numpy, shared by the catalogue
tests (tests/test_catalogue.py) and the bounds' tightness tests (tests/test_bound_tightness.py):
an op called the way the reference property calls it, and the honest orders a kernel may sum in."""

from __future__ import annotations

import numpy as np

from bi_props.catalogue import OPS
from bi_props.execution import materialize as M
from bi_props.model.case import Case
from bi_props.model.compare import bits_to_float64, round_to_bits
from bi_props.targets.cpu import stock_precision


def run_stock(case: Case, samples=None, precision: str | None = None):
    """Stock call and references for the needle (or the given samples), for stock CPU
    PyTorch's declared precision unless ``precision`` says otherwise. A padded case is called
    padded and its outputs cut to the real rows; the references are of the real rows (as the
    reference property does)."""
    samples = samples or M.needle(case)
    args = M.operands(case, samples, "cpu")
    lengths = [rows for _, rows in samples]
    result = OPS[case.op].call(case.entry, args, case, lengths)
    outputs = tuple(result) if isinstance(result, (tuple, list)) else (result,)
    if case.padded:
        outputs = tuple(M.unpad(t, lengths) for t in outputs)
        args = M.operands(case.with_padded(0), samples, "cpu")
    declared = precision or stock_precision(case.op)
    refs = OPS[case.op].references([M.to_float64(a) for a in args], case, lengths, declared)
    return args, outputs, refs


def tree_sum(p: np.ndarray, axis: int) -> np.ndarray:
    """Pairwise float32 sum along ``axis``."""
    p = np.moveaxis(p, axis, 0)
    if p.shape[0] == 0:
        return np.zeros(p.shape[1:], dtype=np.float32)
    while p.shape[0] > 1:
        half = p.shape[0] // 2
        paired = p[:half] + p[half : 2 * half]
        p = np.concatenate([paired, p[2 * half :]]) if p.shape[0] % 2 else paired
    return p[0]


def reversed_sum(
    p: np.ndarray, axis: int, start: np.ndarray | float = 0.0, store: str = "float32"
) -> np.ndarray:
    """Sequential float32 sum along ``axis``, last term first, from ``start``; each partial sum
    rounded into ``store`` (a kernel accumulating in a 16-bit output)."""
    p = np.moveaxis(p, axis, 0)
    acc = np.zeros(p.shape[1:], dtype=np.float32) + np.float32(start)
    for term in p[::-1]:
        acc = round_to((acc + term).astype(np.float32), store)
    return acc


def round_to(values: np.ndarray, dtype: str) -> np.ndarray:
    """Round a float32 intermediate into ``dtype`` and back (a 16-bit kernel's storage)."""
    return bits_to_float64(round_to_bits(values.astype(np.float64), dtype), dtype).astype(
        np.float32
    )
