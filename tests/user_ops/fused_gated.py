"""A third-party library with an op of its own: SwiGLU's fused ``silu_and_mul``.

``silu_and_mul(x)``: x of shape (m, 2h) per sample -> silu(x[:, :h]) * x[:, h:], shape (m, h).
The module is a bi_props target (``enable``, ``OPS``, ``KERNEL_PREFIX``) that also declares the op
(``EXTRA_OPS``): its float64 reference and error bound, its shape strategy, its reproducer text.

Enabled, the entry point runs a custom op ``fused_gated::silu_and_mul`` (the profiler shows it:
routing evidence) whose CPU kernel is batch-invariant by construction: each row is computed on its
own contiguous copy, in float32, and rounded once, so a row's bits depend on that row and on h
only. Disabled, the same arithmetic runs on the whole tensor at once (the "stock" composite).

torch is imported inside the functions: bi_props imports this module in its controller (to read
EXTRA_OPS), which never runs an op and need not pay for torch.
"""

from __future__ import annotations

import importlib

import numpy as np

from bi_props import Operand, OpSpec, Reference, output_rounding, register_op, unit_roundoff

NAMESPACE = "fused_gated"
KERNEL_PREFIX = f"{NAMESPACE}::"
ROUTES = {"my_silu_and_mul": (f"{NAMESPACE}::silu_and_mul",)}
OPS = ["my_silu_and_mul"]


# -- the op, declared once for bi_props ---------------------------------------------------------


def _operands(case):
    return (Operand("x", batch_axis=0),)  # per sample; no shared weight


def _operand_shapes(case, rows):
    _, h = case.shape
    return ((rows, 2 * h),)


def _draw_shape(draw, ctx):
    """(m, h): m rows (ctx.rows: a few for batch invariance), h from the space's dim extent."""
    return (draw(ctx.rows), draw(ctx.dim)), {}


def _call(entry, args, case, lengths):
    """Look the entry point up now (a target may name its own, see ENTRIES), then call it."""
    module, _, attr = entry.rpartition(".")
    return getattr(importlib.import_module(module), attr)(args[0])


BOUND = (
    "relative u_acc (|a| + 6) (exp, one add, one division, the product); the flush to 0 where"
    " exp(-a) overflows; plus one rounding to the output dtype and the smallest normal"
)


def _reference(inputs, case, lengths, acc="float32"):
    """silu(a) * b in float64, a = x[:, :h], b = x[:, h:]. A kernel computing in ``acc``: exp
    (a couple of ulps), 1 + e, a / (1 + e), times b: relative error <= u_acc (|a| + 6). Where
    exp(-a) overflows (a < -88.72) a float32 kernel returns a signed zero: allowed."""
    (x,) = inputs
    h = case.shape[1]
    a, b = x[:, :h], x[:, h:]
    with np.errstate(all="ignore"):
        value = a / (1.0 + np.exp(-a)) * b
        error = unit_roundoff(acc) * (np.abs(a) + 6) * np.abs(value)
        error = np.where(a < -88.72, np.abs(value), error)
    bound = output_rounding(value, error, case.dtype, None, acc)
    return (Reference(value, bound, case.dtype, acc),)


def _repro_call(case):
    """The reproducer's call: the entry point imported from its module (no bi_props needed)."""
    module, _, attr = case.entry.rpartition(".")
    return f"from {module} import {attr} as silu_and_mul\n", "silu_and_mul(args[0])"


SILU_AND_MUL = OpSpec(
    name="my_silu_and_mul",
    entries=(f"{__name__}.silu_and_mul",),
    shape_doc="(m, h): x (m, 2h) per sample; returns silu(x[:, :h]) * x[:, h:], (m, h)",
    operands=_operands,
    operand_shapes=_operand_shapes,
    call=_call,
    reference=_reference,
    draw_shape=_draw_shape,
    repro_call=_repro_call,
    bound=BOUND,
)
EXTRA_OPS = [SILU_AND_MUL]
register_op(SILU_AND_MUL)  # optional here (bi_props registers EXTRA_OPS); shown for direct use


# -- the library itself -------------------------------------------------------------------------


def stock(x):
    """The composite: the whole tensor at once, in float32, rounded once."""
    import torch

    h = x.shape[-1] // 2
    y = x.float()
    return (torch.nn.functional.silu(y[..., :h]) * y[..., h:]).to(x.dtype)


def kernel(x):
    """Batch-invariant: row i is computed on its own contiguous float32 copy, rounded once."""
    import torch

    m, h = x.shape[0], x.shape[-1] // 2
    out = torch.empty((m, h), dtype=x.dtype)
    for i in range(m):
        row = x[i].contiguous().float()
        a, b = row[:h], row[h:]
        out[i] = (a / (1 + torch.exp(-a)) * b).to(x.dtype)
    return out


_impl = stock
_libraries: list = []  # a torch.library.Library unregisters itself when collected


def silu_and_mul(x):
    """The library's public entry point."""
    return _impl(x)


def install(namespace: str, cpu_kernel):
    """Define ``namespace::silu_and_mul`` with ``cpu_kernel`` on the CPU key; returns the custom
    op (calling it shows ``namespace::silu_and_mul`` in the profiler)."""
    import torch

    lib = torch.library.Library(namespace, "DEF")
    lib.define("silu_and_mul(Tensor x) -> Tensor")
    lib.impl("silu_and_mul", cpu_kernel, "CPU")
    _libraries.append(lib)
    return getattr(torch.ops, namespace).silu_and_mul


def enable(enabled: bool) -> None:
    """Called once in a fresh bi_props worker: route the entry point to the kernel, or not."""
    global _impl
    if enabled:
        _impl = install(NAMESPACE, kernel)


def evidence(op):
    """Identity check (optional hook): is the entry point routed to the custom op?"""
    return {f"{__name__}.silu_and_mul routed to torch.ops": _impl is not stock}
