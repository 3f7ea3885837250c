"""Localizing a model-level finding: the per-op tape (execution/tape.py), its alignment, the
finding's lines and the op-level reproducer (reporting/op_repro.py, campaigns/localize.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from bi_props.campaigns.localize import localize as localize_finding
from bi_props.execution.tape import Geometry, Tape, _dispatch_mode, align
from bi_props.model.case import Batch, Case, Companion
from bi_props.runner.controller import Runner

PLANTED = Path(__file__).parent / "planted"


@torch.library.custom_op("bi_props_localize_test::variant", mutates_args=())
def variant(x: torch.Tensor) -> torch.Tensor:
    """Batch-variant on purpose: another rounding above 4 rows."""
    return x * (1.0 + 2.0**-20) if x.shape[0] > 4 else x.clone()


@torch.library.custom_op("bi_props_localize_test::invariant", mutates_args=())
def invariant(x: torch.Tensor) -> torch.Tensor:
    return x * 2.0


def _tape(model, x: torch.Tensor) -> Tape:
    tape = Tape()
    with torch.no_grad(), _dispatch_mode(tape):
        model(x)
    return tape


def test_the_batch_variant_op_is_named_not_its_consequence():
    def model(x):  # invariant, then the variant op, then a consequence
        return torch.exp(variant(invariant(x)) * 3.0)

    x = torch.randn(8, 5)
    found = align(_tape(model, x[3:5]), _tape(model, x), Geometry(rows=2, total=8, offset=3))
    assert found["cause"].batch.name == "bi_props_localize_test::variant"
    assert found["first_output"].batch.name == "bi_props_localize_test::variant"
    assert found["inside"] is None


def test_nothing_is_named_when_every_op_is_invariant():
    def model(x):
        return torch.exp(invariant(x) * 3.0)

    x = torch.randn(8, 5)
    found = align(_tape(model, x[3:5]), _tape(model, x), Geometry(rows=2, total=8, offset=3))
    assert found["cause"] is None and found["first_output"] is None


# -- the probe model in a worker, the finding's lines, the op-level reproducer ---------------------


@pytest.fixture
def planted_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    paths = [str(PLANTED), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, paths)))


def model_case(entry: str = "packed", companions=((7, 9), (8, 12))) -> Case:
    """A needle of 5 tokens (2 layers, hidden 16, vocab 64, intermediate 48) at position 1."""
    return Case(
        "probe_model",
        entry,
        "float32",
        (5, 2, 2, 1, 8, 64, 48),
        ("contiguous", "contiguous"),
        "general",
        1,
        batch=Batch(1, tuple(Companion(seed, rows) for seed, rows in companions)),
    )


def localized(target: str, case: Case, tmp_path: Path) -> tuple[list[str], str | None]:
    runner = Runner(target, start_timeout_s=120, fork=False)
    space = SimpleNamespace(start_timeout_s=120.0, example_timeout_s=120.0)
    session = SimpleNamespace(
        target=target,
        runner=runner,
        report_path=tmp_path / "report.json",
        hello=runner.hello,
        space=space,
        _worker_env=dict,
    )
    try:
        return localize_finding(session, case, 0)
    finally:
        runner.close()


def run_script(path: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(PLANTED), *sys.path])}
    return subprocess.run(
        [sys.executable, path], capture_output=True, text=True, timeout=300, env=env
    )


@pytest.mark.slow
@pytest.mark.parametrize("entry", ["packed", "mixed"])
def test_the_planted_silu_is_the_first_diverging_op(planted_on_path, tmp_path, entry):
    lines, script = localized("planted_model_bug", model_case(entry), tmp_path)
    text = "\n".join(lines)
    assert "first diverging op: aten::silu (layer 0: o-proj + MLP;" in text, text
    assert "catalogue op silu, kernel aten::silu" in text and "::silu for silu" in text, text
    assert "a path chosen by size" in text, text  # the kernel ran other ops in the batch
    assert "bi-props fuzz --ops silu" in text, text
    assert lines[-1].endswith("fails standalone (exit 1 in a fresh interpreter)"), text
    assert script is not None and Path(script).with_suffix(".pt").is_file()
    done = run_script(script)
    assert done.returncode == 1 and "REPRODUCES" in done.stdout, done.stdout + done.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    ("target", "named", "details"),
    [
        (  # every F.linear: aten::mm, first met in layer 0's QKV projection
            "planted_model_linear_bug",
            "aten::mm (layer 0: norm + QKV;",
            # the kernel that ran: the target's own alone, a stock path in the batch
            ["catalogue op mm", "(alone: planted_model_linear_bug::mm)"],
        ),
        (  # a catalogue entry, and the custom op inside it
            "planted_model_norm_bug",
            "entry:add_rms_norm (layer 0: norm + QKV;",
            [
                "catalogue op add_rms_norm, kernel planted_model_norm_bug::variant_add_rms_norm",
                "inside it: planted_model_norm_bug::variant_add_rms_norm.default",
            ],
        ),
    ],
)
def test_a_planted_bug_elsewhere_in_the_forward_is_named(
    planted_on_path, tmp_path, target, named, details
):
    lines, script = localized(target, model_case(), tmp_path)
    text = "\n".join(lines)
    assert f"first diverging op: {named}" in text, text
    assert all(d in text for d in details), text
    assert lines[-1].endswith("fails standalone (exit 1 in a fresh interpreter)"), text
    assert run_script(script).returncode == 1


@pytest.mark.slow
def test_nothing_to_localize_where_no_op_varies(planted_on_path, tmp_path):
    # the decode layout of three one-token steps: silu sees 3 x 48 elements, under the switch
    lines, script = localized("planted_model_bug", model_case("decode"), tmp_path)
    assert script is None
    assert lines[-1] == "first diverging op: none: no op's needle rows differ in the replay"
    # and bi_props's own correct kernels: nothing in the packed layout either
    lines, script = localized("cpu", model_case(), tmp_path)
    assert script is None and lines[-1].endswith("no op's needle rows differ in the replay")
