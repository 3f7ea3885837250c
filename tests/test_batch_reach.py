"""Batches that reach the switch points: many sequences for sequence ops,
long attention needles, totals aimed at thresholds, and the report of how far batches reached.

The strategies are checked through Hypothesis' own ``find`` (the smallest case satisfying a
condition): a batch quantity the strategy can reach is found, and shrinks to the threshold.
"""

from __future__ import annotations

from dataclasses import replace
from random import Random

import pytest
from hypothesis import HealthCheck, Phase, find, settings

from bi_props.catalogue.strategies import cases
from bi_props.model.batch_reach import BatchReach, batch_quantities, merge_reach
from bi_props.model.case import Batch, Case, Companion
from bi_props.model.space import THRESHOLDS, SpaceError, load_profile, parse
from bi_props.reporting.markdown import _batch_reach

FIND = settings(
    database=None,
    max_examples=3000,
    suppress_health_check=list(HealthCheck),
    phases=[Phase.generate, Phase.shrink],  # no explain phase: campaigns run none either
)


def _case(needle: int, *rows: int) -> Case:
    batch = Batch(0, tuple(Companion(i, r) for i, r in enumerate(rows)))
    return Case("rms_norm", "x", "float32", (needle, 8), ("contiguous",), "general", 0, {}, batch)


def _total(case: Case) -> int:
    return batch_quantities(case)[1]["total_rows"]


def test_quantities_of_the_needle_alone_and_of_its_batch() -> None:
    alone, batch = batch_quantities(_case(3, 100, 200))
    assert alone == {"total_rows": 3, "sequences": 1, "longest": 3, "padded": 0}
    assert batch == {"total_rows": 303, "sequences": 3, "longest": 200, "padded": 0}
    assert batch_quantities(Case("mm", "x", "float32", (1, 2, 3), (), "general", 0)) is None


def test_a_threshold_is_crossed_only_between_the_needle_and_its_batch() -> None:
    reach = BatchReach((2, 4, 256, 300))
    reach.add(_case(3, 100, 150))  # total 253, 3 sequences, longest 150
    reach.add(_case(3, 253))  # total 256, 2 sequences
    data = reach.to_json()
    assert data["examples"] == 2
    assert data["largest"] == {"total_rows": 256, "sequences": 3, "longest": 253, "padded": 0}
    # 2 lies below the needle's own 3 rows: crossed by no example, whatever the batch
    assert data["crossed"]["total_rows"] == {"2": 0, "4": 2, "256": 1, "300": 0}
    assert data["crossed"]["sequences"] == {"2": 2, "4": 0, "256": 0, "300": 0}


def test_the_padded_length_is_a_quantity_crossed_from_the_needle_alone() -> None:
    """A padded case: the needle alone is laid out at its own length, the batch at the
    padded length (at least the longest sample's rows): a switch on L is crossed in between."""
    case = replace(_case(3, 20), padded=32)
    alone, batch = batch_quantities(case)
    assert (alone["padded"], batch["padded"]) == (3, 32)
    assert batch_quantities(replace(case, padded=8))[1]["padded"] == 20  # never below the longest
    reach = BatchReach((16, 32, 33))
    reach.add(case)
    reach.add(_case(3, 40))  # packed: no padded length at all
    data = reach.to_json()
    assert data["largest"]["padded"] == 32
    assert data["crossed"]["padded"] == {"16": 1, "32": 1, "33": 0}


def test_shards_of_one_cell_merge() -> None:
    one = {"target": "cpu", "op": "mm", "property": "batch_invariance", "switch": "enabled"}
    a = {**one, **BatchReach((256,)).to_json()}
    reach = BatchReach((256,))
    reach.add(_case(1, 300))
    b = {**one, **reach.to_json()}
    [merged] = merge_reach([a, b, b])
    assert merged["examples"] == 2 and merged["largest"]["total_rows"] == 301
    assert merged["crossed"]["total_rows"] == {"256": 2}


def test_sequence_ops_reach_many_sequences_and_shrink_to_the_threshold() -> None:
    """The cpu profile: 64 sequences at most (the issue: at least 64 on cpu); a kernel path
    that switches at 10 sequences is reached and the smallest such batch has exactly 10."""
    space = load_profile("cpu")
    assert space.max_sequences >= 64
    for op in ("attention", "paged_decode_attention"):
        strategy = cases(space, op, "batch_invariance")
        smallest = find(strategy, lambda c: c.batch.size >= 10, settings=FIND)
        assert smallest.batch.size == 10, smallest
        many = find(strategy, lambda c: c.batch.size >= 60, settings=FIND)
        assert many.batch.size == 60, many  # copies of a few companions: cheap to shrink
        total = batch_quantities(many)[1]["total_rows"] - many.shape[0]
        assert total <= space.max_batch_tokens, many  # the cost cap holds


