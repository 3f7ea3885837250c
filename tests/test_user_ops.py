"""Users' own ops: ``bi_props.OpSpec``, ``register_op`` and a target module's ``EXTRA_OPS``.

The worked example (docs/ops.md) is ``tests/user_ops/fused_gated.py``: SwiGLU's fused
``silu_and_mul`` (op ``my_silu_and_mul``) declared by a plain module outside bi_props, with a
batch-invariant CPU kernel;
``fused_gated_buggy.py`` is its planted-bug twin (bf16 arithmetic above 16 rows). ``bi-props fuzz``
must find and shrink the twin's bug and find nothing in the honest module.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from bi_props import catalogue
from bi_props.model.case import parse_case

USER_OPS = Path(__file__).parent / "user_ops"
PLANTED = Path(__file__).parent / "planted"
BUDGET_S = 40
# The buggy module spends its budget (its first finding can be a reference mismatch of the same
# kernel, before batch invariance's); the honest one stops on its evidence.
STOP = {"fused_gated_buggy": [], "fused_gated": ["--examples-per-cell", "30"]}

SPACE = """
[hypothesis]
max_examples = 10
[runner]
example_timeout_s = 30
start_timeout_s = 120
control_examples = 100
[shapes]
rows = { min = 1, max = 64 }
dim = { min = 0, max = 32 }
boundaries = [16, 32]
[batch]
max_companions = 3
companion_rows = { min = 1, max = 64 }
"""


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch):
    """The user modules on sys.path; the catalogue and the declared targets restored after."""
    from bi_props.targets import module

    monkeypatch.syspath_prepend(str(USER_OPS))
    monkeypatch.syspath_prepend(str(PLANTED))
    tables = (catalogue.OPS, catalogue.ATEN_TO_OP, catalogue._ORIGINS)
    saved = tuple(dict(table) for table in tables)
    declared = dict(module._DECLARED)
    yield
    for table, before in zip(tables, saved, strict=True):
        table.clear()
        table.update(before)
    module._DECLARED.clear()
    module._DECLARED.update(declared)
    for name in ("fused_gated", "fused_gated_buggy"):
        sys.modules.pop(name, None)


def test_the_catalogue_imports_neither_torch_nor_hypothesis() -> None:
    code = (
        "import sys, bi_props.catalogue, bi_props.model.space, bi_props.targets.module; "
        "assert 'torch' not in sys.modules and 'hypothesis' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_the_worker_side_imports_neither_hypothesis_nor_pytest() -> None:
    """Every module of bi_props.execution and the worker's entry point, as a worker imports them."""
    code = (
        "import importlib, pkgutil, sys, bi_props.execution, bi_props.runner.worker\n"
        "for m in pkgutil.iter_modules(bi_props.execution.__path__, 'bi_props.execution.'):\n"
        "    importlib.import_module(m.name)\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('hypothesis', 'pytest', '_pytest')]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_the_public_api() -> None:
    import bi_props

    for name in ("OpSpec", "Operand", "Reference", "register_op", "ShapeContext", "sum_error"):
        assert getattr(bi_props, name) is not None
    assert bi_props.OpSpec is catalogue.OpSpec
    assert all(isinstance(spec, catalogue.OpSpec) for spec in catalogue.OPS.values())


def test_register_op_adds_the_op_and_its_aten_names(registry) -> None:
    import fused_gated

    spec = dataclasses.replace(fused_gated.SILU_AND_MUL, name="gated2", aten_names=("x::g",))
    assert catalogue.register_op(spec) is spec
    assert catalogue.OPS["gated2"] is spec and catalogue.ATEN_TO_OP["x::g"] == "gated2"
    assert "gated2" in catalogue.registered_ops() and "mm" not in catalogue.registered_ops()


def test_registering_the_identical_spec_again_is_a_no_op(registry) -> None:
    import fused_gated

    before = list(catalogue.OPS)
    assert catalogue.register_op(fused_gated.SILU_AND_MUL) is fused_gated.SILU_AND_MUL
    equal = dataclasses.replace(fused_gated.SILU_AND_MUL)  # another object, the same fields
    assert catalogue.register_op(equal) is fused_gated.SILU_AND_MUL
    assert list(catalogue.OPS) == before


def test_a_name_collision_raises_one_clear_error(registry) -> None:
    import fused_gated

    taken = dataclasses.replace(fused_gated.SILU_AND_MUL, name="mm")
    with pytest.raises(ValueError) as info:
        catalogue.register_op(taken)
    message = str(info.value)
    assert "'mm' is taken" in message and "built into bi_props" in message  # what, where
    assert "'fused_gated'" in message and "Rename yours" in message  # whose, how to fix
    other = dataclasses.replace(fused_gated.SILU_AND_MUL, bound="another bound")
    with pytest.raises(ValueError, match="module 'fused_gated' defines a different spec"):
        catalogue.register_op(other)
    assert catalogue.OPS["mm"].entries == ("torch.mm", "Tensor.mm")


def test_an_incomplete_spec_is_refused_with_what_is_missing(registry) -> None:
    import fused_gated

    bare = dataclasses.replace(
        fused_gated.SILU_AND_MUL, name="bare", draw_shape=None, aten_names=("aten::mm",)
    )
    with pytest.raises(ValueError) as info:
        catalogue.register_op(bare)
    assert "draw_shape" in str(info.value) and "aten::mm" in str(info.value)
    assert "bare" not in catalogue.OPS


def test_extra_ops_are_registered_when_the_target_module_loads(registry) -> None:
    from bi_props.targets.module import ModuleTarget, declare_ops, declared_modules

    catalogue.OPS.pop("my_silu_and_mul", None)
    assert declare_ops("fused_gated_buggy") is None
    assert "my_silu_and_mul" in catalogue.OPS and "fused_gated_buggy" in declared_modules()
    target = ModuleTarget("fused_gated_buggy")
    target.check()
    assert target.covered() == ("my_silu_and_mul",)
    assert target.entries() == {"my_silu_and_mul": ("fused_gated_buggy.silu_and_mul",)}
    assert declare_ops("no_such_module_here").startswith("target module 'no_such_module_here'")


def test_workers_register_the_ops_the_controller_registered(registry, monkeypatch) -> None:
    """A campaign over several targets draws each module's ops for every target: the workers
    of the others register them too (BI_PROPS_OP_MODULES)."""
    from bi_props.runner.controller import Worker
    from bi_props.targets.module import OP_MODULES_ENV, declare_from_environment, declare_ops

    assert declare_ops("fused_gated") is None
    env = Worker("cpu", "enabled").environment()
    assert "fused_gated" in env[OP_MODULES_ENV].split(",")
    catalogue.OPS.pop("my_silu_and_mul")
    sys.modules.pop("fused_gated")
    from bi_props.targets import module

    module._DECLARED.clear()
    monkeypatch.setenv(OP_MODULES_ENV, "fused_gated")
    declare_from_environment("cpu")
    assert "my_silu_and_mul" in catalogue.OPS


def test_an_unknown_op_in_ops_still_gets_the_clear_error(registry) -> None:
    from bi_props.targets import TargetBroken
    from bi_props.targets.module import ModuleTarget

    with pytest.raises(TargetBroken) as info:
        ModuleTarget("planted_unknown_op").check()
    message = str(info.value)
    assert "OPS names unknown ops ['flash_mm']" in message and "EXTRA_OPS" in message


def test_a_space_may_name_a_target_modules_ops(registry, tmp_path: Path) -> None:
    from bi_props.model.space import SpaceError, load

    good = tmp_path / "good.toml"
    good.write_text(
        '[op.my_silu_and_mul]\ndim = { min = 1, max = 8 }\n[ops]\ninclude = ["my_silu_and_mul"]\n'
        '[profile]\ntarget = "fused_gated"\n'  # the target's ops count in every section
    )
    space = load(good)
    assert space.ops == ("my_silu_and_mul",) and space.dim_for("my_silu_and_mul").max == 8
    bad = tmp_path / "bad.toml"
    bad.write_text('[ops]\ninclude = ["my_silu_and_mul", "nope"]\n')
    with pytest.raises(SpaceError, match=r"key 'ops.include': unknown \['nope'\]"):
        load(bad)
    from bi_props.targets.module import declare_ops

    declare_ops("another_missing_kernels")  # failed earlier in this process: no reason here
    missing = tmp_path / "missing.toml"
    missing.write_text('[profile]\ntarget = "no_such_kernels"\n[ops]\ninclude = ["gated9"]\n')
    with pytest.raises(SpaceError) as info:
        load(missing)
    assert "unknown ['gated9']" in str(info.value)
    assert "EXTRA_OPS not read from target module no_such_kernels" in str(info.value)
    assert "another_missing_kernels" not in str(info.value)


def test_the_user_ops_draw_shape_gives_valid_cases(registry) -> None:
    import fused_gated  # noqa: F401  (registers my_silu_and_mul)

    from bi_props.catalogue.strategies import cases
    from bi_props.model.space import parse

    space = parse({"shapes": {"rows": {"min": 1, "max": 40}}}, "inline", "test")
    assert "my_silu_and_mul" in space.ops  # a registered op joins the default ops

    @settings(max_examples=30, database=None, suppress_health_check=list(HealthCheck))
    @given(cases(space, "my_silu_and_mul", "batch_invariance"))
    def check(case):
        m, h = case.shape
        assert 1 <= m <= 4 and h >= 0 and case.batch is not None
        assert catalogue.OPS["my_silu_and_mul"].operand_shapes(case, m) == ((m, 2 * h),)

    check()


# -- end to end: bi-props fuzz on the user modules ----------------------------------------------


@pytest.fixture(scope="module")
def campaigns(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, str, dict]]:
    """Both campaigns at once: module -> (exit, log, report). The honest module's stops once
    every cell ran 30 examples (``--examples-per-cell``): evidence of a stated size on any load,
    the budget as the cap."""
    root = tmp_path_factory.mktemp("user_ops")
    space = root / "space.toml"
    space.write_text(SPACE)
    path = os.pathsep.join([str(USER_OPS), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path}
    running = {}
    for module in ("fused_gated_buggy", "fused_gated"):
        log = (root / f"{module}.log").open("w")
        command = [sys.executable, "-m", "bi_props.cli", "fuzz", "--target", module,
                   "--ops", "my_silu_and_mul", "--budget", str(BUDGET_S), "--out",
                   str(root / module), "--strategies", str(space), "--seed", "7"]  # fmt: skip
        command += STOP[module]
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        running[module] = (process, log, time.monotonic())
    results = {}
    for module, (process, log, _) in running.items():
        code = process.wait(timeout=BUDGET_S * 6)
        log.close()
        report_file = root / module / "report.json"
        report = json.loads(report_file.read_text()) if report_file.exists() else {}
        results[module] = (code, (root / f"{module}.log").read_text(), report)
    return results


@pytest.mark.campaign
@pytest.mark.slow
def test_fuzz_finds_and_shrinks_the_planted_bug_in_a_user_op(campaigns) -> None:
    code, log, report = campaigns["fused_gated_buggy"]
    assert code == 1, log[-3000:]
    assert "Traceback" not in log, log[-3000:]
    found = [
        f
        for f in report["findings"]
        if (f["op"], f["property"], f["switch"])
        == ("my_silu_and_mul", "batch_invariance", "enabled")
    ]
    assert found, [(f["op"], f["property"], f["switch"]) for f in report["findings"]]
    finding = found[0]
    assert finding["reproduced_in_fresh_process"] is True
    case = parse_case(finding["case"])
    rows = case.shape[0] + sum(c.rows for c in case.batch.companions)
    assert rows > 16, finding["case"]  # the planted condition: more than THRESHOLD rows
    complete = finding["shrink"] == "complete"
    # (or, while cells have not had their first turn, where it leaves them time: scheduler.py)
    assert complete or finding["shrink"].startswith("stopped "), finding["shrink"]
    if complete:  # shrunk to just past the threshold, the smallest h and one companion
        assert rows == 17 and case.shape[1] <= 1 and len(case.batch.companions) == 1, case
    assert finding.get("reproducer"), finding  # a standalone script for the upstream issue


@pytest.mark.campaign
@pytest.mark.slow
def test_fuzz_gives_no_finding_for_the_honest_user_op(campaigns) -> None:
    code, log, report = campaigns["fused_gated"]
    assert code == 0, (report.get("findings"), log[-3000:])
    assert report["findings"] == []
    stopped = report["campaign"].get("stopped_early", "")
    assert "--examples-per-cell 30" in stopped, stopped  # its evidence, not whatever time bought
    assert all(c["examples_this_run"] >= 30 or c["retired"] for c in report["cells"]), report
    ran = {(c["op"], c["property"], c["switch"]) for c in report["cells"] if c["examples"]}
    assert ("my_silu_and_mul", "batch_invariance", "enabled") in ran, ran


def test_the_docs_show_the_worked_example_verbatim() -> None:
    docs = (Path(__file__).parents[1] / "docs" / "ops.md").read_text()
    for module in ("fused_gated.py", "fused_gated_buggy.py"):
        assert (USER_OPS / module).read_text() in docs, f"docs/ops.md: update the copy of {module}"
