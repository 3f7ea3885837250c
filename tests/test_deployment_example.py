"""Each enabled batch-invariance cell of an op with a deployment axis runs one explicit example
at deployment size (campaigns/deployment_example.py): drawn once, reaching the axis' goal
(32,000 logits, a 512-key needle beside a longer sequence, a position past 4,096, a step past
1,024 tokens), never in a space that draws no deployment sizes."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

import bi_props.catalogue  # noqa: F401  (registers the ops)
from bi_props.campaigns.deployment_example import applies, deployment_case
from bi_props.model.deployment import DEPLOYMENT_GOALS, reaches_goal, size_of
from bi_props.model.op_registry import OPS
from bi_props.model.space import load_profile


def _session(space):
    runner = SimpleNamespace(drawn_modes=lambda: (tuple(space.modes), None))
    return SimpleNamespace(space=space, runner=runner, entries=lambda op: None, drawn_examples={})


@pytest.mark.parametrize(
    "op", ["softmax", "top_k", "attention", "paged_decode_attention", "rotary_embedding", "mm"]
)
def test_the_example_reaches_its_axis_goal(op: str) -> None:
    session = _session(load_profile("cpu"))
    assert applies(session, op, "batch_invariance", "enabled")
    case = deployment_case(session, op, "batch_invariance")
    axis = OPS[op].scale
    assert case is not None and reaches_goal(axis, case), case
    assert size_of(axis, case) >= DEPLOYMENT_GOALS[axis]
    assert deployment_case(session, op, "batch_invariance") is case  # drawn once
    again = deployment_case(_session(load_profile("cpu")), op, "batch_invariance")
    assert again == case  # the same case in every run of a space (a fixed seed)


def test_the_context_goal_needs_a_longer_sequence_beside_the_needle() -> None:
    from bi_props.model.case import Batch, Case, Companion

    needle = Case("attention", "", "float32", (512, 1, 1, 8), (), "general", 0)
    assert not reaches_goal("context", needle.with_batch(Batch(0, (Companion(1, 100),))))
    assert reaches_goal("context", needle.with_batch(Batch(0, (Companion(1, 513),))))


def test_no_example_where_it_does_not_apply() -> None:
    session = _session(load_profile("cpu"))
    assert not applies(session, "softmax", "reference", "enabled")
    assert not applies(session, "softmax", "batch_invariance", "disabled")
    quiet = _session(replace(load_profile("cpu"), scale_every=0))
    assert not applies(quiet, "softmax", "batch_invariance", "enabled")


@pytest.mark.parametrize("op", ["attention", "mixed_attention", "paged_decode_attention"])
def test_the_context_example_straddles_a_named_switch_point_in_float32(op: str) -> None:
    """A kernel that splits once the batch's longest sequence passes 512 runs one path for a
    needle of exactly 512 keys alone and the other beside a longer sequence; a needle of 700
    would run the split path alone too. And float32, where a changed order shows."""
    from bi_props.model.deployment import SCALE_POINTS

    case = deployment_case(_session(load_profile("cpu")), op, "batch_invariance")
    assert case is not None and case.batch is not None, case
    needle = case.shape[0]
    assert needle in SCALE_POINTS and any(c.rows > needle for c in case.batch.companions), case
    assert case.dtype == "float32", case


def test_the_preference_ranks_a_straddle_before_a_longer_needle() -> None:
    from bi_props.campaigns.deployment_example import preference
    from bi_props.model.case import Batch, Case, Companion

    def case(needle: int, dtype: str = "float32") -> Case:
        plain = Case("paged_decode_attention", "", dtype, (needle, 1, 1, 8, 16), (), "general", 0)
        return plain.with_batch(Batch(0, (Companion(1, 3000),)))

    assert preference("context", case(512)) == 0
    assert preference("context", case(700)) == 1
    assert preference("context", case(512, "bfloat16")) == 0  # the dtype is set after the choice
    assert preference("vocab", case(700)) == 0  # no straddle asked off the context axis
