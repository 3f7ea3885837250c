"""Batch-invariant mm, addmm, bmm and mv (same contracts as the aten ops they replace; aten::dot
is routed to mv, register.py).

All of them reduce to ``matmul_tree``/``tree_sum``: correctly rounded products, then a pairwise
tree over K whose shape depends on K alone.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .primitives import compute_dtype, matmul_tree, tree_sum
from .route import KernelRoute


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _check_same_dtype(a: Tensor, b: Tensor, what: str) -> None:
    torch._check(
        a.dtype == b.dtype,
        lambda: (
            f"expected {what} to have the same dtype, but got: "
            f"{_dtype_name(a.dtype)} != {_dtype_name(b.dtype)}"
        ),
    )


def _check_mm(mat1: Tensor, mat2: Tensor) -> None:
    torch._check(mat1.dim() == 2, lambda: "self must be a matrix")
    torch._check(mat2.dim() == 2, lambda: "mat2 must be a matrix")
    torch._check(
        mat1.shape[1] == mat2.shape[0],
        lambda: (
            f"mat1 and mat2 shapes cannot be multiplied ({mat1.shape[0]}x{mat1.shape[1]} "
            f"and {mat2.shape[0]}x{mat2.shape[1]})"
        ),
    )
    _check_same_dtype(mat1, mat2, "m1 and m2")


def _product(mat1: Tensor, mat2: Tensor) -> Tensor:
    """mat1 @ mat2 (2-D) in the compute dtype."""
    cd = compute_dtype(mat1.dtype)
    return matmul_tree(mat1.to(cd)[None], mat2.to(cd)[None])[0]


@torch.no_grad()
def mm(self: Tensor, mat2: Tensor) -> Tensor:
    """Batch-invariant ``aten::mm``.

    Output (i, j) is a pairwise tree over K of correctly rounded fp32 products of row i and column
    j, rounded once to the output dtype; nothing in that computation depends on M or on the other
    rows, and the row chunking only groups independent rows.
    """
    _check_mm(self, mat2)
    return _product(self, mat2).to(self.dtype)


@torch.no_grad()
def addmm(
    self: Tensor, mat1: Tensor, mat2: Tensor, *, beta: complex = 1, alpha: complex = 1
) -> Tensor:
    """Batch-invariant ``aten::addmm``: beta * self + alpha * (mat1 @ mat2).

    The product is ``mm``'s per-element tree; scaling and the bias add are single correctly rounded
    elementwise operations on the broadcast bias, so row i still depends only on row i of mat1
    (and the shared operands). beta == 0 ignores self entirely (NaN in it does not propagate).
    """
    _check_mm(mat1, mat2)
    _check_same_dtype(self, mat1, "self and mat2")
    shape = (mat1.shape[0], mat2.shape[1])
    bias = self.expand(shape)  # raises the stock RuntimeError for a non-broadcastable self
    out = _product(mat1, mat2)
    if alpha != 1:
        out = out * alpha
    if beta != 0:
        bias = bias.to(out.dtype)
        out = out + (bias if beta == 1 else bias * beta)
    return out.to(mat1.dtype)


@torch.no_grad()
def bmm(self: Tensor, mat2: Tensor) -> Tensor:
    """Batch-invariant ``aten::bmm``.

    Each output element is a tree over K of correctly rounded products within its own batch
    entry; neither the batch count nor M enter that computation, and chunking over batches and
    rows only groups independent elements.
    """
    torch._check(self.dim() == 3, lambda: "batch1 must be a 3D tensor")
    torch._check(mat2.dim() == 3, lambda: "batch2 must be a 3D tensor")
    torch._check(
        self.shape[0] == mat2.shape[0] and self.shape[2] == mat2.shape[1],
        lambda: (
            "Expected size for first two dimensions of batch2 tensor to be: "
            f"[{self.shape[0]}, {self.shape[2]}] but got: [{mat2.shape[0]}, {mat2.shape[1]}]."
        ),
    )
    _check_same_dtype(self, mat2, "batch1 and batch2")
    cd = compute_dtype(self.dtype)
    return matmul_tree(self.to(cd), mat2.to(cd)).to(self.dtype)


@torch.no_grad()
def mv(self: Tensor, vec: Tensor) -> Tensor:
    """Batch-invariant ``aten::mv``.

    Output i is a pairwise tree over K of the correctly rounded products self[i, k] * vec[k];
    the tree depends on K only, so the number of rows cannot change any element.
    """
    torch._check(
        self.dim() == 2 and vec.dim() == 1,
        lambda: f"vector + matrix @ vector expected, got 1, {self.dim()}, {vec.dim()}",
    )
    torch._check(
        self.shape[1] == vec.shape[0],
        lambda: (
            f"size mismatch, got input ({self.shape[0]}), mat ({self.shape[0]}x"
            f"{self.shape[1]}), vec ({vec.shape[0]})"
        ),
    )
    _check_same_dtype(self, vec, "mat and vec")
    cd = compute_dtype(self.dtype)
    return tree_sum(self.to(cd) * vec.to(cd)[None, :], 1).to(self.dtype)


ROUTES = (
    KernelRoute(
        "mm(Tensor self, Tensor mat2) -> Tensor",
        mm,
        ops=("mm", "matmul", "linear"),
        aten={"mm": lambda ns: lambda self, mat2: ns.mm(self, mat2)},
        all_dtypes=True,
    ),
    KernelRoute(
        "addmm(Tensor self, Tensor mat1, Tensor mat2, *, Scalar beta=1, Scalar alpha=1) -> Tensor",
        addmm,
        ops=("addmm", "linear"),
        aten={
            "addmm": lambda ns: (
                lambda self, mat1, mat2, *, beta=1, alpha=1: ns.addmm(
                    self, mat1, mat2, beta=beta, alpha=alpha
                )
            )
        },
        all_dtypes=True,
    ),
    KernelRoute(
        "bmm(Tensor self, Tensor mat2) -> Tensor",
        bmm,
        ops=("bmm", "matmul", "linear"),
        aten={"bmm": lambda ns: lambda self, mat2: ns.bmm(self, mat2)},
        all_dtypes=True,
    ),
    KernelRoute(
        "mv(Tensor self, Tensor vec) -> Tensor",
        mv,
        ops=("matmul", "linear"),  # vector @ vector (aten::dot) goes to mv too
        aten={
            "mv": lambda ns: lambda self, vec: ns.mv(self, vec),
            "dot": lambda ns: lambda self, tensor: ns.mv(self.unsqueeze(0), tensor).reshape(()),
        },
        all_dtypes=True,
    ),
)
"""The kernels of this module and how the switch routes to them (route.py)."""
