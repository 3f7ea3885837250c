"""Parity over every dtype the stock op accepts.

Every space drew float32, bfloat16 and float16 only, so a batch-invariant kernel that handles
fewer dtypes than the stock op it replaces (a config table with three entries) broke the contract
unseen: with the switch on, a float64 or integer call raised. Parity now draws
``PARITY_DTYPES`` in one example of ``PARITY_EXTRA_EVERY``; the built-in CPU target hands those
dtypes to the stock kernels it replaced, so it keeps parity there.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from bi_props.campaigns.fuzz import Cell, run_slice
from bi_props.campaigns.session import Session
from bi_props.catalogue.strategies import cases
from bi_props.model import properties
from bi_props.model.case import DTYPES, PARITY_DTYPES, PARITY_EXTRA_EVERY
from bi_props.model.space import SpaceError, load_profile, parse
from bi_props.runner.controller import Runner

PLANTED = str(Path(__file__).resolve().parent / "planted")


def _space(**dtypes):
    return parse(
        {
            "ops": {"include": ["mm"]},
            "dtypes": {"choices": ["float32"], **dtypes},
            "shapes": {"rows": {"min": 1, "max": 4}, "dim": {"min": 1, "max": 8}},
            "runner": {"example_timeout_s": 30, "start_timeout_s": 120},
        },
        "test",
        "test",
    )


def _cases(space, op: str, prop: str, n: int):
    seen = []

    @settings(max_examples=n, database=None, derandomize=True, deadline=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(cases(space, op, prop))
    def draw(case) -> None:
        seen.append(case)

    draw()
    return seen


def _drawn(space, prop: str, n: int = 400) -> list[str]:
    return [case.dtype for case in _cases(space, "mm", prop, n)]


def test_parity_draws_the_extra_dtypes_at_the_stated_rate_and_no_other_property_does():
    assert 4 <= PARITY_EXTRA_EVERY <= 16  # a small share: the cost stays small
    parity = _drawn(_space(), "parity")
    extra = [d for d in parity if d not in DTYPES]
    assert set(extra) == set(PARITY_DTYPES), sorted(set(parity))
    assert 0.5 / PARITY_EXTRA_EVERY <= len(extra) / len(parity) <= 2.5 / PARITY_EXTRA_EVERY
    assert set(_drawn(_space(), "batch_invariance", 100)) == {"float32"}
    assert set(_drawn(_space(), "reference", 100)) == {"float32"}


def test_the_space_names_or_turns_off_the_extra_dtypes():
    assert _space(parity=[]).parity_dtypes == ()
    assert set(_drawn(_space(parity=[]), "parity", 100)) == {"float32"}
    assert _space(parity=["int32"]).parity_dtypes == ("int32",)
    with pytest.raises(SpaceError, match=r"key 'dtypes.parity': unknown \['int7'\]"):
        _space(parity=["int7"])


def test_a_kernel_with_a_three_dtype_table_is_a_parity_finding(monkeypatch) -> None:
    """tests/planted/planted_dtype_table.py: correct on the three float dtypes, a KeyError on
    float64 and integers with the switch on; the finding shrinks to float64 (the first extra)."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([PLANTED, os.environ.get("PYTHONPATH", "")]))
    session = Session("planted_dtype_table", _space())
    try:
        run_slice(session, Cell("mm", "parity", "both"), 20 * PARITY_EXTRA_EVERY, None, seed=1)
    finally:
        session.close()
    errors = [f for f in session.findings if f.kind == "error"]
    assert errors and all(f.error_type == "KeyError" for f in errors), session.findings
    finding = errors[0]
    assert (finding.op, finding.property, finding.kind) == ("mm", "parity", "error")
    # float64, the first dtype beyond the three, tried as an explicit example before any draw
    assert "dtype='float64'" in finding.case, finding.case
    # each other dtype is a class of its own, recorded as the same failure (one root cause)
    for other in errors[1:]:
        assert other.shrink.startswith("not shrunk again: the same failure as"), other


def test_the_cpu_target_keeps_parity_on_every_extra_dtype():
    """Before, 45 of 144 such examples broke parity on the CPU target: an integer softmax raised
    RuntimeError where stock raises NotImplementedError, an integer rms_norm returned where stock
    raises, a complex silu_and_mul raised where stock returns, fused_moe refused integers."""
    space = load_profile("cpu")
    runner = Runner("cpu", start_timeout_s=120)
    broken = []
    try:
        for op in space.ops:
            drawn = _cases(space, op, "parity", len(PARITY_DTYPES))
            for dtype, case in zip(PARITY_DTYPES, drawn, strict=False):
                case = dataclasses.replace(case, dtype=dtype)
                verdict = properties.parity(
                    runner.observe("parity", case, "enabled"),
                    runner.observe("parity", case, "disabled"),
                )
                if not verdict.ok:
                    broken.append(f"{op} {dtype}: {verdict.message}")
    finally:
        runner.close()
    assert not broken, "\n".join(broken)
