"""Controls that see: a control searches only where reduction order can show,
tries its op's explicit examples first, and says "not applicable" only on the evidence of its
whole quota; a control cut short stays "blind"."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bi_props.campaigns.session import Session
from bi_props.catalogue.strategies import control_cases, control_space
from bi_props.model.op_registry import OPS
from bi_props.model.properties import Verdict
from bi_props.model.space import Extent, parse
from bi_props.reporting.data import blind_controls, control_seen_cell, inapplicable_controls


def _space(**runner):
    runner.setdefault("power_examples", 0)  # the search alone (the probe: test_power.py)
    return parse({"ops": {"include": ["mm", "sum"]}, "runner": runner}, "test", "test")


def test_the_control_space_keeps_only_order_sensitive_values_and_extents_of_two_or_more():
    space = control_space(_space())
    assert set(space.values) == {"general", "wide"}
    assert space.dim.min >= 2
    assert control_space(parse({"shapes": {"dim": {"min": 0, "max": 1}}}, "t", "t")).dim == Extent(
        2, 2
    )


@settings(max_examples=150, deadline=None, database=None)
@given(data=st.data())
def test_a_control_never_draws_a_case_that_cannot_show_reduction_order(data):
    """On the parent commit 35% of mm control draws were ``exact`` and others had K <= 1 or
    N = 0: half of the control's budget could never see variance."""
    case = data.draw(control_cases(_space(), "mm", "batch_invariance"))
    assert case.values in ("general", "wide"), case
    _m, k, n = case.shape
    assert k >= 2 and n >= 2, case
    assert case.batch is not None and case.batch.companions


def _session(verdicts: list[Verdict], **runner) -> tuple[Session, list]:
    session = Session("cpu", _space(**runner))
    seen: list = []

    def observe(prop, case, switch):
        seen.append(case)
        return verdicts[min(len(seen), len(verdicts)) - 1]

    session.runner.observe = observe
    return session, seen


def _judged_by(monkeypatch, ok: bool):
    from dataclasses import replace

    from bi_props.model import property_spec

    spec = property_spec.get("batch_invariance")
    monkeypatch.setattr(
        property_spec, "get", lambda name: replace(spec, judge=lambda observation: Verdict(ok))
    )


def test_the_ops_explicit_example_is_tried_first_and_needs_no_shrink(monkeypatch):
    _judged_by(monkeypatch, False)
    session, seen = _session([Verdict(False, "varies")])
    control = session.control("mm", "batch_invariance", seed=1)
    # each explicit example in each dtype of the space (float32 first), nothing drawn
    assert control.variance_seen and control.explicit == 3 and control.examples == 3, control
    assert control.shrink.startswith("not needed: an explicit control example"), control
    assert [c.dtype for c in seen] == ["float32", "bfloat16", "float16"]
    example = OPS["mm"].control_examples[0]
    for case in seen:
        assert case.shape == example.shape and case.values == "general"
        assert [c.rows for c in case.batch.companions] == list(example.companions)
    assert control.case == repr(seen[0])  # the float32 one: the smallest, and the first
    # every one of them is a known batch-variant case for the enabled cells
    assert control.variant_cases == 3 and len(session.variants["mm"]) == 3


def test_a_control_that_spent_its_quota_is_not_applicable_not_blind(monkeypatch):
    _judged_by(monkeypatch, True)
    session, seen = _session([Verdict(True)], control_examples=12)
    control = session.control("sum", "batch_invariance", seed=1)
    assert control.state == "done" and control.applicable is False, control
    # its quota, then the targeted probes (a 1-row needle beside 15, 16, 255 rows, widths at
    # vector tails, contiguous and transposed) before "not applicable"
    assert control.examples == 12 and len(seen) == 12 + control.targeted, (control, len(seen))
    assert control.targeted == control.targeted_judged == 72
    assert control.explicit == 3  # sum's one explicit example in each of the three dtypes
    assert "p < " in control.message and "targeted probes" in control.message
    assert control.message.startswith("stock kernel invariant here: control not applicable")
    report = {"controls": [vars(control)]}
    assert blind_controls(report) == [] and inapplicable_controls(report) == [vars(control)]
    assert control_seen_cell(vars(control)) == "not applicable (stock invariant here)"


