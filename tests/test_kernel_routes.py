"""The CPU target's kernels are declared one record each (targets/kernels/route.py), beside the
kernel; register.py derives the custom ops, aten overrides, swapped composites and routes from
them. Checked without installing anything (install() is one-way for a process)."""

from __future__ import annotations

import torch

import bi_props.catalogue  # noqa: F401  (registers the ops)
import bi_props.ops as stock_ops
from bi_props.model.op_registry import OPS
from bi_props.targets.kernels.register import KERNELS, ROUTES, SWAPPED_OPS, kernel_routes


def test_each_kernel_is_one_record_with_a_unique_custom_op() -> None:
    names = [route.name for route in KERNELS]
    assert len(names) == len(set(names)), names
    assert kernel_routes() == KERNELS  # every kernel module's ROUTES, found without a table
    for route in KERNELS:
        assert route.schema.startswith(route.name + "(") and callable(route.kernel)
        assert route.ops, route.name  # each kernel is some catalogue op's routing evidence
        assert route.aten or route.composite, f"{route.name} replaces nothing"


def test_routes_name_catalogue_ops_and_real_aten_overloads() -> None:
    assert set(ROUTES) <= set(OPS), set(ROUTES) - set(OPS)
    assert ROUTES["linear"] == tuple(
        f"bi_props_cpu::{n}" for n in ("mm", "addmm", "bmm", "mv")
    )  # linear reaches whichever product kernel its shape takes
    for route in KERNELS:
        for overload in route.aten:
            packet, _, name = overload.partition(".")
            assert hasattr(getattr(torch.ops.aten, packet), name or "default"), overload


def test_swapped_composites_exist_and_keep_their_names() -> None:
    class _Ns:
        def __getattr__(self, name):
            return lambda *args, **kwargs: (name, args, kwargs)

    for op, composite in SWAPPED_OPS.items():
        assert callable(getattr(stock_ops, composite)), composite
        route = next(r for r in KERNELS if r.composite == composite)
        fn = route.composite_function(_Ns())
        assert fn.__name__ == composite and op in route.ops
    attention = next(r for r in KERNELS if r.composite == "varlen_attention")
    assert attention.composite_function(_Ns())(1, 2, scale=3) == (
        "varlen_attention",
        (1, 2),
        {"scale": 3},
    )
