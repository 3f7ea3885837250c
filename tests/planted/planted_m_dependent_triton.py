"""Planted Triton library, bug class *reduction order chosen from M* (run under TRITON_INTERPRET=1).

A real ``@triton.jit`` tiled matmul registered on ``aten::mm`` (CPU key), whose config table picks
BLOCK_K from M, as persistent-matmul heuristics do: BLOCK_K = 32 for M <= THRESHOLD rows, 16
above. The k-tiles are summed in a different grouping, so with K > 16 a row's bits depend on how
many rows share the call. Expected finding: mm batch_invariance [enabled] at M = THRESHOLD + 1 in
total. ``planted_m_dependent_honest_triton`` is the same kernel with BLOCK_M (not BLOCK_K) chosen
from M: invariant on a GPU, and invariant under the interpreter only with the compat layer's
order-fixed dot (bi_props.targets.triton_compat, ``ordered_dot``).
"""

from __future__ import annotations

import plantedlib
import torch
import triton
import triton.language as tl

NAMESPACE = "planted_m_dependent_triton"
OPS = ["mm"]
KERNEL_PREFIX = f"{NAMESPACE}::"
ROUTES = {"mm": (f"{NAMESPACE}::mm",)}
THRESHOLD = 16


@triton.jit
def mm_kernel(
    a_ptr, b_ptr, c_ptr, M, N, K,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(
            a_ptr + rm[:, None] * stride_am + rk[None, :] * stride_ak,
            mask=(rm[:, None] < M) & (rk[None, :] < K),
            other=0.0,
        )
        b = tl.load(
            b_ptr + rk[:, None] * stride_bk + rn[None, :] * stride_bn,
            mask=(rk[:, None] < K) & (rn[None, :] < N),
            other=0.0,
        )
        acc = tl.dot(a, b, acc)
    c = acc.to(c_ptr.dtype.element_ty)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    tl.store(c_ptr + rm[:, None] * stride_cm + rn[None, :] * stride_cn, c, mask=mask)


def launch(a: torch.Tensor, b: torch.Tensor, block_m: int, block_k: int) -> torch.Tensor:
    """``a @ b`` by mm_kernel with the given tile (BLOCK_N = 16)."""
    plantedlib.check(a, b)
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), dtype=a.dtype, device=a.device)
    if M == 0 or N == 0:
        return c
    if K == 0:
        return c.zero_()
    grid = (triton.cdiv(M, block_m), triton.cdiv(N, 16))
    mm_kernel[grid](
        a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
        c.stride(0), c.stride(1), BLOCK_M=block_m, BLOCK_N=16, BLOCK_K=block_k,
    )  # fmt: skip
    return c


def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    block_k = 32 if a.shape[0] <= THRESHOLD else 16  # BUG: the reduction's tiling follows M
    return launch(a, b, block_m=16, block_k=block_k)


def enable(enabled: bool) -> None:
    if enabled:
        plantedlib.install(NAMESPACE, mm)
