"""The planted-bug twin of ``fused_gated``: the same op, a batch-variant kernel.

It declares the very same ``OpSpec`` (imported, so registering it twice is a no-op) and names its
own entry point through ``ENTRIES``. The bug: a call with more than ``THRESHOLD`` rows takes a
"large-M" path that rounds silu(a) and b to bfloat16 before multiplying, so a row's bits depend on
how many rows share the call. Expected finding: my_silu_and_mul batch_invariance [enabled], shrunk
to a batch of THRESHOLD + 1 rows in total (and reference failures for a needle of that many rows).
"""

from __future__ import annotations

from fused_gated import SILU_AND_MUL, install, kernel, stock

NAMESPACE = "fused_gated_buggy"
KERNEL_PREFIX = f"{NAMESPACE}::"
ROUTES = {"my_silu_and_mul": (f"{NAMESPACE}::silu_and_mul",)}
OPS = ["my_silu_and_mul"]
EXTRA_OPS = [SILU_AND_MUL]
ENTRIES = {"my_silu_and_mul": (f"{__name__}.silu_and_mul",)}
THRESHOLD = 16

_impl = stock


def buggy_kernel(x):
    import torch

    if x.shape[0] > THRESHOLD:  # BUG: the arithmetic depends on the batch's size
        h = x.shape[-1] // 2
        a, b = x[:, :h].float(), x[:, h:].float()
        silu = (a / (1 + torch.exp(-a))).to(torch.bfloat16)
        return (silu * b.to(torch.bfloat16)).to(x.dtype)
    return kernel(x)


def silu_and_mul(x):
    return _impl(x)


def enable(enabled: bool) -> None:
    global _impl
    if enabled:
        _impl = install(NAMESPACE, buggy_kernel)
