"""Companion content: what a needle's batch-mates hold (outliers, ties and near-ties, -inf rows and
tiles, huge and subnormal-scale values), drawn per companion, shrinking to plain; the needle's
own values never change with it.

Strategies are checked through Hypothesis' ``find`` (the smallest case satisfying a condition):
a content the space allows is reached, and shrinks away when the condition does not need it.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, find, settings
from hypothesis.errors import NoSuchExample

from bi_props.campaigns.shrink import choices_of, reductions
from bi_props.catalogue.strategies import cases
from bi_props.execution import materialize as M
from bi_props.model.batch_reach import BatchReach, merge_reach
from bi_props.model.case import COMPANION_CONTENTS, Batch, Case, Companion, SampleSeed
from bi_props.model.space import SpaceError, load_profile, parse

FIND = settings(
    database=None,
    max_examples=2000,
    suppress_health_check=list(HealthCheck),
    phases=[Phase.generate, Phase.shrink],
)


def _mm(*companions: Companion, dtype: str = "float32") -> Case:
    batch = Batch(0, companions)
    return Case("mm", "torch.mm", dtype, (2, 24, 8), ("contiguous",) * 2, "general", 5, {}, batch)


def _needle_and_batch(case: Case) -> tuple[np.ndarray, np.ndarray]:
    alone = M.to_float64(M.operands(case, M.needle(case), "cpu")[0])
    batch = M.to_float64(M.operands(case, M.batch_samples(case), "cpu")[0])
    return alone, batch


@pytest.mark.parametrize("content", COMPANION_CONTENTS[1:])
def test_each_content_is_reached_and_shrinks_to_one_plain_companion_otherwise(content):
    space = load_profile("cpu")
    strategy = cases(space, "mm", "batch_invariance")
    found = find(
        strategy, lambda c: any(x.content == content for x in c.batch.companions), settings=FIND
    )
    assert [x.content for x in found.batch.companions] == [content], found
    plain = find(strategy, lambda c: c.batch is not None, settings=FIND)
    assert all(x.content == "plain" for x in plain.batch.companions), plain


def test_the_space_turns_content_off_and_names_a_wrong_one():
    space = parse({"batch": {"contents": ["plain"]}}, "test", "test")
    assert space.companion_contents == ("plain",)
    strategy = cases(space, "mm", "batch_invariance")
    with pytest.raises(NoSuchExample):  # never reached: no such draw exists
        find(strategy, lambda c: any(x.content != "plain" for x in c.batch.companions),
             settings=settings(FIND, max_examples=300))  # fmt: skip
    some = parse({"batch": {"contents": ["ties", "outlier"]}}, "test", "test")
    assert some.companion_contents == ("plain", "outlier", "ties")  # plain first, in order
    with pytest.raises(SpaceError, match=r"batch\.contents.*unknown \['spikes'\]"):
        parse({"batch": {"contents": ["spikes"]}}, "test", "test")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_each_content_holds_what_it_says_and_leaves_the_needle_alone(dtype):
    plain_alone, _ = _needle_and_batch(_mm(Companion(9, 6), dtype=dtype))
    plain = _needle_and_batch(_mm(Companion(9, 6), dtype=dtype))[1][2:]
    largest = float(np.finfo(np.float16).max) if dtype == "float16" else 3.4028234663852886e38
    for content in COMPANION_CONTENTS[1:]:
        case = _mm(Companion(9, 6, content=content), dtype=dtype)
        alone, batch = _needle_and_batch(case)
        assert np.array_equal(alone, plain_alone)  # the needle's values never change
        assert np.array_equal(batch[:2], alone)
        mate = batch[2:]
        again = _needle_and_batch(case)[1][2:]  # deterministic
        assert np.array_equal(mate, again, equal_nan=True)
        if content == "outlier":
            ratio = np.max(np.abs(mate)) / np.max(np.abs(plain))
            assert 50 <= ratio <= 2e4, ratio
        elif content == "huge":
            assert largest / 8 <= np.max(np.abs(mate)) <= largest, np.max(np.abs(mate))
        elif content == "tiny":
            smallest_normal = float(np.finfo(np.float16 if dtype == "float16" else np.float32).tiny)
            assert 0 < np.max(np.abs(mate)) < smallest_normal
        elif content == "neg_inf":
            assert np.isneginf(mate).any() and np.isfinite(mate).any()
        elif content == "ties":
            values, counts = np.unique(mate, return_counts=True)
            assert counts.max() >= 3  # exact ties
            assert np.any(np.diff(values) < 2.0**-6), values  # 1-ulp near-ties besides


def test_a_companion_repr_names_its_content_and_reads_back():
    plain, odd = Companion(3, 4), Companion(3, 4, content="neg_inf")
    assert repr(plain) == "Companion(seed=3, rows=4)"
    assert repr(odd) == "Companion(seed=3, rows=4, content='neg_inf')"
    assert eval(repr(odd), {"Companion": Companion}) == odd
    assert plain.sample_seed == 3 and type(plain.sample_seed) is int
    seed = odd.sample_seed
    assert isinstance(seed, SampleSeed) and seed == 3 and seed.content == "neg_inf"


def test_a_reduction_makes_a_companion_plain():
    base = _mm(Companion(9, 6, content="outlier"), Companion(4, 2))
    simplest = find(reductions(base), lambda c: True, settings=FIND)
    assert [c.content for c in simplest.batch.companions] == ["plain"], simplest
    kept = find(reductions(base), lambda c: len(c.batch.companions) == 2, settings=FIND)
    assert [c.content for c in kept.batch.companions] == ["plain", "plain"], kept
    assert len(choices_of(base)) > len(choices_of(_mm(Companion(9, 6), Companion(4, 2))))


def test_the_batch_reach_counts_the_contents_of_each_cells_examples():
    reach = BatchReach((4,))
    reach.add(_mm(Companion(1, 3, content="ties"), Companion(2, 3, content="ties")))
    reach.add(_mm(Companion(1, 3, content="outlier")))
    reach.add(_mm(Companion(1, 3)))
    data = reach.to_json()
    assert data["contents"] == {
        "plain": 1, "outlier": 1, "ties": 1, "neg_inf": 0, "huge": 0, "tiny": 0
    }  # fmt: skip
    cell = {"target": "cpu", "op": "mm", "property": "batch_invariance", "switch": "enabled"}
    [merged] = merge_reach([{**cell, **data}, {**cell, **data}])
    assert merged["contents"]["ties"] == 2 and merged["contents"]["neg_inf"] == 0


@pytest.mark.parametrize("content", COMPANION_CONTENTS[1:])
def test_a_companions_first_rows_hold_the_same_values_whatever_its_length(content):
    """A batch window may cut a companion: its first rows must be those of the whole batch."""
    long = _mm(Companion(9, 40, content=content))
    short = _mm(Companion(9, 7, content=content))
    _, whole = _needle_and_batch(long)
    _, cut = _needle_and_batch(short)
    np.testing.assert_array_equal(cut[2:], whole[2 : 2 + 7])
