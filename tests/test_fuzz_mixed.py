"""Mixed batches that reach the bugs: `bi-props fuzz` finds and shrinks two planted
mixed-attention kernels whose path is keyed on batch-wide metadata:

- tests/planted/planted_query_tiling.py: another (correct) reduction for every row once any
  sequence in the batch has >= 10 query tokens (FlashAttention-3's tiling flip), shrunk to a
  batch whose longest query has exactly 10 tokens;
- tests/planted/planted_split_by_longest.py: each sequence's keys split in chunks chosen from the
  batch's longest sequence (split-KV), shrunk to a needle whose keys span more splits inside the
  batch than alone.

Batches of equal query and key lengths with at most 8-token needles (bi_props' earlier strategies)
could show neither through a decode or chunk needle.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from bi_props.catalogue.attention import mixed_queries
from bi_props.execution.materialize import batch_samples
from bi_props.model.case import Case, parse_case
from planted_fuzz import PLANTED, fuzz_planted

BUDGET_S = 120

SPACE = """
[hypothesis]
max_examples = 10
[runner]
example_timeout_s = 30
start_timeout_s = 120
control_examples = 20
[ops]
include = ["mixed_attention"]
[dtypes]
choices = ["float32"]
[layouts]
choices = ["contiguous"]
[batch]
max_companions = 3
[attention]
length = {{ min = 1, max = {longest} }}
head_dims = [8]
"""


def _found(library: str, longest: int, tmp_path: Path) -> tuple[Case, str, float]:
    start = time.monotonic()
    code, log, report, _ = fuzz_planted(
        library, "mixed_attention", SPACE.format(longest=longest), tmp_path, BUDGET_S,
        "--max-findings", "1",
    )  # fmt: skip
    took = time.monotonic() - start
    assert code == 1, log[-3000:]
    cell = ("mixed_attention", "batch_invariance", "enabled")
    found = [f for f in report["findings"] if (f["op"], f["property"], f["switch"]) == cell]
    assert found, [(f["op"], f["property"], f["switch"], f["kind"]) for f in report["findings"]]
    return parse_case(found[0]["case"]), found[0]["shrink"], took


def _keys_and_queries(case: Case) -> tuple[list[int], list[int]]:
    keys = [rows for _, rows in batch_samples(case)]
    return keys, mixed_queries(case, keys)


@pytest.mark.campaign
@pytest.mark.slow
def test_fuzz_finds_a_path_switched_by_the_batch_longest_query(tmp_path: Path) -> None:
    import sys

    sys.path.insert(0, str(PLANTED))
    from planted_query_tiling import THRESHOLD

    case, shrink, took = _found("planted_query_tiling", 16, tmp_path)
    _, queries = _keys_and_queries(case)
    assert max(queries) >= THRESHOLD, case  # the class: some sequence reaches the switch
    needle_q = queries[case.batch.position]
    assert needle_q < THRESHOLD, case  # the needle alone stays below it
    if shrink == "complete":
        assert max(queries) == THRESHOLD, case
        assert case.shape[0] <= 3, case  # a small needle
    print(f"planted_query_tiling: {took:.0f} s, {case!r}")


@pytest.mark.campaign
@pytest.mark.slow
def test_fuzz_finds_a_key_split_chosen_by_the_batch_longest_sequence(tmp_path: Path) -> None:
    import sys

    sys.path.insert(0, str(PLANTED))
    from planted_split_by_longest import SPLIT_MIN, chunk

    case, shrink, took = _found("planted_split_by_longest", 16, tmp_path)
    keys, _ = _keys_and_queries(case)
    assert max(keys) > SPLIT_MIN, case  # the batch's longest sets more than one split
    # the class: some sequence's keys are grouped otherwise in the whole batch than in a
    # smaller call (the needle alone, or a window of the needle and its first companions,
    # whose longest is shorter)
    whole = chunk(max(keys))
    shorter = [chunk(k) for k in keys if chunk(k) != whole]
    cut = [k for k in keys if k > min(whole, *shorter, whole)]
    assert shorter and cut, case
    needle = case.shape[0]
    alone = chunk(needle)
    if shrink == "complete" and alone != whole and needle > min(alone, whole):
        # the needle is the sequence it shows on: the shortest that the batch's split cuts
        assert needle == whole + 1 and max(keys) <= 2 * SPLIT_MIN, case
    print(f"planted_split_by_longest: {took:.0f} s, {case!r}")
