"""Users' own properties: ``bi_props.PropertySpec``, ``register_property`` and a target module's
``EXTRA_PROPERTIES``.

The worked example (docs/properties.md) is ``tests/user_ops/strided_gated.py``: the property
``layout_invariance`` (the needle's output in its drawn memory layout == with contiguous operands,
bitwise), which no built-in property checks, declared by a plain module for the user op
``my_silu_and_mul``; ``strided_gated_buggy.py`` is its planted-bug twin (another order of the
arithmetic for strided rows, within the reference's bound). Both ``bi-props fuzz`` and the pytest
plugin must find and shrink the twin's bug and find nothing in the honest module.
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
from bi_props.model import property_spec
from bi_props.model.case import parse_case

USER_OPS = Path(__file__).parent / "user_ops"
BUDGET_S = 40
CELL = ("my_silu_and_mul", "layout_invariance", "enabled")

SPACE = """
[hypothesis]
max_examples = 30
[runner]
example_timeout_s = 30
start_timeout_s = 120
control_examples = 100
[ops]
include = ["my_silu_and_mul"]
[shapes]
rows = { min = 1, max = 64 }
dim = { min = 0, max = 32 }
boundaries = [16, 32]
[batch]
max_companions = 3
companion_rows = { min = 1, max = 64 }
"""

MODULES = ("fused_gated", "strided_gated", "strided_gated_buggy")


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch):
    """The user modules on sys.path; the registries and the declared targets restored after."""
    from bi_props.targets import module

    monkeypatch.syspath_prepend(str(USER_OPS))
    tables = (
        catalogue.OPS,
        catalogue.ATEN_TO_OP,
        catalogue._ORIGINS,
        property_spec.PROPERTIES,
        property_spec._ORIGINS,
    )
    saved = tuple(dict(table) for table in tables)
    declared = dict(module._DECLARED)
    for name in MODULES:
        sys.modules.pop(name, None)
    yield
    for table, before in zip(tables, saved, strict=True):
        table.clear()
        table.update(before)
    module._DECLARED.clear()
    module._DECLARED.update(declared)
    for name in MODULES:
        sys.modules.pop(name, None)


def test_the_public_api_and_the_built_in_properties_are_records() -> None:
    import bi_props

    assert bi_props.PropertySpec is property_spec.PropertySpec
    assert bi_props.register_property is property_spec.register_property
    assert callable(bi_props.run_op) and callable(bi_props.same_outputs)
    names = ("routing", "reference", "batch_invariance", "row_permutation", "determinism", "parity")
    assert tuple(property_spec.PROPERTIES)[:6] == names
    assert all(isinstance(s, bi_props.PropertySpec) for s in property_spec.PROPERTIES.values())
    assert all(s.description for s in property_spec.PROPERTIES.values())
    controls = {p for p, s in property_spec.PROPERTIES.items() if s.control}
    assert controls == {"batch_invariance", "logprobs", "decode"}
    assert property_spec.PROPERTIES["parity"].both_states
    assert property_spec.PROPERTIES["routing"].needs_hello


def test_registering_a_property_adds_its_cells_and_control(registry) -> None:
    import strided_gated  # registers my_silu_and_mul (fused_gated) and layout_invariance

    from bi_props.catalogue.strategies import PROPERTIES

    assert "layout_invariance" in property_spec.registered_properties()
    assert "layout_invariance" in PROPERTIES  # derived from the registry, not a copy
    import bi_props

    assert "layout_invariance" in bi_props.PROPERTIES
    spec = catalogue.OPS["my_silu_and_mul"]
    assert property_spec.properties_of(spec)[-1] == "layout_invariance"
    cells = catalogue.cells(["my_silu_and_mul", "mm"])
    assert CELL in cells
    assert ("my_silu_and_mul", "layout_invariance", "disabled") not in cells  # the control's
    assert ("my_silu_and_mul", "layout_invariance") in catalogue.controls(["my_silu_and_mul"])
    assert not [c for c in cells if c[0] == "mm" and c[1] == "layout_invariance"]  # ops=(...)
    assert strided_gated.LAYOUT_INVARIANCE.applies_to(spec)


def test_a_property_without_ops_applies_where_opspec_lists_it(registry) -> None:
    import strided_gated

    mine = dataclasses.replace(strided_gated.LAYOUT_INVARIANCE, name="mine", ops=None)
    property_spec.register_property(mine)
    op = dataclasses.replace(
        catalogue.OPS["my_silu_and_mul"], name="gated3", properties=("reference", "mine")
    )
    catalogue.register_op(op)
    assert catalogue.cells(["gated3"]) == [
        ("gated3", "reference", "enabled"),
        ("gated3", "reference", "disabled"),
        ("gated3", "mine", "enabled"),
    ]
    assert catalogue.cells(["my_silu_and_mul"]).count(("my_silu_and_mul", "mine", "enabled")) == 0


def test_the_user_propertys_cases_follow_its_record(registry) -> None:
    import strided_gated  # noqa: F401

    from bi_props.catalogue.strategies import cases
    from bi_props.model.space import parse

    space = parse({"ops": {"include": ["my_silu_and_mul"]}}, "inline", "test")

    @settings(max_examples=30, database=None, suppress_health_check=list(HealthCheck))
    @given(cases(space, "my_silu_and_mul", "layout_invariance"))
    def check(case):
        assert case.values in ("general", "wide") and case.batch is None, case

    check()


def test_duplicate_and_incomplete_declarations_get_one_clear_error(registry) -> None:
    import strided_gated

    spec = strided_gated.LAYOUT_INVARIANCE
    assert property_spec.register_property(spec) is spec  # the same object again: a no-op
    assert property_spec.register_property(dataclasses.replace(spec)) is spec  # equal fields
    with pytest.raises(ValueError) as info:
        property_spec.register_property(dataclasses.replace(spec, name="parity"))
    message = str(info.value)
    assert "'parity' is taken" in message and "built into bi_props" in message  # what, where
    assert "'strided_gated'" in message and "Rename yours" in message  # whose, how to fix
    other = dataclasses.replace(spec, description="another")
    with pytest.raises(ValueError, match="module 'strided_gated' defines a different spec"):
        property_spec.register_property(other)
    with pytest.raises(ValueError) as info:
        property_spec.register_property(
            dataclasses.replace(spec, name="bare", observer=None, switches=("on",))
        )
    assert "observer(case, target) -> dict is missing" in str(info.value)
    assert "switches ('on',)" in str(info.value) and "bare" not in property_spec.PROPERTIES
    with pytest.raises(ValueError, match="a control property"):
        property_spec.register_property(dataclasses.replace(spec, name="c", switches=("enabled",)))
    with pytest.raises(TypeError, match=r"needs a bi_props\.PropertySpec"):
        property_spec.register_property("layout_invariance")  # type: ignore[arg-type]


def test_bad_extra_properties_break_the_target_with_one_message(registry, tmp_path) -> None:
    from bi_props.targets import TargetBroken
    from bi_props.targets.module import ModuleTarget, declare_ops

    (tmp_path / "bad_props.py").write_text(
        "from strided_gated import *\nEXTRA_PROPERTIES = ['layout_invariance']\n"
    )
    (tmp_path / "typo_props.py").write_text(
        "import dataclasses\nfrom strided_gated import *\nimport strided_gated as s\n"
        "EXTRA_PROPERTIES = [dataclasses.replace(s.LAYOUT_INVARIANCE, name='t', ops=('my_sil',))]"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        with pytest.raises(TargetBroken, match="EXTRA_PROPERTIES holds 'layout_invariance', not"):
            ModuleTarget("bad_props").check()
        problem = declare_ops("typo_props")
        assert problem is not None and "names unknown ops ['my_sil']" in problem, problem
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("bad_props", None)
        sys.modules.pop("typo_props", None)


def test_unknown_property_names_get_one_clear_error(registry, tmp_path) -> None:
    import strided_gated  # noqa: F401

    from bi_props.model.known import DataFileError, load_known

    with pytest.raises(KeyError, match="unknown property 'nope'; known: routing, "):
        property_spec.get("nope")
    op = dataclasses.replace(catalogue.OPS["my_silu_and_mul"], name="g4", properties=("nope",))
    with pytest.raises(ValueError, match=r"properties \['nope'\] are unknown.*EXTRA_PROPERTIES"):
        catalogue.register_op(op)
    entry = '[[known]]\ntarget = "strided_gated"\nop = "my_silu_and_mul"\nswitch = "enabled"\n'
    good, bad = tmp_path / "good.toml", tmp_path / "bad.toml"
    good.write_text(entry + 'property = "layout_invariance"\nkind = "mismatch"\n')
    bad.write_text(entry + 'property = "layout_invariants"\nkind = "mismatch"\n')
    assert load_known(good)[0].property == "layout_invariance"
    with pytest.raises(DataFileError, match="'layout_invariants' does not apply to"):
        load_known(bad)


def test_workers_register_the_properties_without_hypothesis_or_pytest() -> None:
    """The worker side of a user property: the module's EXTRA_PROPERTIES are registered where
    the controller registered them (BI_PROPS_OP_MODULES), importing no Hypothesis or pytest."""
    code = (
        "import sys\n"
        "from bi_props.targets.module import declare_from_environment\n"
        "from bi_props.model import property_spec\n"
        "declare_from_environment('cpu')\n"
        "assert 'layout_invariance' in property_spec.PROPERTIES, property_spec.PROPERTIES\n"
        "assert 'hypothesis' not in sys.modules and 'pytest' not in sys.modules\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(USER_OPS), os.environ.get("PYTHONPATH", "")]),
        "BI_PROPS_OP_MODULES": "strided_gated",
    }
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120, env=env)


# -- end to end: bi-props fuzz and the pytest plugin on the user modules -------------------------


@pytest.fixture(scope="module")
def campaigns(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, str, dict]]:
    """Both campaigns at once (each wall-clock budgeted): module -> (exit, log, report)."""
    root = tmp_path_factory.mktemp("user_properties")
    space = root / "space.toml"
    space.write_text(SPACE)
    path = os.pathsep.join([str(USER_OPS), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path}
    running = {}
    for module in ("strided_gated_buggy", "strided_gated"):
        log = (root / f"{module}.log").open("w")
        command = [sys.executable, "-m", "bi_props.cli", "fuzz", "--target", module,
                   "--budget", str(BUDGET_S), "--out", str(root / module),
                   "--strategies", str(space), "--seed", "7"]  # fmt: skip
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        running[module] = (process, log, time.monotonic())
    results = {}
    for module, (process, log, _) in running.items():
        code = process.wait(timeout=BUDGET_S * 6)
        log.close()
        report_file = root / module / "report.json"
        report = json.loads(report_file.read_text()) if report_file.exists() else {}
        markdown = root / module / "report.md"
        report["_markdown"] = markdown.read_text() if markdown.exists() else ""
        results[module] = (code, (root / f"{module}.log").read_text(), report)
    return results


def _listed(report: dict) -> dict[str, dict]:
    return {p["name"]: p for p in report.get("properties", [])}


@pytest.mark.campaign
@pytest.mark.slow
def test_fuzz_finds_and_shrinks_a_user_property_violation(campaigns) -> None:
    code, log, report = campaigns["strided_gated_buggy"]
    assert code == 1, log[-3000:]
    assert "Traceback" not in log, log[-3000:]
    found = [f for f in report["findings"] if (f["op"], f["property"], f["switch"]) == CELL]
    assert found, [(f["op"], f["property"], f["switch"]) for f in report["findings"]]
    finding = found[0]
    assert finding["kind"] == "mismatch" and "all contiguous (desired)" in finding["message"]
    assert finding["reproduced_in_fresh_process"] is True, finding["confirmation"]
    case = parse_case(finding["case"])
    assert case.layouts == ("strided",) and case.batch is None, case  # the planted condition
    complete = finding["shrink"] == "complete"
    # (or, while cells have not had their first turn, where it leaves them time: scheduler.py)
    assert complete or finding["shrink"].startswith("stopped "), finding["shrink"]
    if complete:  # a row or two of h = 1 or 2
        assert case.shape[0] * case.shape[1] <= 4, case
    # Only the new property sees it: the bug is batch-invariant and within the reference bound.
    assert {f["property"] for f in report["findings"]} == {"layout_invariance"}, report["findings"]
    assert "layout_invariance" in _listed(report)
    assert "memory layout" in _listed(report)["layout_invariance"]["description"]
    assert not _listed(report)["layout_invariance"]["builtin"]
    markdown = report["_markdown"]
    assert "## Properties declared outside bi_props" in markdown
    assert "- `layout_invariance`: the needle's output" in markdown
    assert "my_silu_and_mul layout_invariance [enabled]" in markdown


@pytest.mark.campaign
@pytest.mark.slow
def test_fuzz_gives_no_finding_for_the_honest_module_and_runs_its_control(campaigns) -> None:
    code, log, report = campaigns["strided_gated"]
    assert code == 0, (report.get("findings"), log[-3000:])
    assert report["findings"] == []
    ran = {(c["op"], c["property"], c["switch"]) for c in report["cells"] if c["examples"]}
    assert CELL in ran, ran
    controls = {c["property"]: c for c in report["controls"]}
    # Switch off, the property is searched as a negative control (the stock composite is
    # layout-variant on some shapes), never judged as a cell.
    assert controls["layout_invariance"]["examples"] > 0, controls
    assert ("my_silu_and_mul", "layout_invariance", "disabled") not in ran
    assert "layout_invariance" in _listed(report) and "batch_invariance" in _listed(report)


PROPERTY_TESTS = (
    "from bi_props.suite.test_properties import test_batch_variance_control, test_property\n"
)


def _suite(pytester: pytest.Pytester, monkeypatch, target: str) -> pytest.RunResult:
    path = os.pathsep.join([str(USER_OPS), os.environ.get("PYTHONPATH", "")])
    monkeypatch.setenv("PYTHONPATH", path)
    # More examples than the campaign's per-turn 30: one layout in four is the planted one.
    pytester.makefile(".toml", space=SPACE.replace("max_examples = 30", "max_examples = 300"))
    pytester.makepyfile(test_props=PROPERTY_TESTS)
    return pytester.runpytest_subprocess(
        "--bi-target", target, "--bi-strategies=space.toml", "--bi-report", "report.json",
        "-p", "no:cacheprovider", "-k", "layout_invariance", timeout=300,
    )  # fmt: skip


@pytest.mark.slow
def test_the_pytest_plugin_runs_a_user_property(pytester: pytest.Pytester, monkeypatch) -> None:
    buggy = _suite(pytester, monkeypatch, "strided_gated_buggy")
    text = buggy.stdout.str()
    buggy.assert_outcomes(failed=1, passed=1)  # the enabled cell fails; the control passes
    assert "test_property[my_silu_and_mul-layout_invariance-enabled] FAILED" in text or (
        "FAILED test_props.py::test_property[my_silu_and_mul-layout_invariance-enabled]" in text
    ), text[-3000:]
    report = json.loads((pytester.path / "report.json").read_text())
    found = [f for f in report["findings"] if (f["op"], f["property"], f["switch"]) == CELL]
    assert found and parse_case(found[0]["case"]).layouts != ("contiguous",), report["findings"]
    assert "layout_invariance" in _listed(report)
    honest = _suite(pytester, monkeypatch, "strided_gated")
    honest.assert_outcomes(passed=2)


def test_the_docs_show_the_worked_example_verbatim() -> None:
    docs = (Path(__file__).parents[1] / "docs" / "properties.md").read_text()
    for module in ("strided_gated.py", "strided_gated_buggy.py"):
        assert (USER_OPS / module).read_text() in docs, f"docs/properties.md: update {module}"


def test_an_observer_returning_the_wrong_shape_says_what_it_must_return(registry) -> None:
    import strided_gated

    from bi_props.execution.execute import observe
    from bi_props.model.case import Case

    bad = dataclasses.replace(strided_gated.LAYOUT_INVARIANCE, name="bad", observer=lambda c, t: {})
    property_spec.register_property(bad)
    case = Case("my_silu_and_mul", "strided_gated.silu_and_mul", "float32", (1, 1), ("strided",),
                "general", 0)  # fmt: skip
    with pytest.raises(TypeError, match="observer of property 'bad' returned dict with keys"):
        observe("bad", case, None, "enabled")  # type: ignore[arg-type]
