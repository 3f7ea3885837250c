"""bi_props.targets.triton_compat against the real interpreter: each patch corrects what it
says, and the interpreter without it shows the deviation (so each patch is needed, and each test
would fail without it)."""

from __future__ import annotations

import sys

import pytest
import torch
import triton
import triton.language as tl

from bi_props.targets import triton_compat as tc
from conftest import PLANTED

sys.path.insert(0, str(PLANTED))
from planted_m_dependent_triton import launch


@pytest.fixture(autouse=True)
def clean_patches():
    tc.remove()
    yield
    tc.remove()


@triton.jit
def _sum_kernel(x_ptr, out_ptr, N: tl.constexpr):
    x = tl.load(x_ptr + tl.arange(0, N))
    total = tl.sum(x, axis=0, keep_dims=True)
    tl.store(out_ptr + tl.arange(0, 1), total)


@triton.jit
def _cast_kernel(x_ptr, out_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs).to(tl.bfloat16))


@triton.jit
def _add_kernel(x_ptr, y_ptr, out_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs) + tl.load(y_ptr + offs))


@triton.jit
def _arange_kernel(out_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    tl.store(out_ptr + offs, offs)


@triton.jit
def _row_sums_kernel(x_ptr, out_ptr, R, K: tl.constexpr, BLOCK_R: tl.constexpr):
    """Row sums of a row-major (R, K) matrix, BLOCK_R rows per program, reduced along axis 0 of a
    (K, BLOCK_R) tile (the rows as columns): a kernel whose BLOCK_R follows R."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    ks = tl.arange(0, K)
    tile = tl.load(x_ptr + rows[None, :] * K + ks[:, None], mask=rows[None, :] < R, other=0.0)
    tl.store(out_ptr + rows, tl.sum(tile, axis=0), mask=rows < R)


def _row_sums(x: torch.Tensor, block_r: int) -> torch.Tensor:
    out = torch.empty(x.shape[0], dtype=x.dtype)
    _row_sums_kernel[(triton.cdiv(x.shape[0], block_r),)](x, out, x.shape[0], x.shape[1], block_r)
    return out


def _bf16_operands():
    g = torch.Generator().manual_seed(0)
    a = torch.randn(16, 32, generator=g).bfloat16()
    b = torch.randn(32, 16, generator=g).bfloat16()
    return a, b


def test_bf16_dot_multiplies_values_not_bit_patterns():
    a, b = _bf16_operands()
    ref = a.double() @ b.double()
    # the final cast truncates without rtne_cast: up to one bf16 ulp (2^-7 relative), plus fp32
    # accumulation error
    bound = 2.0**-7 * ref.abs() + 2.0**-20 * (a.double().abs() @ b.double().abs())
    raw = launch(a, b, 16, 16).double()
    assert ((raw - ref).abs() > bound).any(), "triton#11584 no longer reproduces: drop bf16_dot?"
    tc.apply(["bf16_dot"])
    fixed = launch(a, b, 16, 16).double()
    assert ((fixed - ref).abs() <= bound).all(), (fixed - ref).abs().max()


def test_bf16_sum_sums_values_not_bit_patterns():
    x = torch.linspace(-3, 5, 64).bfloat16()
    out = torch.empty(1, dtype=torch.bfloat16)
    _sum_kernel[(1,)](x, out, 64)
    want = x.double().sum().bfloat16()
    assert out.item() != want.item(), "triton#11604 no longer reproduces: drop bf16_sum?"
    tc.apply(["bf16_sum"])
    _sum_kernel[(1,)](x, out, 64)
    assert out.item() == want.item(), (out.item(), want.item())


def test_bf16_arith_adds_values():
    x = torch.linspace(-3, 5, 16).bfloat16()
    y = torch.linspace(1, 2, 16).bfloat16()
    out = torch.empty(16, dtype=torch.bfloat16)
    _add_kernel[(1,)](x, y, out, 16)
    assert not torch.equal(out, x + y)
    tc.apply(["bf16_arith"])
    _add_kernel[(1,)](x, y, out, 16)
    assert torch.equal(out, x + y), (out, x + y)


def test_rtne_cast_rounds_like_torch():
    x = (torch.arange(64, dtype=torch.float32) + 1) / 3 + 100
    out = torch.empty(64, dtype=torch.bfloat16)
    _cast_kernel[(1,)](x, out, 64)
    assert not torch.equal(out, x.bfloat16()), "the interpreter rounds now: drop rtne_cast?"
    tc.apply(["rtne_cast"])
    _cast_kernel[(1,)](x, out, 64)
    assert torch.equal(out, x.bfloat16())


def test_ordered_dot_makes_a_row_independent_of_block_m():
    g = torch.Generator().manual_seed(1)
    a = torch.randn(128, 64, generator=g)
    b = torch.randn(64, 16, generator=g)
    tc.apply(["ordered_dot"])
    for rows in (1, 5, 17):
        alone = launch(a[:rows], b, 16, 16)
        inside = launch(a, b, 128, 16)
        assert torch.equal(alone, inside[:rows]), rows
    # a BLOCK_K change is a real change of the reduction order and stays visible
    assert not torch.equal(launch(a, b, 16, 16), launch(a, b, 16, 32))


def test_ordered_dot_is_needed_where_block_m_follows_m():
    """Without ordered_dot the interpreter's tl.dot is numpy.matmul, i.e. BLAS: a 1-row operand
    takes the gemv path, a 16-row one gemm, and the same row comes out different (OpenBLAS
    0.3.x on x86-64). A kernel whose BLOCK_M follows M (1 row alone, 16 in a batch) would show
    batch variance no GPU shows. With the patch the row's k-sum order is fixed by K alone."""
    g = torch.Generator().manual_seed(2)
    a = torch.randn(16, 128, generator=g)
    b = torch.randn(128, 16, generator=g)
    alone, inside = launch(a[:1], b, 1, 64), launch(a, b, 16, 64)[:1]
    assert not torch.equal(alone, inside), (
        "numpy.matmul is row-count independent here: drop ordered_dot?"
    )
    tc.apply(["ordered_dot"])
    assert torch.equal(launch(a[:1], b, 1, 64), launch(a, b, 16, 64)[:1])


def test_ordered_sum_is_needed_where_block_r_follows_r():
    """Without ordered_sum the interpreter's tl.sum is numpy.sum on the tile as laid out: along
    axis 0 of a (K, 1) tile numpy sums pairwise, of a (K, 16) tile one row after another, so a
    row's sum depends on how many rows share its tile. With the patch the reduction runs along a
    contiguous copy of the axis: one order per K."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(16, 1024, generator=g)
    assert not torch.equal(_row_sums(x[:1], 1), _row_sums(x, 16)[:1]), (
        "numpy.sum is layout independent here: drop ordered_sum?"
    )
    tc.apply(["ordered_sum"])
    assert torch.equal(_row_sums(x[:1], 1), _row_sums(x, 16)[:1])
    assert torch.equal(_row_sums(x, 1), _row_sums(x, 16))


def test_relaxed_block_shape_only_when_asked():
    out = torch.zeros(24, dtype=torch.int32)
    with pytest.raises(Exception, match="power of 2"):
        _arange_kernel[(1,)](out, 24)
    tc.apply(["relaxed_block_shape"])
    _arange_kernel[(1,)](out, 24)
    assert torch.equal(out, torch.arange(24, dtype=torch.int32))
    tc.remove(["relaxed_block_shape"])
    with pytest.raises(Exception, match="power of 2"):
        _arange_kernel[(1,)](out, 24)


def test_apply_and_remove_restore_triton():
    from triton.runtime import interpreter

    originals = (interpreter.InterpreterBuilder.create_dot, interpreter.ReduceOps.sum)
    assert tc.apply(tc.DEFAULT) == tc.DEFAULT
    assert interpreter.InterpreterBuilder.create_dot is not originals[0]
    tc.remove(["bf16_dot"])  # the dot wrapper stays for ordered_dot
    assert tc.active() == tuple(n for n in tc.DEFAULT if n != "bf16_dot")
    assert interpreter.InterpreterBuilder.create_dot is not originals[0]
    tc.remove()
    assert (interpreter.InterpreterBuilder.create_dot, interpreter.ReduceOps.sum) == originals
    env = tc.environment()
    assert env["triton_interpret"] is True and env["triton"] == triton.__version__
