"""Turn a Case into tensors, deterministically, in the worker.

Values come from numpy's PCG64 seeded by (sample seed, operand index), so they are the same on every
machine, torch version and device, and never pass through a kernel that a switch replaced. Layouts
are applied last, to the whole (possibly batched) logical tensor.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..model.case import BIT_PATTERNS, COMPANION_CONTENTS, PATTERNS, Case
from ..model.compare import round_to_bits
from ..model.op_registry import OPS

_SPECIALS = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0])


def values(shape: tuple[int, ...], seed: int, operand: int, case: Case) -> np.ndarray:
    """float64 values of one operand of one sample, for the case's value class, then for a
    companion of another content (``SampleSeed``) that content's (``with_content``)."""
    rng = np.random.default_rng([seed, operand])
    content = getattr(seed, "content", "plain")
    if case.values == "exact":
        amplitude = OPS[case.op].exact_amplitude(case)
        array = rng.integers(-amplitude, amplitude + 1, size=shape).astype(np.float64)
        return with_content(array, content, seed, operand, case.dtype)
    base = rng.standard_normal(size=shape).astype(np.float32).astype(np.float64)
    if case.values == "wide":
        top = 5 if case.dtype == "float16" else 20
        base = base * np.exp2(rng.integers(-top, top + 1, size=shape))
    elif case.values == "special":
        mask = rng.random(size=shape) < 0.1
        picks = _SPECIALS[rng.integers(0, len(_SPECIALS), size=shape)]
        base = np.where(mask, picks, base)
    return with_content(base, content, seed, operand, case.dtype)


_MANTISSA = {"float32": 23, "bfloat16": 7, "float16": 10, "float64": 52}
_LARGEST = {"float16": 65504.0, "float64": 1.7976931348623157e308}  # others: float32's
_TINY_EXP = {"float16": -17}  # subnormal scale: 2^-17 x N(0, 1) in fp16, 2^-130 in the others


