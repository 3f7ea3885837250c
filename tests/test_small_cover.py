"""A claimed op's enabled reference cell runs a cover of small sizes in its first turn
(campaigns/small_cover.py): each size of each dimension up to 16 that the cell's own strategy
draws, chosen greedily from a fixed draw, so that a kernel wrong or hanging at one small size
(K = 7, say) is met in every run, not once in a hundred draws."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import bi_props.catalogue  # noqa: F401  (registers the ops)
from bi_props.campaigns.small_cover import SMALL, applies, cover, cover_cases, small_space
from bi_props.model.case import Case
from bi_props.model.space import load_profile


def _session(space, claimed=("mm", "softmax", "attention", "rotary_embedding")):
    runner = SimpleNamespace(drawn_modes=lambda: (tuple(space.modes), None))
    return SimpleNamespace(
        space=space,
        runner=runner,
        entries=lambda op: None,
        drawn_examples={},
        covered=lambda op: op in claimed,
    )


def test_it_applies_to_a_claimed_ops_enabled_reference_cell_only() -> None:
    session = _session(load_profile("cpu"))
    assert applies(session, "mm", "reference", "enabled")
    assert not applies(session, "mm", "reference", "disabled")
    assert not applies(session, "mm", "batch_invariance", "enabled")
    assert not applies(session, "sum", "reference", "enabled")  # not claimed


@pytest.mark.parametrize("op", ["mm", "softmax", "attention", "rotary_embedding"])
def test_the_cover_stays_small_and_is_the_same_in_every_run(op: str) -> None:
    session = _session(load_profile("cpu"))
    chosen = cover_cases(session, op, "reference")
    assert chosen, op
    space = small_space(load_profile("cpu"))
    assert space.scale_every == 0 and space.dim.max <= SMALL and space.rows.max <= SMALL
    assert all(c.op == op and c.batch is None for c in chosen)
    assert cover_cases(session, op, "reference") is chosen  # drawn once per session
    assert cover_cases(_session(load_profile("cpu")), op, "reference") == chosen  # fixed seed


def test_mm_meets_most_small_sizes_of_each_dimension() -> None:
    """Random draws met K = 7 about once in a hundred; the cover meets most sizes of 0..16 in
    each of M, K and N within 20 cases."""
    chosen = cover_cases(_session(load_profile("cpu")), "mm", "reference")
    assert len(chosen) <= 20
    for dim in range(3):
        sizes = {c.shape[dim] for c in chosen}
        assert all(s <= SMALL for s in sizes)
        assert len(sizes) >= 12, (dim, sorted(sizes))


def test_the_greedy_cover_takes_what_adds_the_most_sizes() -> None:
    def case(*shape: int) -> Case:
        return Case("mm", "torch.mm", "float32", shape, (), "general", 0)

    drawn = [case(1, 1, 1), case(1, 1, 2), case(2, 3, 4), case(2, 3, 4), case(5, 1, 1)]
    chosen = cover(drawn)
    sizes = {(i, v) for c in chosen for i, v in enumerate(c.shape)}
    assert sizes == {(i, v) for c in drawn for i, v in enumerate(c.shape)}
    assert len(chosen) == 4  # the duplicate adds nothing
    assert cover(drawn, most=1) == [case(1, 1, 1)]  # three new sizes, the cheaper of two
    assert cover(drawn, most=2) == [case(1, 1, 1), case(2, 3, 4)]  # three new sizes beat one
