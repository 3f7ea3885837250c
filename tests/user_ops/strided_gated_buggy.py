"""The planted-bug twin of ``strided_gated``: a kernel whose bits depend on the input's layout.

The same op and the same property (imported, so registering them again is a no-op). The bug: an
input that is neither row- nor column-major (every other element of a wider buffer: the
'strided' layout) takes a "gather path" that multiplies before it divides, (a * b) / (1 + exp(-a))
instead of a / (1 + exp(-a)) * b: a float32 ulp or two apart, within the reference's bound, and
the same for a row alone and in a batch of the same layout, so no built-in property sees it.
Expected finding: my_silu_and_mul layout_invariance [enabled], shrunk to a needle of a row or two
with h = 1 in the 'strided' layout.
"""

from __future__ import annotations

from strided_gated import LAYOUT_INVARIANCE, SILU_AND_MUL, install, kernel, stock

NAMESPACE = "strided_gated_buggy"
KERNEL_PREFIX = f"{NAMESPACE}::"
ROUTES = {"my_silu_and_mul": (f"{NAMESPACE}::silu_and_mul",)}
OPS = ["my_silu_and_mul"]
EXTRA_OPS = [SILU_AND_MUL]
EXTRA_PROPERTIES = [LAYOUT_INVARIANCE]
ENTRIES = {"my_silu_and_mul": (f"{__name__}.silu_and_mul",)}

_impl = stock


def buggy_kernel(x):
    import torch

    if x.dim() == 2 and x.stride(-1) != 1 and x.stride(0) != 1:  # BUG: depends on the layout
        m, h = x.shape[0], x.shape[-1] // 2
        out = torch.empty((m, h), dtype=x.dtype)
        for i in range(m):
            a, b = x[i, :h].float(), x[i, h:].float()
            out[i] = ((a * b) / (1 + torch.exp(-a))).to(x.dtype)
        return out
    return kernel(x)


def silu_and_mul(x):
    return _impl(x)


def enable(enabled: bool) -> None:
    global _impl
    if enabled:
        _impl = install(NAMESPACE, buggy_kernel)