def with_content(array: np.ndarray, content: str, seed: int, operand: int, dtype: str):
    """A companion's values in its content class (``model.case.COMPANION_CONTENTS``); plain
    values unchanged. Its randomness comes from generators of its own (seed, operand, content)
    drawn elementwise or per row like the plain values, so that the first rows of a sample hold
    the same values whatever its length (a batch window that cuts a companion sees its rows as
    the whole batch does)."""
    if content == "plain" or array.size == 0:
        return array
    index = COMPANION_CONTENTS.index(content)
    rng = np.random.default_rng([seed, operand, index])
    if content == "outlier":  # 10^2 to 10^4 times the plain values, one factor a sample
        return array * 10.0 ** int(rng.integers(2, 5))
    if content == "huge":
        largest = _LARGEST.get(dtype, 3.4028234663852886e38)
        return np.clip(array, -1.0, 1.0) * (largest / 4)
    if content == "tiny":
        return array * 2.0 ** _TINY_EXP.get(dtype, -130)
    if content == "ties":  # small integers and halves, half of them one ulp of the dtype away
        ties = np.round(array * 2) / 2
        exponent = np.floor(np.log2(np.where(ties == 0, 1.0, np.abs(ties))))
        ulp = np.exp2(exponent - _MANTISSA.get(dtype, 23))
        near = rng.random(size=array.shape) < 0.5
        return np.where(near & (ties != 0), ties + ulp, ties)
    if content == "neg_inf":  # a quarter of the rows all -inf, a quarter with a tile of 16
        out = np.array(array, dtype=np.float64)
        rows = out.reshape(-1, 1) if out.ndim <= 1 else out.reshape(-1, out.shape[-1])
        pick = rng.random(size=rows.shape[0])
        tiles = np.random.default_rng([seed, operand, index, 1])  # its own: prefix-consistent
        tile = tiles.integers(0, 1 << 30, size=rows.shape[0]) % max(1, -(-rows.shape[1] // 16))
        for r in np.flatnonzero(pick < 0.5):
            if pick[r] < 0.25 or rows.shape[1] <= 16:
                rows[r, :] = -np.inf
            else:
                rows[r, 16 * tile[r] : 16 * tile[r] + 16] = -np.inf
        return rows.reshape(out.shape)
    raise ValueError(f"unknown companion content {content!r}")


def _tokens(vocab: int):
    def draw(shape: tuple[int, ...], seed: int, operand: int, case: Case) -> np.ndarray:
        return np.random.default_rng([seed, operand]).integers(0, vocab, size=shape)

    return draw


def apply_layout(t: Any, layout: str) -> Any:
    """Same logical tensor, other strides: transposed storage, a storage offset, a stride of 2."""
    import torch

    if layout == "contiguous" or t.dim() == 0:
        return t.contiguous()
    if layout == "transposed" and t.dim() >= 2:
        return t.transpose(-1, -2).contiguous().transpose(-1, -2)
    if layout == "offset":
        flat = torch.empty(t.numel() + 3, dtype=t.dtype, device=t.device)
        view = flat[3:].view(t.shape)
        view.copy_(t)
        return view
    # "strided", and "transposed" on a vector: every other element of a buffer twice as wide.
    wide = torch.zeros((*t.shape[:-1], 2 * t.shape[-1]), dtype=t.dtype, device=t.device)
    view = wide[..., ::2]
    view.copy_(t)
    return view


_INT_VIEW = {"float64": "int64", "float32": "int32", "bfloat16": "int16", "float16": "int16"}


def _to_tensor(array: np.ndarray, dtype: str, device: str) -> Any:
    """Round with numpy, then reinterpret the bits: torch's own float64 -> bf16 conversion gives
    NaN different bits in its vector body and its scalar tail, i.e. depending on the size."""
    import torch

    if dtype not in _INT_VIEW:
        return torch.from_numpy(np.ascontiguousarray(array)).to(getattr(torch, dtype)).to(device)
    bits = round_to_bits(np.ascontiguousarray(array, dtype=np.float64), dtype)
    signed = bits.view(np.dtype(_INT_VIEW[dtype]))
    t = torch.from_numpy(np.ascontiguousarray(signed)).view(getattr(torch, dtype))
    return t.to(device)


def to_float64(t: Any) -> np.ndarray:
    """A tensor's exact values as float64 numpy (bf16/fp16/fp32 all embed exactly)."""
    import torch

    if not t.is_floating_point():
        return t.detach().to("cpu").numpy()
    return t.detach().to("cpu").to(torch.float64).numpy()


PAD_POISON = np.array([np.nan, 2.0**14, -(2.0**14)])
"""What padding rows hold, cycling by element: NaN and large values of both signs (exact in
every float dtype), so that a kernel that reads padding into a real row changes that row (NaN
spreads through sums, products and max; 2^14 squared overflows float16)."""


def padded_length(case: Case, samples: Sequence[tuple[int, int]]) -> int:
    """The length every sample is padded to in a padded case (at least the longest sample's
    rows, whatever ``case.padded`` says after shrinking); 0 for a packed case."""
    if not case.padded:
        return 0
    return max(case.padded, *(rows for _, rows in samples))


def alone_case(case: Case) -> Case:
    """The needle alone, as batch invariance runs it: a padded case laid out at the needle's own
    length (no padding rows), so that the batch's padded length is the difference."""
    return case.with_padded(case.shape[0]) if case.padded else case


def _pad(part: np.ndarray, length: int) -> np.ndarray:
    """One sample's (rows, ...) values padded with ``PAD_POISON`` to (length, ...)."""
    pad = np.resize(PAD_POISON, (length - part.shape[0], *part.shape[1:]))
    return np.concatenate([part, pad], axis=0)


def unpad(t: Any, lengths: Sequence[int]) -> Any:
    """A padded output (samples, length, ...) cut back to the real rows of each sample, packed:
    (sum of lengths, ...), as the op's packed output would be. Padding rows are never compared."""
    import torch

    return torch.cat([t[i, :rows] for i, rows in enumerate(lengths)], dim=0)


def operands(
    case: Case, samples: Sequence[tuple[int, int]], device: str, layouts: bool = True
) -> list[Any]:
    """The op's tensors for ``samples`` [(seed, rows), ...] concatenated along batch axes, or in
    a padded case (``Case.padded``) stacked as (samples, padded length, ...) with poisoned
    padding rows (contiguous, with ``layouts=False``: the logical values a reproducer writes
    out)."""
    info = OPS[case.op]
    specs = info.operands(case)
    length = padded_length(case, samples)
    result = []
    for index, spec in enumerate(specs):
        draw = _tokens(spec.tokens) if spec.tokens else values
        if spec.batch_axis is None:
            shape = info.operand_shapes(case, samples[0][1] if samples else 0)[index]
            array = draw(shape, case.seed, index, case)
        else:
            parts = [
                draw(info.operand_shapes(case, rows)[index], seed, index, case)
                for seed, rows in samples
            ]
            if length and (spec.batch_axis != 0 or spec.tokens):
                raise ValueError(f"{case.op}: operand {spec.name!r} cannot be padded")
            if length:
                array = np.stack([_pad(part, length) for part in parts])
            else:
                array = np.concatenate(parts, axis=spec.batch_axis)
        if case.values == BIT_PATTERNS and index == 0:
            tensor = _pattern_tensor(case, device)
        else:
            tensor = _to_tensor(array, "int64" if spec.tokens else case.dtype, device)
        layout = case.layouts[index] if index < len(case.layouts) and layouts else "contiguous"
        result.append(apply_layout(tensor, layout))
    return result


def patterns(case: Case) -> np.ndarray:
    """The uint16 bit patterns of a ``BIT_PATTERNS`` case: ``(seed + i) mod 65536`` over its
    (rows, cols) shape."""
    rows, cols = case.shape[0], case.shape[1]
    flat = (case.seed + np.arange(rows * cols, dtype=np.int64)) % PATTERNS
    return flat.astype(np.uint16).reshape(rows, cols)


def _pattern_tensor(case: Case, device: str) -> Any:
    """The swept operand, bit for bit (no float64 round trip: every NaN payload survives)."""
    import torch

    if case.dtype not in ("bfloat16", "float16") or OPS[case.op].sweep is None:
        raise ValueError(f"{case.op} {case.dtype}: no exhaustive 16-bit sweep")
    bits = np.ascontiguousarray(OPS[case.op].sweep(case, patterns(case)), dtype=np.uint16)
    t = torch.from_numpy(bits.view(np.int16)).view(getattr(torch, case.dtype))
    return t.to(device)


def needle(case: Case) -> list[tuple[int, int]]:
    return [(case.seed, case.shape[0])]


def batch_samples(case: Case) -> list[tuple[int, int]]:
    if case.batch is None:
        return needle(case)
    return case.batch.samples(case.seed, case.shape[0])


def bits(t: Any) -> tuple[str, tuple[int, ...], str, np.ndarray]:
    """(dtype, shape, device, bit patterns) of a floating tensor; the bits as unsigned integers."""
    import torch

    dtype = str(t.dtype).removeprefix("torch.")
    view = {
        torch.float64: (torch.int64, np.uint64),
        torch.float32: (torch.int32, np.uint32),
        torch.bfloat16: (torch.int16, np.uint16),
        torch.float16: (torch.int16, np.uint16),
    }.get(t.dtype)
    host = t.detach().to("cpu").contiguous()
    if view is None:
        array = host.numpy().copy()
    else:
        array = host.view(view[0]).numpy().view(view[1]).copy()
    return dtype, tuple(t.shape), str(t.device), array


def row_slice(offset: int, rows: int, axis: int, ndim: int) -> tuple[slice, ...]:
    index = [slice(None)] * ndim
    index[axis] = slice(offset, offset + rows)
    return tuple(index)


__all__ = [
    "alone_case",
    "apply_layout",
    "batch_samples",
    "bits",
    "needle",
    "operands",
    "padded_length",
    "to_float64",
    "unpad",
]
