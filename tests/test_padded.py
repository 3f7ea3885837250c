"""Padded layouts: a batch of (B, L, ...) inputs, every sample padded to one length
with poison. Materialisation (real rows are the packed values, padding is poison, layouts still
apply), the judgement (only real rows compared; a kernel that reads padding or depends on the
padded length fails; stock ops pass), the strategy (which ops, bounded cost, shrinks to packed)
and the reproducer of a padded finding."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, Phase, find, given, settings

from bi_props.catalogue import OPS
from bi_props.catalogue.strategies import cases
from bi_props.execution import materialize as M
from bi_props.execution.execute import export, observe
from bi_props.model import properties
from bi_props.model.case import Batch, Case, Companion, parse_case
from bi_props.model.space import SpaceError, load_profile, parse
from bi_props.targets.base import Target

PLANTED = Path(__file__).parent / "planted"
sys.path.insert(0, str(PLANTED))
import planted_padded_length  # noqa: E402

BATCH = Batch(1, (Companion(5, 3), Companion(6, 7)))
CPU = load_profile("cpu")


class _Stock(Target):
    def activate(self) -> None:
        pass


STOCK = _Stock()


def rms_case(padded: int, batch: Batch | None = BATCH, dtype: str = "float32", **kw) -> Case:
    layouts = kw.pop("layouts", ("contiguous", "contiguous"))
    return Case("rms_norm", "F.rms_norm", dtype, (2, 16), layouts, "general", 1, batch=batch,
                padded=padded, **kw)  # fmt: skip


def judge(prop: str, case: Case) -> properties.Verdict:
    return getattr(properties, prop)(observe(prop, case, STOCK, "enabled"))


# -- materialisation ----------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["contiguous", "transposed", "strided", "offset"])
def test_padded_operands_hold_the_real_rows_then_poison(layout: str) -> None:
    case = rms_case(12, layouts=(layout, "contiguous"))
    samples = M.batch_samples(case)
    x, w = M.operands(case, samples, "cpu")
    packed_x, packed_w = M.operands(replace(case, padded=0), samples, "cpu")
    assert tuple(x.shape) == (3, 12, 16) and tuple(w.shape) == (16,)  # shared weight unpadded
    assert torch.equal(w, packed_w)
    # the operand's layout applies to the padded tensor
    assert x.is_contiguous() == (layout in ("contiguous", "offset"))
    assert x.storage_offset() == (3 if layout == "offset" else 0)
    start = 0
    for i, (_, rows) in enumerate(samples):
        real = x[i, :rows]
        assert torch.equal(real, packed_x[start : start + rows])
        pad = x[i, rows:].reshape(-1)
        assert pad.numel() == (12 - rows) * 16
        poison = pad.isnan() | (pad.abs() == 2.0**14)
        assert bool(poison.all()), pad
        assert bool(pad.isnan().any()) and bool((pad == 2.0**14).any())
        start += rows


def test_padded_length_is_at_least_the_longest_sample() -> None:
    case = rms_case(4)  # shrinking may leave a length below a companion's rows: never truncate
    assert M.padded_length(case, M.batch_samples(case)) == 7
    assert M.padded_length(replace(case, padded=0), M.batch_samples(case)) == 0
    x, _ = M.operands(case, M.batch_samples(case), "cpu")
    assert tuple(x.shape) == (3, 7, 16)


def test_padded_case_round_trips_through_its_repr() -> None:
    case = rms_case(32)
    assert "padded=32" in repr(case) and parse_case(repr(case)) == case
    assert "padded" not in repr(replace(case, padded=0))
    assert hash(case) != hash(replace(case, padded=0))


# -- the judgement: only real rows, padding must not matter --------------------------------------


@pytest.mark.parametrize("op", ["rms_norm", "silu", "silu_and_mul", "add_rms_norm", "layer_norm"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_stock_row_ops_pass_padded_and_compare_real_rows_only(op: str, dtype: str) -> None:
    spec = OPS[op]
    shape = (2, 16)
    probe = Case(op, spec.entries[0], dtype, shape, (), "general", 1)
    layouts = ("contiguous",) * len(spec.operands(probe))
    case = Case(op, spec.entries[0], dtype, shape, layouts, "general", 1, batch=BATCH, padded=32)
    real = sum(rows for _, rows in M.batch_samples(case))
    # The padding rows' outputs are NaN or inf: compared, they would fail determinism's bits or
    # the reference; they are cut off before any judge sees them.
    observed = observe("determinism", case, STOCK, "enabled")
    out = observed.calls["first"].outputs[0]
    assert out.shape[0] == real
    verdict = properties.determinism(observed)
    assert verdict.ok and verdict.compared == sum(
        o.bits.size for o in observed.calls["first"].outputs
    )
    assert judge("batch_invariance", case).ok
    assert judge("reference", case.with_batch(None)).ok


def _reads_padding(input, normalized_shape, weight=None, eps=None):
    """A kernel that folds a batch-wide statistic into every row: padding leaks in."""
    leak = input.amax(dim=tuple(range(input.dim() - 1)), keepdim=True) * 0
    return planted_padded_length._STOCK(input + leak, normalized_shape, weight, eps)


def test_a_kernel_that_reads_padding_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(F, "rms_norm", _reads_padding)
    assert judge("batch_invariance", rms_case(0)).ok  # packed: nothing to read
    verdict = judge("batch_invariance", rms_case(12))
    assert not verdict.ok and "nan" in verdict.message.lower(), verdict
    reference = judge("reference", rms_case(12, batch=None))
    assert not reference.ok, reference


def test_a_padded_length_dependent_kernel_fails_only_padded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """planted_padded_length: the class the campaign test finds, judged in process."""
    monkeypatch.setattr(F, "rms_norm", planted_padded_length.rms_norm)
    threshold = planted_padded_length.THRESHOLD
    big = Batch(0, (Companion(5, 600),))  # packed: 602 rows, never the float32 path
    assert judge("batch_invariance", rms_case(0, batch=big)).ok
    assert judge("batch_invariance", rms_case(threshold - 1)).ok
    assert not judge("batch_invariance", rms_case(threshold)).ok
    assert judge("reference", rms_case(threshold, batch=None)).ok  # honest on its own


def test_export_lays_out_the_alone_group_at_its_own_length() -> None:
    case = rms_case(32)
    exported = export("batch_invariance", case, STOCK)
    assert exported["padded"] is True
    assert exported["groups"]["alone"]["tensors"][0]["shape"] == [1, 2, 16]
    assert exported["groups"]["batch"]["tensors"][0]["shape"] == [3, 32, 16]
    reference = export("reference", case.with_batch(None), STOCK)
    assert reference["groups"]["alone"]["tensors"][0]["shape"] == [1, 32, 16]
    assert reference["references"][0]["shape"] == [2, 16]  # the real rows' reference


# -- the strategy -------------------------------------------------------------------------------

FIND = settings(
    max_examples=3000, deadline=None, database=None, phases=(Phase.generate, Phase.shrink)
)


@pytest.mark.parametrize("op", sorted(o for o in OPS if OPS[o].padded is None))
def test_ops_without_a_padded_contract_are_never_padded(op: str) -> None:
    if op not in CPU.ops or OPS[op].draw_shape is None:
        pytest.skip(f"{op} is not explored by the cpu profile")

    @settings(max_examples=25, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(cases(CPU, op, "batch_invariance" if "batch_invariance" in OPS[op].properties
                 else OPS[op].properties[0]))  # fmt: skip
    def never(case: Case) -> None:
        assert case.padded == 0

    never()


@pytest.mark.parametrize("op", ["rms_norm", "silu", "linear", "matmul"])
@pytest.mark.parametrize("prop", ["batch_invariance", "reference", "determinism"])
def test_padded_cases_are_drawn_bounded_and_shrink_to_packed(op: str, prop: str) -> None:
    @settings(max_examples=60, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(cases(CPU, op, prop))
    def bounded(case: Case) -> None:
        if not case.padded:
            return
        assert OPS[op].padded(case)
        rows = [r for _, r in M.batch_samples(case)]
        assert case.padded >= max(rows)
        assert case.padded * len(rows) <= max(max(rows) * len(rows), CPU.max_batch_tokens)

    bounded()
    padded = find(cases(CPU, op, prop), lambda c: c.padded > 0, settings=FIND)
    assert padded.padded == max(r for _, r in M.batch_samples(padded))  # simplest: the longest
    at_switch = find(cases(CPU, op, prop), lambda c: c.padded >= 32, settings=FIND)
    assert at_switch.padded == 32  # a switch point is reachable exactly
    assert find(cases(CPU, op, prop), lambda c: True, settings=FIND).padded == 0


def test_space_turns_the_padded_layout_off() -> None:
    off = parse({"batch": {"padded": False}}, "off.toml", "off")
    assert off.padded is False and CPU.padded is True
    with pytest.raises(SpaceError, match=r"batch\.padded"):
        parse({"batch": {"padded": 1}}, "bad.toml", "bad")

    @settings(max_examples=40, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(cases(off, "rms_norm", "batch_invariance"))
    def never(case: Case) -> None:
        assert case.padded == 0

    never()


# -- the reproducer of a padded finding -----------------------------------------------------------


@pytest.mark.slow
def test_a_padded_finding_yields_a_reproducer_that_cuts_real_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The script embeds the padded tensors (poison included), runs the op on them and compares
    each sample's real rows, as bi_props did: it reproduces against the planted library and not
    against stock rms_norm (a shim of the same name that swaps nothing)."""
    from bi_props.campaigns.records import Finding
    from bi_props.campaigns.session import Session
    from test_repro import run_isolated

    monkeypatch.setenv("PYTHONPATH", str(PLANTED))
    library = "planted_padded_length"
    case = rms_case(32, batch=Batch(0, (Companion(5, 3),)))  # fails in process (above)
    space = replace(load_profile("ci"), example_timeout_s=30.0, start_timeout_s=120.0)
    session = Session(library, space)
    session.report_path = tmp_path / "out" / "report.json"
    try:
        verdict = session.judge("rms_norm", "batch_invariance", "enabled", case)
        assert not verdict.ok, verdict
        finding = Finding(library, "rms_norm", "batch_invariance", "enabled", "mismatch",
                          repr(case), "planted", True)  # fmt: skip
        script = session.write_reproducer(finding, case)
    finally:
        session.close()
    assert script is not None
    text = Path(script).read_text()
    assert "_padded_op" in text and "import bi_props" not in text
    buggy = run_isolated(Path(script), PLANTED)
    assert buggy.returncode == 1 and "REPRODUCES" in buggy.stdout, buggy.stdout + buggy.stderr
    shim = tmp_path / "stock"
    shim.mkdir()
    (shim / f"{library}.py").write_text("def enable(enabled):\n    pass\n")
    fixed = run_isolated(Path(script), shim)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert "does NOT reproduce" in fixed.stdout