def test_a_row_op_keeps_its_few_companions() -> None:
    space = load_profile("cpu")
    few = settings(FIND, max_examples=200)
    with pytest.raises(Exception, match="No examples found"):
        find(cases(space, "rms_norm", "batch_invariance"), lambda c: c.batch.size > 7, settings=few)


def test_attention_needles_may_be_long_and_shrink_short() -> None:
    space = load_profile("cpu")
    strategy = cases(space, "attention", "batch_invariance")
    assert find(strategy, lambda c: c.shape[0] > 8, settings=FIND).shape[0] == 9
    assert find(strategy, lambda c: True, settings=FIND).shape[0] == space.attention_length.min


def test_totals_land_on_a_switch_point() -> None:
    """A kernel that changes exactly at 256 rows: some batch has exactly 256 (and 255, 257)."""
    space = load_profile("cpu")
    strategy = cases(space, "rms_norm", "batch_invariance")
    for total in (255, 256, 257):
        found = find(strategy, lambda c, t=total: _total(c) == t, settings=FIND)
        assert _total(found) == total


def test_the_space_names_its_thresholds_and_says_what_is_wrong() -> None:
    assert parse({}, "t", "t").thresholds == THRESHOLDS
    space = parse({"batch": {"thresholds": [45, 44], "max_sequences": 100}}, "t", "t")
    assert space.thresholds == (44, 45) and space.max_sequences == 100
    assert 45 in space.switch_points and 16 in space.switch_points  # and the boundaries
    with pytest.raises(SpaceError, match=r"t: key 'batch.thresholds': got \[0\]"):
        parse({"batch": {"thresholds": [0]}}, "t", "t")
    with pytest.raises(SpaceError, match=r"batch\.max_sequences"):
        parse({"batch": {"max_sequences": 0}}, "t", "t")


def test_the_report_shows_how_far_each_cell_reached() -> None:
    reach = BatchReach((10, 256))
    reach.add(_case(2, 300, 1))
    entry = {"op": "rms_norm", "property": "batch_invariance", "switch": "enabled"}
    lines = _batch_reach({"target": "cpu", "batch_reach": [{**entry, **reach.to_json()}]})
    text = "\n".join(lines)
    assert "## Batches reached" in text
    assert "| 1 | 303 / 3 / 300 / 0 | 10: 1, 256: 1 | none | 10: 1, 256: 1 | none |" in text, text
    assert _batch_reach({"batch_reach": []}) == []
    assert "parameter mixes" not in text  # rms_norm has no request parameters
    mixed = {**entry, **reach.to_json(), "mixes": {"greedy": 2, "top_k": 3}}
    text = "\n".join(_batch_reach({"target": "cpu", "batch_reach": [mixed]}))
    assert "; parameter mixes: greedy 2, top_k 3 |" in text, text


def test_report_json_carries_each_cells_reach() -> None:
    from bi_props.campaigns.session import Session

    session = Session("cpu", parse({"ops": {"include": ["rms_norm"]}}, "t", "t"))
    session._note_example("rms_norm", "batch_invariance", "enabled", _case(2, 254), "ok")
    session._note_example("rms_norm", "reference", "enabled", _case(2), "ok")  # one companion
    [entry] = [e for e in session.report()["batch_reach"] if e["property"] == "batch_invariance"]
    assert entry["examples"] == 1 and entry["largest"]["total_rows"] == 256
    assert entry["crossed"]["total_rows"]["256"] == 1 and entry["crossed"]["total_rows"]["257"] == 0


def test_a_failure_on_many_sequences_shrinks_to_a_few_in_few_steps() -> None:
    """Many-sequence batches copy the few companions drawn (``_replicated``): a failure first
    seen on 30 or more sequences shrinks by one draw to those few, then to the needle and at
    most four companions (one or two for most seeds; mixed attention's query draws keep a few
    one-token companions for some). Drawn as 30-60 independent companions it took 130-270
    shrink steps (each a batch of hundreds of tokens through the kernel) and could stop at 8
    sequences."""
    space = load_profile("cpu")
    for op in ("attention", "mixed_attention", "paged_decode_attention"):
        steps = {"after_first": 0, "first": None}

        def fails(case: Case, steps: dict = steps) -> bool:
            rows = [c.rows for c in case.batch.companions]
            bug = max(rows) >= 20 and case.shape[0] > 12  # a long needle beside a longer one
            if steps["first"] is None:  # the first failure is a batch of many sequences
                steps["first"] = case if bug and len(rows) >= 30 else None
                return steps["first"] is not None
            steps["after_first"] += 1
            return bug

        strategy = cases(space, op, "batch_invariance")
        smallest = find(strategy, fails, settings=FIND, random=Random(0))
        assert steps["first"].batch.size > 30
        assert smallest.batch.size <= 5, (op, smallest)
        # 34 to 131 steps over seeds 0-3 and the three ops (mixed attention the most)
        assert steps["after_first"] < 150, (op, steps["after_first"])
