"""Shared plumbing of the planted libraries (imported by them only, in bi_props worker processes).

Each planted library is a tiny third-party target in the documented module interface: it defines a
custom op ``<namespace>::mm`` with ``torch.library`` (so the profiler names it) and re-registers
``aten::mm`` on the CPU dispatch key to call it. The kernels below never call ``torch.mm`` or
``torch.matmul`` (that would recurse into the override): they are loops of elementwise ops.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import torch
from torch import Tensor

_LIBRARIES: list[torch.library.Library] = []  # a Library unregisters itself when collected


def install(namespace: str, kernel: Callable[[Tensor, Tensor], Tensor]) -> None:
    """Define ``namespace::mm`` (CPU kernel ``kernel``) and route ``aten::mm`` on CPU to it."""
    defs = torch.library.Library(namespace, "DEF")
    defs.define("mm(Tensor self, Tensor mat2) -> Tensor")
    defs.impl("mm", kernel, "CPU")
    ns = getattr(torch.ops, namespace)
    aten = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="(?s).*previously registered kernel")
        aten.impl("mm", lambda self, mat2: ns.mm(self, mat2), "CPU")
    _LIBRARIES.extend((defs, aten))


def check(a: Tensor, b: Tensor) -> None:
    """The stock contract's argument checks (so that parity holds on bad input)."""
    torch._check(a.dim() == 2 and b.dim() == 2, lambda: "mm: both operands must be matrices")
    torch._check(
        a.shape[1] == b.shape[0],
        lambda: (
            f"mat1 and mat2 shapes cannot be multiplied ({a.shape[0]}x{a.shape[1]} and "
            f"{b.shape[0]}x{b.shape[1]})"
        ),
    )
    torch._check(
        a.dtype == b.dtype,
        lambda: f"expected m1 and m2 to have the same dtype, but got: {a.dtype} != {b.dtype}",
    )


def mm_float64(a: Tensor, b: Tensor, columns: int | None = None) -> Tensor:
    """Each output element summed over K in float64, in order, then rounded once (in float64).

    Products of two float32 (or 16-bit) values are exact in float64, and every step is an
    elementwise op, so row i depends on row i of ``a`` and on ``b`` only: batch-invariant and
    deterministic. ``columns`` limits the sum to the first ``columns`` terms of K.
    """
    m, k = a.shape
    acc = torch.zeros((m, b.shape[1]), dtype=torch.float64)
    a64, b64 = a.to(torch.float64), b.to(torch.float64)
    for i in range(k if columns is None else columns):
        acc += a64[:, i : i + 1] * b64[i : i + 1, :]
    return acc


def mm_float32_reversed(a: Tensor, b: Tensor) -> Tensor:
    """The same sum accumulated in float32, last term of K first: another rounding sequence."""
    m, k = a.shape
    acc = torch.zeros((m, b.shape[1]), dtype=torch.float32)
    a32, b32 = a.to(torch.float32), b.to(torch.float32)
    for i in reversed(range(k)):
        acc += a32[:, i : i + 1] * b32[i : i + 1, :]
    return acc


SAMPLE_SCHEMA = (
    "sample(Tensor logits, Tensor temperature, Tensor top_k, Tensor top_p, Tensor min_p,"
    " Tensor greedy, Tensor noise) -> (Tensor, Tensor)"
)


def install_sample(namespace: str, kernel: Callable[..., tuple[Tensor, Tensor]]) -> None:
    """Define ``namespace::sample`` (CPU kernel ``kernel``, the profiler's event) and swap
    ``bi_props.ops.sample`` (the catalogue's entry point) for a call of it."""
    import bi_props.ops as ops

    # a fragment: the library may have defined its namespace already (install: its mm)
    defs = torch.library.Library(namespace, "FRAGMENT")
    defs.define(SAMPLE_SCHEMA)
    defs.impl("sample", kernel, "CPU")
    op = getattr(torch.ops, namespace).sample

    def sample(*args):
        return tuple(op(*args))

    ops.sample = sample
    _LIBRARIES.append(defs)


def sample_invariant(*args) -> tuple[Tensor, Tensor]:
    """The cpu target's batch-invariant sampler (bi_props' own kernel: row by row)."""
    from bi_props.targets.kernels.sampling import sample

    return sample(*args)
