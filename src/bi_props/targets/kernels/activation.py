"""Batch-invariant activations: SwiGLU's ``silu``.

Stock CPU ``silu`` is position-dependent in float32 here: its vectorised body and its scalar tail
compute ``exp`` differently, and which elements fall in the tail depends on the tensor's size, i.e.
on the batch (measured: 8 of ~300k elements differ between a slice computed alone and in place).
"""

from __future__ import annotations

import torch
from torch import Tensor

from .primitives import exp
from .route import KernelRoute


def silu(x: Tensor) -> Tensor:
    """``x / (1 + exp(-x))`` in float64 with the package's own ``exp``, rounded once to x's dtype.

    Batch-invariant by construction: an elementwise function of one element made only of correctly
    rounded operations (the own exp included), so no element can see its neighbours or its
    position in the tensor.
    """
    if not x.is_floating_point():
        raise RuntimeError(f"\"silu\" not implemented for '{str(x.dtype).removeprefix('torch.')}'")
    with torch.no_grad():
        x64 = x.to(torch.float64)
        # -inf: -inf / inf is NaN, as stock PyTorch gives (2.13, every dtype) and the reference
        # says; the exhaustive 16-bit sweep found an earlier -0.0 here.
        y = x64 / (exp(-x64) + 1.0)
        return y.to(x.dtype)


def _check_gated(x: Tensor, name: str) -> None:
    if not x.is_floating_point():
        raise RuntimeError(
            f"\"{name}\" not implemented for '{str(x.dtype).removeprefix('torch.')}'"
        )


def silu_and_mul(x: Tensor) -> Tensor:
    """Batch-invariant SwiGLU: ``a / (1 + exp(-a)) * b``, a = x[..., :h], b = x[..., h:].

    Elementwise in float64 from correctly rounded operations and the package's own ``exp``,
    rounded once to x's dtype: an output element depends on its own a and b only.
    """
    _check_gated(x, "silu_and_mul")
    h = x.shape[-1] // 2
    with torch.no_grad():
        a, b = x[..., :h].to(torch.float64), x[..., h:].to(torch.float64)
        silu_a = a / (exp(-a) + 1.0)  # NaN at -inf, as stock silu
        return (silu_a * b).to(x.dtype)


_ERF_CLAMP = 4.5
"""|z| beyond which erf(z) is +-1 to within erfc(4.5) = 2e-10 (far below float32's ulp of 1)."""
_ERF_TERMS = 96
_TWO_OVER_SQRT_PI = 1.1283791670955126


def erf64(z: Tensor) -> Tensor:
    """erf of a float64 tensor from correctly rounded operations and the package's ``exp``:
    ``2/sqrt(pi) exp(-z^2) sum_n 2^n z^(2n+1) / (2n+1)!!`` (every term of one sign: no
    cancellation), a fixed number of terms for every element, |z| clamped at 4.5. Relative error
    ~1e-15 on |z| <= 4.5; absolute error <= 2e-10 beyond."""
    c = torch.clamp(z, -_ERF_CLAMP, _ERF_CLAMP)
    c2 = c * c
    term = c.clone()
    total = c.clone()
    for n in range(_ERF_TERMS):
        term = term * (c2 * (2.0 / (2 * n + 3)))
        total = total + term
    out = (total * _TWO_OVER_SQRT_PI) * exp(-c2)
    out = torch.clamp(out, -1.0, 1.0)
    return torch.where(torch.isnan(z), z, out)


def tanh64(y: Tensor) -> Tensor:
    """tanh of a float64 tensor: sign(y) (1 - e) / (1 + e), e = exp(-2|y|) (the own exp)."""
    e = exp(-2.0 * torch.abs(y))
    t = (1.0 - e) / (1.0 + e)
    return torch.where(y < 0, -t, t)


_SQRT_HALF = 0.7071067811865476
_SQRT_2_OVER_PI = 0.7978845608028654


def gelu_and_mul(x: Tensor, approximate: str = "none") -> Tensor:
    """Batch-invariant GeGLU: ``gelu(a) * b`` (erf or tanh form), elementwise in float64 from
    correctly rounded operations and the package's own exp/erf/tanh, rounded once."""
    _check_gated(x, "gelu_and_mul")
    if approximate not in ("none", "tanh"):
        raise RuntimeError(f"approximate argument must be either none or tanh, got {approximate}")
    h = x.shape[-1] // 2
    with torch.no_grad():
        a, b = x[..., :h].to(torch.float64), x[..., h:].to(torch.float64)
        if approximate == "tanh":
            phi = 1.0 + tanh64(_SQRT_2_OVER_PI * (a + 0.044715 * (a * a * a)))
        else:
            phi = 1.0 + erf64(a * _SQRT_HALF)
        gelu = (0.5 * a) * phi
        # -inf: -inf x 0 is NaN in stock PyTorch and the reference (our erf64 stops just short
        # of -1 there, which gave -inf: found by the exhaustive 16-bit sweep)
        gelu = torch.where(a == float("-inf"), torch.full_like(gelu, float("nan")), gelu)
        return (gelu * b).to(x.dtype)


ROUTES = (
    KernelRoute(
        "silu(Tensor self) -> Tensor",
        silu,
        ops=("silu",),
        aten={"silu": lambda ns: lambda self: ns.silu(self)},
    ),
    KernelRoute(
        "silu_and_mul(Tensor x) -> Tensor",
        silu_and_mul,
        ops=("silu_and_mul",),
        composite="silu_and_mul",
    ),
    KernelRoute(
        "gelu_and_mul(Tensor x, str approximate='none') -> Tensor",
        gelu_and_mul,
        ops=("gelu_and_mul",),
        composite="gelu_and_mul",
    ),
)
"""The kernels of this module and how the switch routes to them (route.py)."""
