"""Planted library, contract class *widening* (accepts more than stock): not a bug by default.

A correct silu (bi_props's CPU kernel: float64 inside, rounded once; batch-invariant) that also
computes integer (int64) inputs, which stock ``aten::silu`` refuses (NotImplementedError:
"silu_cpu" not implemented for 'Long'). Every other dtype keeps the stock contract: int32 raises
the same NotImplementedError, complex64 returns complex64. Expected: one finding of kind
``widening`` (silu parity [both], on int64), reported as "accepts more than stock": exit 0, and
exit 1 with ``--strict-contract``.
"""

from __future__ import annotations

import warnings

import torch

from bi_props.targets.kernels import activation

NAMESPACE = "planted_widening"
OPS = ["silu"]
KERNEL_PREFIX = f"{NAMESPACE}::"
ROUTES = {"silu": (f"{NAMESPACE}::silu",)}
_LIBRARIES: list[torch.library.Library] = []


def silu(x: torch.Tensor) -> torch.Tensor:
    if x.is_floating_point():
        return activation.silu(x)
    if x.dtype == torch.int64:
        # WIDENING: stock silu raises for integers; this kernel returns silu(x) truncated
        return activation.silu(x.to(torch.float64)).to(torch.int64)
    if x.is_complex():  # the stock contract: complex in, complex out (values not compared)
        return x / (1 + torch.exp(-x))
    name = {torch.int32: "Int", torch.int16: "Short", torch.int8: "Char"}.get(x.dtype, x.dtype)
    raise NotImplementedError(f"\"silu_cpu\" not implemented for '{name}'")


def enable(enabled: bool) -> None:
    if not enabled:
        return
    defs = torch.library.Library(NAMESPACE, "DEF")
    defs.define("silu(Tensor self) -> Tensor")
    defs.impl("silu", silu, "CPU")
    ns = getattr(torch.ops, NAMESPACE)
    aten = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="(?s).*previously registered kernel")
        aten.impl("silu", lambda self: ns.silu(self), "CPU")
    _LIBRARIES.extend((defs, aten))
