"""Row permutation: the batch's rows (sequence ops: its sequences) in a derangement,
the output un-permuted, bitwise equal to the batch in its drawn order. The derangement itself,
the un-permute for packed sequences, the verdicts (an invariant op passes, a row-order-dependent
one fails, one row is degenerate) and the positive control: skipping the un-permute is caught."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from bi_props.model import permutation, properties
from bi_props.model.case import Batch, Case, Companion
from bi_props.model.observation import Call, Observation, TensorBits
from bi_props.model.op_registry import OPS, cells
from bi_props.model.space import SpaceError, parse


@given(st.lists(st.integers(1, 40), min_size=1, max_size=40), st.integers(0, 2**32 - 1))
def test_the_derangement_moves_every_unit_and_every_row(sizes: list[int], seed: int) -> None:
    order = permutation.derangement(sizes, seed)
    assert sorted(order) == list(range(len(sizes)))
    if len(sizes) < 2:
        assert order == tuple(range(len(sizes)))
        return
    assert all(u != new for new, u in enumerate(order))  # a derangement
    moved = permutation.moved_rows(order, sizes)
    assert moved == sum(sizes)  # every row lands at another index
    assert moved >= permutation.MOVED_SHARE_FLOOR * sum(sizes)
    assert permutation.derangement(sizes, seed) == order  # the case's seed alone decides


def test_the_derangement_is_not_always_the_rotation() -> None:
    rotation = tuple([*range(1, 8), 0])
    drawn = {permutation.derangement([1] * 8, seed) for seed in range(20)}
    assert len(drawn) > 5 and drawn != {rotation}


@given(st.lists(st.integers(1, 6), min_size=2, max_size=12), st.integers(0, 2**16))
def test_un_permuting_packed_sequences_restores_the_order(sizes: list[int], seed: int) -> None:
    """Sequences of ``sizes`` tokens packed in a derangement, then each sequence's rows cut out
    of the permuted output and put back: the original packing, row for row."""
    order = permutation.derangement(sizes, seed)
    rows = np.arange(sum(sizes))
    packed = rows[permutation.row_order(order, sizes)]  # the sequences in the permuted order
    back = packed[permutation.unpermute_index(order, sizes)]
    assert (back == rows).all()
    assert (packed != rows).all()  # every row moved


def _bits(values) -> TensorBits:
    array = np.asarray(values, dtype=np.float32)
    return TensorBits("float32", array.shape, "cpu", array.view(np.uint32))


def _observation(batch, permuted, units: int) -> Observation:
    calls = {"batch": Call(outputs=(_bits(batch),)), "permuted": Call(outputs=(_bits(permuted),))}
    evidence = {"unit": "row", "units": units, "rows": units, "moved_rows": units}
    return Observation("row_permutation", "enabled", calls, evidence=evidence)


def test_verdicts_pass_fail_and_degenerate() -> None:
    same = properties.row_permutation(_observation([[1.5], [2.5]], [[1.5], [2.5]], 2))
    assert same.ok and not same.degenerate and same.compared == 2
    other = properties.row_permutation(_observation([[1.5], [2.5]], [[1.5], [2.25]], 2))
    assert not other.ok and other.kind == "mismatch" and "derangement" in other.message
    one = properties.row_permutation(_observation([[1.5]], [[1.5]], 1))
    assert one.ok and one.compared == 0 and "nothing to permute" in one.degenerate


def test_every_batched_op_has_the_property_with_the_switch_on_only() -> None:
    listed = cells(list(OPS))
    batched = [op for op, spec in OPS.items() if "batch_invariance" in spec.properties]
    assert batched
    for op in batched:
        assert (op, "row_permutation", "enabled") in listed, op
        assert (op, "row_permutation", "disabled") not in listed, op
    assert not [c for c in listed if c[1] == "row_permutation" and c[0] not in batched]


def test_a_space_can_leave_the_property_out() -> None:
    space = parse({"properties": {"exclude": ["row_permutation"]}}, "t.toml", "test")
    assert space.exclude_properties == ("row_permutation",)
    assert not [c for c in cells(space.ops, space.exclude_properties) if c[1] == "row_permutation"]
    with pytest.raises(SpaceError, match=r"properties\.exclude"):
        parse({"properties": {"exclude": ["row_permutaton"]}}, "t.toml", "test")


# -- the observer on the CPU target (stock kernels: install() is one-way), and the positive control


@pytest.fixture(scope="module")
def target():
    """The CPU target with its switch off: its kernels are not installed here, because
    ``install()`` is process-wide and one-way (the tests after this file judge stock kernels).
    Row permutation needs only a row-order-independent op: the stock CPU ones are, on these
    small cases; the switched-on kernels meet the property in the campaign tests."""
    from bi_props.targets.cpu import CpuTarget

    previous = os.environ.pop("VLLM_BATCH_INVARIANT", None)
    try:
        cpu = CpuTarget()
        cpu.activate()
        yield cpu
    finally:
        if previous is not None:
            os.environ["VLLM_BATCH_INVARIANT"] = previous


CASES = {
    "rms_norm": Case(
        "rms_norm", "F.rms_norm", "float32", (3, 40), ("contiguous",) * 2, "general", 5,
        {"eps": None}, Batch(1, (Companion(11, 4), Companion(12, 2))),
    ),
    "attention": Case(
        "attention", "bi_props.ops.varlen_attention", "float32", (5, 2, 1, 8),
        ("contiguous",) * 3, "general", 5, {}, Batch(1, (Companion(11, 3), Companion(12, 7))),
    ),
    "paged_decode_attention": Case(
        "paged_decode_attention", "bi_props.ops.paged_decode_attention", "float32",
        (9, 2, 1, 8, 4), ("contiguous",) * 3, "general", 5, {"placement": 0},
        Batch(0, (Companion(11, 20), Companion(12, 3))),
    ),
    # a padded batch moves whole padded samples (its batch axis is the samples)
    "rms_norm_padded": Case(
        "rms_norm", "F.rms_norm", "float32", (3, 40), ("contiguous",) * 2, "general", 5,
        {"eps": None}, Batch(1, (Companion(11, 4), Companion(12, 2))), padded=6,
    ),
    # each sequence's query tokens move with it (the needle a decode token, a chunk companion)
    "mixed_attention": Case(
        "mixed_attention", "bi_props.ops.mixed_attention", "float32", (6, 1, 2, 1, 8),
        ("contiguous",) * 3, "general", 5, {},
        Batch(1, (Companion(11, 7, queries=3), Companion(12, 5))),
    ),
}  # fmt: skip


def _judge(fields: dict) -> properties.Verdict:
    return properties.row_permutation(Observation("row_permutation", "enabled", **fields))


@pytest.mark.parametrize("op", sorted(CASES))
def test_an_invariant_op_passes_and_a_skipped_un_permute_is_caught(target, op: str) -> None:
    from bi_props.execution import execute

    case = CASES[op]
    fields = execute.observe_row_permutation(case, target)
    verdict = _judge(fields)
    assert verdict.ok and not verdict.degenerate, verdict.message
    assert fields["evidence"]["unit"] == ("row" if op == "rms_norm" else "sequence")
    assert fields["evidence"]["moved_rows"] == fields["evidence"]["rows"]
    # the positive control: the same observation without putting the output back in order
    planted = execute.observe_row_permutation(case, target, unpermute=False)
    caught = _judge(planted)
    assert not caught.ok and caught.kind in ("mismatch",), caught.message


def test_a_row_order_dependent_op_fails(target, monkeypatch) -> None:
    """An rms_norm whose rows are scaled by their index in the batch: invariant to nothing."""
    import torch

    from bi_props.execution import execute

    stock = torch.nn.functional.rms_norm

    def by_index(x, shape, weight=None, eps=None):
        y = stock(x, shape, weight, eps=eps)
        index = torch.arange(y.shape[0], dtype=y.dtype).unsqueeze(-1)
        return y * (1 + index * 2.0**-20)

    monkeypatch.setattr(torch.nn.functional, "rms_norm", by_index)
    verdict = _judge(execute.observe_row_permutation(CASES["rms_norm"], target))
    assert not verdict.ok and verdict.kind == "mismatch"


def test_one_row_is_degenerate(target) -> None:
    from bi_props.execution import execute

    case = Case(
        "rms_norm", "F.rms_norm", "float32", (1, 8), ("contiguous",) * 2, "general", 5,
        {"eps": None}, Batch(0, ()),
    )  # fmt: skip
    fields = execute.observe_row_permutation(case, target)
    verdict = _judge(fields)
    assert verdict.ok and "nothing to permute" in verdict.degenerate


@pytest.mark.parametrize("op", ["rms_norm", "paged_decode_attention"])
def test_the_reproducer_permutes_and_un_permutes(target, op: str, tmp_path) -> None:
    """A standalone row-permutation reproducer runs the batch and its permutation (rows, or
    whole paged sequences), puts the output back and compares: the (correct) CPU kernels do not
    reproduce a finding."""
    import subprocess
    import sys

    from bi_props.execution import execute
    from bi_props.reporting import repro

    case = CASES[op]
    exported = execute.export("row_permutation", case, target)
    order = exported["groups"]["permuted"]["lengths"]
    assert sorted(order) == sorted(exported["groups"]["batch"]["lengths"])
    setup = {"enabled": target.repro_setup(True), "disabled": target.repro_setup(False)}
    finding = {"property": "row_permutation", "switch": "enabled", "kind": "mismatch"}
    path = tmp_path / f"{op}.py"
    path.write_text(repro.script({**finding, "message": ""}, case, exported, setup, "x::"))
    proc = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "does NOT reproduce" in proc.stdout, proc.stdout[-2000:]
    # the same script without the un-permute (identity): the reordered output is seen
    exported["unpermute"] = list(range(len(exported["unpermute"])))
    path.write_text(repro.script({**finding, "message": ""}, case, exported, setup, "x::"))
    proc = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "REPRODUCES" in proc.stdout, proc.stdout[-2000:]


def test_row_permutation_catches_expert_slots_assigned_by_arrival(target, monkeypatch) -> None:
    """The planted arrival-order fused_moe (tests/planted/planted_arrival_order.py): a token's
    expert outputs are summed in the order of its arrival slots, which permuting the rows
    changes; the stock-order fused_moe of the CPU target passes the same case."""
    import sys
    from pathlib import Path

    import bi_props.ops as ops
    from bi_props.execution import execute

    monkeypatch.syspath_prepend(str(Path(__file__).parent / "planted"))
    sys.modules.pop("planted_arrival_order", None)
    import planted_arrival_order

    case = Case(
        "fused_moe", "bi_props.ops.fused_moe", "float32", (3, 16, 8, 4, 3), ("contiguous",) * 4,
        "general", 3, {"renormalize": True}, Batch(1, (Companion(11, 5), Companion(12, 4))),
    )  # fmt: skip
    assert _judge(execute.observe_row_permutation(case, target)).ok
    monkeypatch.setattr(ops, "fused_moe", planted_arrival_order.fused_moe)
    verdict = _judge(execute.observe_row_permutation(case, target))
    assert not verdict.ok and verdict.kind == "mismatch", verdict.message
