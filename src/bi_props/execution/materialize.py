"""Turn a Case into tensors, deterministically, in the worker.

Values come from numpy's PCG64 seeded by (sample seed, operand index), so they are the same on every
machine, torch version and device, and never pass through a kernel that a switch replaced. Layouts
are applied last, to the whole (possibly batched) logical tensor.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..model.case import Case
from ..model.compare import round_to_bits
from ..model.op_registry import OPS

_SPECIALS = np.array([np.nan, np.inf, -np.inf, -0.0, 0.0])


def values(shape: tuple[int, ...], seed: int, operand: int, case: Case) -> np.ndarray:
    """float64 values of one operand of one sample, for the case's value class."""
    rng = np.random.default_rng([seed, operand])
    if case.values == "exact":
        amplitude = OPS[case.op].exact_amplitude(case)
        return rng.integers(-amplitude, amplitude + 1, size=shape).astype(np.float64)
    base = rng.standard_normal(size=shape).astype(np.float32).astype(np.float64)
    if case.values == "wide":
        top = 5 if case.dtype == "float16" else 20
        return base * np.exp2(rng.integers(-top, top + 1, size=shape))
    if case.values == "special":
        mask = rng.random(size=shape) < 0.1
        picks = _SPECIALS[rng.integers(0, len(_SPECIALS), size=shape)]
        return np.where(mask, picks, base)
    return base


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


def operands(
    case: Case, samples: Sequence[tuple[int, int]], device: str, layouts: bool = True
) -> list[Any]:
    """The op's tensors for ``samples`` [(seed, rows), ...] concatenated along batch axes
    (contiguous, with ``layouts=False``: the logical values a reproducer writes out)."""
    info = OPS[case.op]
    specs = info.operands(case)
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
            array = np.concatenate(parts, axis=spec.batch_axis)
        tensor = _to_tensor(array, "int64" if spec.tokens else case.dtype, device)
        layout = case.layouts[index] if index < len(case.layouts) and layouts else "contiguous"
        result.append(apply_layout(tensor, layout))
    return result


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


__all__ = ["apply_layout", "batch_samples", "bits", "needle", "operands", "to_float64"]
