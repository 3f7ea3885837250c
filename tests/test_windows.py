"""Nested windows of a batch: each batch-invariance example judges every row of its batch at
several batch sizes, not only the needle.

The observer runs in this process on ops whose kernel is replaced by a toy one (so the tests are
exact and need no worker): a row op whose rows depend on the parity of the call's row count, and a
sequence op whose rows depend on the parity of its number of sequences. The needle alone and the
whole batch agree (both odd); only a window of an even size shows the bug."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from bi_props.execution.execute import batch_windows, observe_batch_invariance
from bi_props.model import properties
from bi_props.model.case import Batch, Case, Companion
from bi_props.model.observation import Observation
from bi_props.model.op_registry import OPS
from bi_props.model.windows import MAX_WINDOWS, halvings, row_windows, sample_windows

TARGET = SimpleNamespace(device="cpu")


def test_halvings_are_distinct_smaller_and_bounded():
    assert halvings(0) == [] and halvings(1) == []
    assert halvings(2) == [1]
    assert halvings(300) == [150, 75, 37, 18, 9, 4, 2, 1][:MAX_WINDOWS]
    assert halvings(10**9)[:2] == [500000000, 250000000] and len(halvings(10**9)) == MAX_WINDOWS
    assert halvings(8) == [4, 2, 1]
    assert row_windows(5) == [2, 1] and sample_windows(4) == [2, 1]


def _scaled(by_rows: bool, buggy: bool):
    """A kernel that returns its first operand scaled by 1 + 2^-10 when the call's row count
    (``by_rows``) or its number of samples is even, and buggy; unscaled otherwise."""
    import torch

    def call(entry, args, case, lengths):
        count = args[0].shape[0] if by_rows else len(lengths)
        x = args[0].to(torch.float32)
        return x * (1.0 + 2.0**-10) if buggy and count % 2 == 0 else x.clone()

    return call


def _judge(case: Case, windows: bool = True):
    fields = observe_batch_invariance(case, TARGET, windows=windows)
    return properties.batch_invariance(Observation("batch_invariance", "enabled", **fields))


@pytest.mark.parametrize("buggy", [False, True])
def test_a_row_window_of_even_size_catches_what_the_needle_cannot(monkeypatch, buggy):
    monkeypatch.setitem(OPS, "silu", dataclasses.replace(OPS["silu"], call=_scaled(True, buggy)))
    batch = Batch(position=1, companions=(Companion(5, 3), Companion(6, 1)))  # 5 rows in all
    case = Case("silu", "F.silu", "float32", (1, 7), ("contiguous",), "general", 3, batch=batch)
    assert [w.rows for w in batch_windows(case)] == [2, 1]
    needle_only = _judge(case, windows=False)
    assert needle_only.ok and needle_only.rows == 1  # 1 row alone, 5 together: both odd
    verdict = _judge(case)
    assert verdict.ok is not buggy, verdict
    if buggy:
        assert "inside the batch's first 2 of 5 rows of it" in verdict.message, verdict.message
    else:
        assert verdict.rows == 1 + 2 + 1 and verdict.compared == 7 * (1 + 2 + 1)


@pytest.mark.parametrize("position", [0, 2, 4])
@pytest.mark.parametrize("buggy", [False, True])
def test_a_sample_window_maps_each_sequence_to_its_own_rows(monkeypatch, position, buggy):
    """Whole sequences (attention), the needle anywhere: a correct kernel passes, so each window
    row is compared with the same sample's row of the batch; a kernel keyed on the number of
    sequences fails at the window with an even count."""
    toy = dataclasses.replace(OPS["attention"], call=_scaled(False, buggy))
    monkeypatch.setitem(OPS, "attention", toy)
    companions = tuple(Companion(10 + i, rows) for i, rows in enumerate((3, 1, 5, 2)))
    case = Case(
        "attention",
        "bi_props.ops.varlen_attention",
        "float32",
        (4, 2, 1, 8),
        ("contiguous",) * 3,
        "general",
        1,
        batch=Batch(position, companions),
    )
    windows = batch_windows(case)
    # the needle and 2, then 1 companions; then the 4 companions without the needle
    assert [len(w.samples) for w in windows] == [3, 2, 4]
    verdict = _judge(case)
    assert verdict.ok is not buggy, verdict
    if buggy:
        assert "the needle with the first 1 of its 4 companions" in verdict.message
    else:
        first, second, without = (w.rows for w in windows)
        assert verdict.rows == 4 + first + second + without
        assert (first, second, without) == (4 + 3 + 1, 4 + 3, 3 + 1 + 5 + 2)


def test_the_batch_without_its_needle_shows_a_kernel_keyed_on_the_longest_needle() -> None:
    """A paged decode kernel chosen by the batch's longest context (v1 up to 512 tokens, v2
    past it), the needle the longest: alone and in every window that keeps it, the batch is
    past 512, so only its companions alone (v1) against the whole batch (v2) can show it."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent / "planted"))
    import planted_paged_v1_v2

    import bi_props.ops as ops

    stock = ops.paged_decode_attention
    planted_paged_v1_v2.enable(True)
    try:
        case = Case(
            "paged_decode_attention",
            "bi_props.ops.paged_decode_attention",
            "float32",
            (2048, 1, 1, 8, 16),
            ("contiguous",) * 3,
            "general",
            3,
            {"placement": 0},
            batch=Batch(0, (Companion(4, 300), Companion(5, 100))),
        )
        verdict = _judge(case)
    finally:
        ops.paged_decode_attention = stock
    assert not verdict.ok
    assert "the batch without its needle (its 2 companions alone)" in verdict.message
