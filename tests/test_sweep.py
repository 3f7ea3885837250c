"""The exhaustive 16-bit sweep: its cases hold every bit pattern exactly, the stock
elementwise ops pass it, a kernel wrong on one rare bf16 pattern fails it and is halved to that
single pattern (a normal case), while random examples of the same op miss it; the report shows
each sweep."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings

from bi_props.campaigns.sweep import SHAPE, halve, run_sweeps, sweep_cases
from bi_props.catalogue import OPS
from bi_props.catalogue.strategies import cases
from bi_props.execution import materialize as M
from bi_props.execution.execute import observe
from bi_props.model import properties
from bi_props.model.case import BIT_PATTERNS, PATTERNS, Case, parse_case
from bi_props.model.space import load_profile, parse
from bi_props.reporting.markdown import _sweeps
from bi_props.targets.base import Target

sys.path.insert(0, str(Path(__file__).parent / "planted"))
import planted_rare_pattern

CPU = load_profile("cpu")


class _Stock(Target):
    def activate(self) -> None:
        pass


@dataclass
class InProcess:
    """What the sweep needs of a Session, judged in this process (the switch is whatever F.silu
    is now): judge, entries, space and the sweep records; check/finalize record findings."""

    space: object = CPU
    sweeps: list = field(default_factory=list)
    swept: set = field(default_factory=set)
    judged: int = 0
    findings: list = field(default_factory=list)
    last_failure: object = None

    def entries(self, op):
        return None

    def judge(self, op, prop, switch, case):
        self.judged += 1
        return properties.reference(observe(prop, case, _Stock(), switch))

    def check(self, op, prop, switch, case):
        verdict = self.judge(op, prop, switch, case)
        if not verdict.ok:
            self.last_failure = (op, prop, switch, case)
            raise AssertionError(verdict.message)

    def recorded(self, failure):
        return failure in self.findings

    def finalize(self, failure, shrink="complete"):
        self.findings.append(failure)


def sweep_case(op: str, dtype: str, **options) -> Case:
    spec = OPS[op]
    entry = spec.entries[0]
    return Case(op, entry, dtype, SHAPE, ("contiguous",), BIT_PATTERNS, 0, options)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_sweep_case_holds_every_bit_pattern_exactly(dtype: str) -> None:
    (x,) = M.operands(sweep_case("silu", dtype), [(0, 256)], "cpu")
    bits = x.reshape(-1).view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(np.sort(bits), np.arange(PATTERNS, dtype=np.uint16))
    assert int(x.isnan().sum()) == (254 if dtype == "bfloat16" else 2046)  # every NaN payload
    (gated,) = M.operands(sweep_case("silu_and_mul", dtype), [(0, 256)], "cpu")
    assert tuple(gated.shape) == (256, 512)
    same = torch.equal(gated[:, :256].contiguous().view(torch.int16), x.view(torch.int16))
    assert same and bool((gated[:, 256:] == 1.0).all())
    one = Case("silu", "F.silu", dtype, (1, 1), ("contiguous",), BIT_PATTERNS, 0x4B80)
    (single,) = M.operands(one, [(0x4B80, 1)], "cpu")
    assert int(single.view(torch.int16).reshape(-1)[0]) & 0xFFFF == 0x4B80
    assert parse_case(repr(one)) == one


@pytest.mark.parametrize("op", ["silu", "silu_and_mul", "gelu_and_mul"])
def test_stock_elementwise_ops_pass_every_pattern(op: str) -> None:
    session = InProcess()
    run_sweeps(session, op, "disabled")
    expected = 2 * (2 if op == "gelu_and_mul" else 1)  # dtypes x option choices
    assert len(session.sweeps) == expected and all(s["ok"] for s in session.sweeps), session.sweeps
    assert all(s["patterns"] == PATTERNS for s in session.sweeps)
    assert session.findings == []
    run_sweeps(session, op, "disabled")  # once per campaign and switch state
    assert len(session.sweeps) == expected


def test_the_rare_pattern_kernel_is_found_and_halved_to_its_pattern(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(F, "silu", planted_rare_pattern.silu)
    session = InProcess()
    run_sweeps(session, "silu", "enabled")
    failed = [s for s in session.sweeps if not s["ok"]]
    assert [(s["dtype"], s["failing_pattern"]) for s in failed] == [("bfloat16", "0x4b80")]
    [(op, prop, switch, case)] = session.findings
    assert (op, prop, switch) == ("silu", "reference", "enabled")
    assert (case.shape, case.seed, case.values) == ((1, 1), 0x4B80, BIT_PATTERNS)
    assert session.judged <= 2 + 2 * 16 + 1  # two sweeps, two halves a level, the check
    # halving any failing range ends on the pattern
    start = Case("silu", "F.silu", "bfloat16", (3, 100), ("contiguous",), BIT_PATTERNS, 0x4B00)
    assert halve(session, "silu", "enabled", start).seed == 0x4B80


def test_random_examples_miss_the_rare_pattern(monkeypatch: pytest.MonkeyPatch) -> None:
    """The same kernel, 300 random reference examples of silu in bfloat16 (every value class):
    none fails, while the sweep's one example does (above)."""
    monkeypatch.setattr(F, "silu", planted_rare_pattern.silu)
    space = parse({"dtypes": {"choices": ["bfloat16"]}}, "bf16.toml", "bf16")
    seen: list[int] = []

    @settings(max_examples=300, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(cases(space, "silu", "reference"))
    def random_draw(case: Case) -> None:
        seen.append(case.shape[0] * case.shape[1])
        assert properties.reference(observe("reference", case, _Stock(), "enabled")).ok

    random_draw()
    assert sum(seen) > PATTERNS  # more elements than the sweep checks, and not one hit


def test_sweeps_follow_the_space() -> None:
    assert len(sweep_cases(InProcess(), "gelu_and_mul")) == 4  # 2 dtypes x 2 approximations
    assert sweep_cases(InProcess(), "rms_norm") == []  # not elementwise
    bf16 = parse({"dtypes": {"choices": ["bfloat16", "float32"]}}, "a.toml", "a")
    assert [c.dtype for c in sweep_cases(InProcess(space=bf16), "silu")] == ["bfloat16"]
    off = parse({"values": {"exhaustive": False}}, "off.toml", "off")
    assert off.exhaustive is False and sweep_cases(InProcess(space=off), "silu") == []


def test_report_md_shows_each_sweep() -> None:
    entries = [
        {"op": "silu", "switch": "enabled", "dtype": "bfloat16", "options": {}, "patterns": 65536,
         "ok": False, "failing_pattern": "0x4b80", "ulps_observed": 3, "ulps_allowed": 1.5},
        {"op": "silu", "switch": "enabled", "dtype": "float16", "options": {}, "patterns": 65536,
         "ok": True, "ulps_observed": 1, "ulps_allowed": 1024.0},
    ]  # fmt: skip
    text = "\n".join(_sweeps({"target": "t", "sweeps": entries}))
    assert (
        "| t | silu | enabled | bfloat16 | - | 65536 | **FAILS** at pattern 0x4b80 | 3 / 1.5 |"
        in text
    )
    assert "| t | silu | enabled | float16 | - | 65536 | all within the bound | 1 / 1024 |" in text
    assert _sweeps({"sweeps": []}) == []
