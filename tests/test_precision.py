"""Declared internal precision and the reference check, through real workers: precision-losing
planted libraries (batch-invariant and deterministic, so only ``reference`` can see them) are
caught at the sizes real models use, while the correct planted library and the built-in CPU target
(both switch states) pass the same cases. The declaration travels in the hello and the verdict
states its ulps."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from bi_props.model import properties
from bi_props.model.case import Case
from bi_props.runner.controller import Runner

pytestmark = pytest.mark.slow

PLANTED = Path(__file__).resolve().parent / "planted"


@pytest.fixture(autouse=True)
def planted_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    paths = [str(PLANTED), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, paths)))


@contextmanager
def running(target: str) -> Iterator[Runner]:
    runner = Runner(target, start_timeout_s=120)
    try:
        yield runner
    finally:
        runner.close()


def mm_case(dtype: str, k: int, seed: int = 0) -> Case:
    return Case("mm", "torch.mm", dtype, (4, k, 16), ("contiguous",) * 2, "general", seed)


def judge(runner: Runner, case: Case, switch: str = "enabled") -> properties.Verdict:
    return properties.reference(runner.observe("reference", case, switch))


CAUGHT = [
    ("planted_tf32", "float32", 4096),
    ("planted_bf16_intermediate", "bfloat16", 256),
    ("planted_bf16_intermediate", "bfloat16", 4096),
    ("planted_bf16_intermediate", "float16", 4096),
]


@pytest.mark.parametrize(("target", "dtype", "k"), CAUGHT)
def test_precision_losing_kernel_fails_reference(target, dtype, k):
    with running(target) as runner:
        assert runner.hello("enabled").precision["mm"] == "float32"
        verdict = judge(runner, mm_case(dtype, k))
        assert not verdict.ok, f"{target} passed reference at {dtype}, K = {k}"
        assert "Mismatched elements" in verdict.message
        assert "within the stated bound (float32 internals)" in verdict.message
        assert verdict.ulps_observed is not None and verdict.ulps_allowed is not None
        assert verdict.ulps_observed > verdict.ulps_allowed
        # the same kernel with the switch off is stock torch: it passes
        assert judge(runner, mm_case(dtype, k), "disabled").ok


@pytest.mark.parametrize("target", ["planted_correct", "cpu"])
def test_correct_kernels_pass_the_same_cases(target):
    with running(target) as runner:
        for switch in ("enabled", "disabled"):
            for _, dtype, k in CAUGHT:
                verdict = judge(runner, mm_case(dtype, k, seed=1), switch)
                assert verdict.ok, f"{target} [{switch}] {dtype} K={k}:\n{verdict.message}"
                assert verdict.ulps_allowed is not None and verdict.ulps_allowed > 0
                assert verdict.ulps_observed <= verdict.ulps_allowed


def test_precision_declarations_travel_in_the_hello():
    with running("cpu") as runner:
        enabled, disabled = runner.hello("enabled"), runner.hello("disabled")
        assert set(enabled.precision.values()) == {"float32"}
        assert disabled.precision["log_softmax"] == "output"
        assert disabled.precision["mm"] == "float32"
        assert "probe_model" not in enabled.precision


def test_stock_sixteen_bit_sum_split_between_threads_is_declared():
    """bi-props fuzz found it (2026-12-04, `sum reference [disabled]`): stock CPU bf16 `sum` of a
    whole tensor split between two threads rounds each thread's float32 partial to bf16, so
    exact integers summing to -693 gave -696 (bit-exact check: 1 ulp off) where one thread gives
    -692. Stock `sum` declares `output` precision: the same case is judged within the bound of
    16-bit partials (and still fails when the kernel is declared float32)."""
    import numpy as np
    import torch

    from bi_props.catalogue import OPS
    from bi_props.execution import materialize as M
    from bi_props.model.compare import compare_to_reference, round_to_bits
    from bi_props.targets.cpu import stock_precision

    case = Case(
        "sum",
        "torch.sum",
        "bfloat16",
        (219, 5, 52),
        ("contiguous",),
        "exact",
        0,
        {"dim": None, "dtype": None},
    )
    (x,) = M.operands(case, M.needle(case), "cpu")
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        got = x.sum()
    finally:
        torch.set_num_threads(threads)
    bits = round_to_bits(np.asarray(got.double().numpy()), "bfloat16")
    inputs = [M.to_float64(x)]
    assert stock_precision("sum") == "output"
    (declared,) = OPS["sum"].references(inputs, case, [219], stock_precision("sum"))
    assert compare_to_reference(bits, declared.value, declared.tolerance, "bfloat16", "x") is None
    (as_float32,) = OPS["sum"].references(inputs, case, [219], "float32")
    assert float(got) == -696.0  # the split partials' rounding (1 thread: -692, correct)
    assert compare_to_reference(bits, as_float32.value, as_float32.tolerance, "bfloat16", "x")
