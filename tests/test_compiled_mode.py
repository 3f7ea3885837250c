"""Compiled mode (``Case.mode``): cases called through ``torch.compile`` as serving engines call
a model, the ``inductor`` target (PyTorch's own switch), and what a run says about modes.

The rules and the records run here in milliseconds; a compiled call costs seconds of Inductor
compile, so the worker tests are few and small, and the campaigns (a planted library whose
kernel is bypassed once compiled, a library that declares compile unsupported, the ``inductor``
target) are in the campaign lane.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import find, given, settings
from hypothesis import strategies as st

from bi_props.catalogue.strategies import cases, near
from bi_props.model.case import MODES, Batch, Case, Companion, case_class, parse_case
from bi_props.model.modes import CompileStats, effective_modes, mode_lines, settle_mode
from bi_props.model.space import SpaceError, load_profile, parse
from bi_props.model.target import BUILTIN_TARGETS, Target

PLANTED = Path(__file__).parent / "planted"


def mm_case(mode: str = "eager", rows: int = 2) -> Case:
    return Case(
        "mm", "torch.mm", "float32", (rows, 33, 5), ("contiguous", "contiguous"), "general", 3,
        batch=Batch(0, (Companion(7, 40),)), mode=mode,
    )  # fmt: skip


# -- the record ---------------------------------------------------------------------------------


def test_a_case_carries_its_mode_and_says_it_only_when_compiled() -> None:
    eager, compiled = mm_case(), mm_case("compiled")
    assert "mode=" not in repr(eager)  # reprs of every earlier report still read the same
    assert repr(compiled).endswith("mode='compiled')")
    assert parse_case(repr(compiled)) == compiled and parse_case(repr(eager)) == eager
    assert eager != compiled and hash(eager) != hash(compiled)
    assert eager.with_batch(None).mode == "eager" and compiled.with_padded(4).mode == "compiled"
    # another program is another failure class; eager classes are unchanged
    assert case_class(eager) == "float32/contiguous/finite/medium"
    assert case_class(compiled) == "float32/contiguous/finite/medium/compiled"
    assert MODES == ("eager", "compiled")


def test_the_space_asks_for_modes_eager_first_and_eager_only_by_default() -> None:
    assert load_profile("cpu").modes == ("eager",) and load_profile("ci").modes == ("eager",)
    space = parse({"modes": {"choices": ["compiled", "eager"]}}, "x.toml", "x")
    assert space.modes == ("eager", "compiled")  # MODES' order: shrinking goes to eager
    with pytest.raises(SpaceError, match=r"modes.choices.*unknown \['jit'\]"):
        parse({"modes": {"choices": ["jit"]}}, "x.toml", "x")


def test_effective_modes_narrow_to_the_target_and_say_why_not() -> None:
    both = ("eager", "compiled")
    assert effective_modes(both, both) == (both, {})
    drawn, na = effective_modes(both, ("eager",), {"compiled": "no fake kernels"})
    assert drawn == ("eager",) and na == {"compiled": "no fake kernels"}
    drawn, na = effective_modes(("eager",), ("compiled",), {"eager": "config of the compiler"})
    assert drawn == ("compiled",) and na == {"eager": "config of the compiler"}  # forced
    drawn, na = effective_modes(both, ("eager",))
    assert "does not list it" in na["compiled"]  # never silent, even without a reason
    with pytest.raises(ValueError):
        effective_modes(both, ())


def test_a_case_is_settled_into_a_mode_the_target_supports() -> None:
    case = mm_case()
    assert settle_mode(case, ("compiled",), ("compiled",)).mode == "compiled"
    assert settle_mode(case, ("eager",), both := ("eager", "compiled")) is case
    compiled = mm_case("compiled")
    assert settle_mode(compiled, ("eager",), both) is compiled  # a regression's compiled case
    assert settle_mode(compiled, ("eager",), ("eager",)).mode == "eager"


# -- the strategies -----------------------------------------------------------------------------


def _space(*modes: str):
    return parse(
        {"modes": {"choices": list(modes)}, "ops": {"include": ["mm"]}}, "x.toml", "x"
    )  # fmt: skip


def test_cases_draw_the_modes_of_the_space_and_shrink_to_eager() -> None:
    space = _space("eager", "compiled")
    strategy = cases(space, "mm", "batch_invariance")
    assert find(strategy, lambda c: True).mode == "eager"
    assert find(strategy, lambda c: c.mode == "compiled").mode == "compiled"
    only = cases(_space("compiled"), "mm", "reference")
    assert find(only, lambda c: True).mode == "compiled"


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_an_eager_only_space_draws_eager_cases(data) -> None:
    case = data.draw(cases(_space("eager"), "mm", "batch_invariance"))
    assert case.mode == "eager"


def test_a_neighbour_of_a_known_case_may_change_mode() -> None:
    base = mm_case()
    space = _space("eager", "compiled")
    assert find(near(base, space), lambda c: True).mode == "eager"  # shrinks to its base
    assert find(near(base, space), lambda c: c.mode == "compiled").mode == "compiled"


# -- the reports --------------------------------------------------------------------------------


def test_compile_time_is_counted_apart_and_reported() -> None:
    stats = CompileStats()
    stats.add("mm", {"compile": {"seconds": 2.5, "graphs": 1}})
    stats.add("mm", {"compile": {"seconds": 0.0, "graphs": 0}})
    stats.add("sum", {})  # an eager observation: nothing
    merged = stats.merge(CompileStats(1.0, 1, 1, {"sum": {"seconds": 1.0, "graphs": 1,
                                                         "examples": 1}}))  # fmt: skip
    out = merged.to_json()
    assert out["seconds"] == 3.5 and out["graphs"] == 2 and out["examples"] == 3
    assert out["per_op"]["mm"] == {"seconds": 2.5, "graphs": 1, "examples": 2}
    report = {
        "modes": {
            "drawn": ["compiled"],
            "not_applicable": [{"mode": "eager", "reason": "the switch is Inductor's config"}],
        },
        "compile": out,
    }
    lines = mode_lines(report)
    assert lines[0].startswith("Modes drawn: compiled; compile: 2 graph(s) in 3.5 s")
    assert "not counted as kernel time" in lines[0]
    assert lines[1] == "MODE NOT APPLICABLE: eager: the switch is Inductor's config"
    assert mode_lines({"modes": {"drawn": ["eager"], "not_applicable": []}}) == []


def test_a_call_that_is_not_one_graph_is_reported_piecewise() -> None:
    stats = CompileStats()
    why = "Can't convert torch._check*() message closure"
    stats.add("attention", {"compile": {"seconds": 1.0, "graphs": 3, "piecewise": why}})
    stats.add("attention", {"compile": {"seconds": 0.0, "graphs": 0, "piecewise": "later"}})
    merged = CompileStats().merge(stats).to_json()
    assert merged["piecewise"] == {"attention": why}  # the first reason seen
    lines = mode_lines({"modes": {"drawn": ["compiled"]}, "compile": merged})
    assert any(line.startswith("compiled piecewise") and why in line for line in lines)


def test_a_reproducer_of_a_compiled_finding_compiles_the_same_way() -> None:
    from bi_props.execution.execute import export
    from bi_props.reporting import repro

    class Cpu:
        device = "cpu"

        def precision(self, op: str) -> str:
            return "float32"

    finding = {"target": "cpu", "property": "determinism", "switch": "enabled", "kind": "mismatch"}
    texts = {}
    for mode in MODES:
        case = mm_case(mode)
        texts[mode] = repro.script(finding, case, export("determinism", case, Cpu()), {})
    line = 'op = torch.compile(op, backend="inductor", dynamic=True, fullgraph=True)'
    assert line in texts["compiled"] and "torch.compile" not in texts["eager"]
    compile(texts["compiled"], "repro.py", "exec")  # it is Python
    from bi_props.execution.compiled import COMPILE_OPTIONS

    assert COMPILE_OPTIONS == {"backend": "inductor", "dynamic": True, "fullgraph": True}


# -- targets ------------------------------------------------------------------------------------


def test_targets_declare_their_modes() -> None:
    assert Target().modes() == ("eager", "compiled") and Target().unsupported_modes() == {}
    assert BUILTIN_TARGETS["inductor"] == "bi_props.targets.inductor:InductorTarget"
    from bi_props.targets.inductor import InductorTarget, backends

    target = InductorTarget()
    assert target.modes() == ("compiled",)
    assert "eager call never reads it" in target.unsupported_modes()["eager"]
    assert "engine" not in target.covered() and "mm" in target.covered()
    assert set(target.unobservable()) == set(target.covered())  # declared, with the reason
    assert "batch_invariant = True" in target.repro_setup(True)
    assert "batch_invariant = False" in target.repro_setup(False)
    assert set(backends()) == {"C++ compiler (CPU)", "Triton (GPU)"}
    assert backends()["C++ compiler (CPU)"].startswith(("yes: ", "NO: "))


def test_a_module_declares_its_modes(tmp_path, monkeypatch) -> None:
    from bi_props.targets import TargetBroken
    from bi_props.targets.module import ModuleTarget

    monkeypatch.syspath_prepend(str(PLANTED))
    eager_only = ModuleTarget("planted_eager_only")
    eager_only.check()
    assert eager_only.modes() == ("eager",)
    assert "not meant to run under torch.compile" in eager_only.unsupported_modes()["compiled"]
    bypass = ModuleTarget("planted_compile_bypass")
    bypass.check()
    assert bypass.modes() == ("eager", "compiled")
    (tmp_path / "bad_modes_lib.py").write_text(
        "OPS = ['mm']\nMODES = ['jit']\ndef enable(enabled):\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(TargetBroken, match="MODES must be a non-empty list"):
        ModuleTarget("bad_modes_lib").check()


def test_doctor_says_which_inductor_backends_are_here(capsys) -> None:
    from bi_props.doctor import doctor

    status = doctor("inductor")
    out = capsys.readouterr().out
    assert "Inductor backends:" in out and "C++ compiler (CPU): " in out
    assert "Triton (GPU): " in out
    assert ("inductor_batch_invariant: True" in out) == (status == 0)


# -- one worker: routing under compile, compile time apart, a fresh compile ---------------------


def test_routing_under_compile_sees_the_cpu_targets_own_bypass() -> None:
    """The built-in cpu target re-registers aten::mm on the CPU key: eagerly its kernel runs;
    compiled, Inductor calls aten::mm.out (stock) and the kernel is bypassed. Compile time is
    measured apart from the kernel's; a worker started with the fresh-compile variable compiles
    with caches of its own and autotuning distorted (determinism across compiles)."""
    from bi_props.execution.compiled import FRESH_ENV
    from bi_props.model.property_spec import get
    from bi_props.runner.controller import Runner

    runner = Runner("cpu", modes=("eager", "compiled"), start_timeout_s=300)
    fresh = Runner("cpu", modes=("eager", "compiled"), start_timeout_s=300, fork=False,
                   extra_env={FRESH_ENV: "1"})  # fmt: skip
    try:
        hello = runner.hello("enabled")
        judge = get("routing").judge
        eager = runner.observe("routing", mm_case(), "enabled")
        assert judge(eager, hello, "mm").ok and "compile" not in eager.evidence
        started = time.perf_counter()
        compiled = runner.observe("routing", mm_case("compiled"), "enabled")
        wall = time.perf_counter() - started
        verdict = judge(compiled, hello, "mm")
        assert not verdict.ok and verdict.message.startswith("under torch.compile")
        assert "bi_props_cpu::mm" in verdict.message
        assert compiled.evidence["compile"]["graphs"] >= 1
        # compile time apart: the routing call compiled first, and its kernel time excludes it
        # (the two together fit in the round trip; counted twice they would not)
        compile_s = compiled.evidence["compile"]["seconds"]
        assert compile_s > 0 and compiled.seconds + compile_s <= wall
        assert compiled.evidence["compiled_regions"] >= 1
        assert runner.compile_stats.examples == 1 and runner.compile_stats.seconds > 0
        other = fresh.observe("determinism", mm_case("compiled"), "enabled")
        first = runner.observe("determinism", mm_case("compiled"), "enabled")
        state = other.evidence["compile"]
        assert state["force_disable_caches"] is True
        assert "bi_props_fresh_inductor_" in state["cache_dir"]
        assert state["distort_benchmarking_result"] in ("inverse", "not in this torch")
        # the same bits from a fresh compile in another process
        assert get("determinism").judge(other).ok
        assert other.calls["first"].outputs[0].bits.tobytes() == (
            first.calls["first"].outputs[0].bits.tobytes()
        )
    finally:
        runner.close()
        fresh.close()
    assert not os.path.exists(state["cache_dir"])  # removed when its worker ended


@pytest.mark.campaign
def test_attention_compiles_piecewise_and_says_why() -> None:
    """The attention composite reads its cu_seqlens on the host: not one graph. Its entry point is
    looked up through sys.modules (Dynamo traces that, not importlib), its key compiled piecewise,
    each observation naming Dynamo's reason, and the result the eager call's contract."""
    from bi_props.model.property_spec import get
    from bi_props.runner.controller import Runner

    case = Case("attention", "bi_props.ops.varlen_attention", "float32", (3, 2, 1, 8),
                ("contiguous",) * 3, "general", 5,
                batch=Batch(0, (Companion(9, 2),)))  # fmt: skip
    runner = Runner("cpu", modes=("eager", "compiled"), start_timeout_s=300)
    try:
        eager = runner.observe("reference", case, "disabled")
        compiled = runner.observe("reference", replace(case, mode="compiled"), "disabled")
    finally:
        runner.close()
    assert not eager.calls["op"].raised and not compiled.calls["op"].raised
    assert compiled.evidence["compile"]["piecewise"]  # Dynamo's reason, in every observation
    assert get("reference").judge(compiled).ok
    assert runner.compile_stats.piecewise["attention"]


# -- campaigns ----------------------------------------------------------------------------------

BYPASS_SPACE = """
[hypothesis]
max_examples = 10
[runner]
example_timeout_s = 60
start_timeout_s = 120
control_examples = 40
[ops]
include = ["mm"]
[modes]
choices = ["eager", "compiled"]
[shapes]
rows = { min = 1, max = 64 }
dim = { min = 0, max = 16 }
boundaries = [16, 64]
[batch]
max_companions = 3
companion_rows = { min = 1, max = 64 }
"""


@pytest.mark.campaign
def test_fuzz_finds_a_kernel_bypassed_once_compiled(tmp_path) -> None:
    from planted_fuzz import fuzz_planted

    code, log, report, out = fuzz_planted(
        "planted_compile_bypass", "mm", BYPASS_SPACE, tmp_path, 60
    )
    assert code == 1, log[-3000:]
    found = {(f["property"], f["switch"]): f for f in report["findings"]}
    routing = found[("routing", "enabled")]
    assert parse_case(routing["case"]).mode == "compiled"
    assert routing["message"].startswith("under torch.compile")
    assert routing["reproduced_in_fresh_process"] is True
    variance = found.get(("batch_invariance", "enabled"))
    if variance is not None:  # stock mm's M = 1 path: found within 60 s on seed 7 here
        assert parse_case(variance["case"]).mode == "compiled"
    # eagerly the kernel holds: no finding of an eager case
    assert all(parse_case(f["case"]).mode == "compiled" for f in report["findings"])
    assert report["modes"]["drawn"] == ["eager", "compiled"]
    assert report["compile"]["graphs"] > 0 and report["compile"]["seconds"] > 0
    lines = [json.loads(x) for x in (out / "examples.jsonl").read_text().splitlines()]
    assert {x.get("mode", "eager") for x in lines} == {"eager", "compiled"}
    script = Path(routing["reproducer"]).read_text()
    assert "torch.compile(op" in script
    assert "Modes drawn: eager, compiled" in (out / "report.md").read_text()


@pytest.mark.campaign
def test_a_target_declaring_compile_unsupported_says_not_applicable(tmp_path) -> None:
    from planted_fuzz import fuzz_planted

    _, log, report, out = fuzz_planted(
        "planted_eager_only", "mm", BYPASS_SPACE, tmp_path, 25, "--examples-per-cell", "3"
    )
    assert report["modes"]["drawn"] == ["eager"], log[-3000:]
    [entry] = report["modes"]["not_applicable"]
    assert entry["mode"] == "compiled" and "not meant to run under torch.compile" in entry["reason"]
    assert "MODE NOT APPLICABLE: compiled" in (out / "report.md").read_text()
    assert "MODE NOT APPLICABLE: compiled" in log
    lines = [json.loads(x) for x in (out / "examples.jsonl").read_text().splitlines()]
    assert lines and all("mode" not in x for x in lines)  # nothing ran compiled
    assert report["compile"]["examples"] == 0


@pytest.mark.campaign
def test_the_inductor_target_compiles_every_case_in_both_states(tmp_path) -> None:
    from planted_fuzz import fuzz_planted

    space = BYPASS_SPACE.replace('choices = ["eager", "compiled"]', 'choices = ["eager"]')
    _, log, report, out = fuzz_planted("inductor", "sum", space, tmp_path, 45)
    assert report["modes"]["drawn"] == ["compiled"], log[-3000:]
    [entry] = report["modes"]["not_applicable"]
    assert entry["mode"] == "eager" and "an eager call never reads it" in entry["reason"]
    lines = [json.loads(x) for x in (out / "examples.jsonl").read_text().splitlines()]
    assert lines and all(x.get("mode") == "compiled" for x in lines)
    assert {x["switch"] for x in lines} >= {"enabled", "disabled"}
    declared = [n for n in report["routing_not_observable"] if n["op"] == "sum"]
    assert declared and all(n.get("declared") for n in declared)
    assert report["compile"]["seconds"] > 0
    for finding in report["findings"]:
        assert parse_case(finding["case"]).mode == "compiled"