def test_a_control_cut_short_is_blind_and_says_how_far_it_got(monkeypatch):
    _judged_by(monkeypatch, True)
    session, _ = _session([Verdict(True)], control_examples=40)
    control = session.control("sum", "batch_invariance", examples=5, seed=1)
    assert control.state == "searching" and control.applicable is None, control
    assert "of 40 examples" in control.message
    report = {"controls": [vars(control)]}
    assert blind_controls(report) == [vars(control)] and control_seen_cell(vars(control)) == (
        "NO (blind)"
    )


def test_a_quota_of_degenerate_examples_is_blind_not_evidence_of_invariance(monkeypatch):
    """Every example compared nothing (or both calls raised the same error): that is no
    evidence that stock is invariant, so the control stays blind."""
    from dataclasses import replace

    from bi_props.model import property_spec

    spec = property_spec.get("batch_invariance")
    empty = Verdict(True, compared=0, degenerate="zero elements")
    monkeypatch.setattr(property_spec, "get", lambda name: replace(spec, judge=lambda o: empty))
    session, _ = _session([empty], control_examples=6)
    control = session.control("sum", "batch_invariance", seed=1)
    assert control.state == "done" and control.applicable is None and control.judged == 0
    assert "blind, not evidence" in control.message, control
    assert blind_controls({"controls": [vars(control)]}) == [vars(control)]


def test_every_op_with_explicit_control_examples_shows_stock_cpu_variance_in_one():
    """The explicit examples are stated as known to show stock batch variance on some platform:
    on stock CPU PyTorch (torch 2.13, the switch off) at least one of each op's does, through a
    real worker, so a control that tries them is never blind on this machine (README command 1
    left the bmm control blind after 72 drawn examples before bmm had one: the needle alone,
    n = 1, K = 512). One per op, not each: where a vector tail falls depends on the CPU's
    vector width (silu_and_mul's AVX-512 example is invariant with AVX2 only, and the other way
    round), and the control stops at the first example that shows variance."""
    from types import SimpleNamespace

    from bi_props.campaigns.explicit import explicit_cases
    from bi_props.model import properties
    from bi_props.runner.controller import Runner

    ops = [name for name, spec in OPS.items() if spec.control_examples]
    assert {"mm", "matmul", "addmm", "linear", "bmm", "sum", "mean", "rms_norm", "silu"} <= set(ops)
    assert {"fused_add_rms_norm", "attention", "paged_decode_attention", "fused_moe"} <= set(ops)
    runner = Runner("cpu", start_timeout_s=120)
    try:
        blind = {}
        for op in ops:
            verdicts = []
            for case in explicit_cases(SimpleNamespace(entries=lambda op: ()), op):
                verdict = properties.batch_invariance(
                    runner.observe("batch_invariance", case, "disabled")
                )
                verdicts.append((case.shape, case.layouts, verdict.ok, verdict.compared))
                if not verdict.ok:
                    break
            else:
                blind[op] = verdicts
        assert not blind, f"explicit control examples that show no stock variance here: {blind}"
    finally:
        runner.close()


def test_a_control_example_names_known_layouts_one_per_operand():
    """An explicit example with a misspelt layout, or a count off the op's operands, is refused
    with the op, the example and the fix named (not run with a silently wrong layout)."""
    from types import SimpleNamespace

    from bi_props.campaigns.explicit import explicit_cases
    from bi_props.model.opspec import ControlExample

    with pytest.raises(ValueError, match=r"unknown layout.*'transpose'"):
        ControlExample((1, 8), (3,), layouts=("transpose",))
    from bi_props.model.op_registry import control_example_problems, register_op

    spec = OPS["rms_norm"]
    wrong = ControlExample((1, 8), (3,), layouts=("transposed",))  # rms_norm has 2 operands
    user = replace(spec, name="rms_norm_one_layout", aten_names=(), control_examples=(wrong,))
    with pytest.raises(ValueError, match=r"control example 0 names 1 layout\(s\) for 2"):
        register_op(user)
    assert "rms_norm_one_layout" not in OPS
    assert all(not control_example_problems(s) for s in OPS.values())  # the built-in examples
    case = explicit_cases(SimpleNamespace(entries=lambda op: ()), "sum")[0]
    assert case.layouts == ("transposed",)
