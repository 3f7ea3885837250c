"""End to end: planted bugs in small third-party CPU libraries, found through the real front ends.

Each library in ``tests/planted/`` (imported only by worker processes, through PYTHONPATH) is a
target in the documented module interface with exactly one planted bug, plus one correct library.
The property suite runs against each through ``pytester`` (a real ``pytest`` subprocess with the
bi_props plugin), and two libraries through ``bi-props fuzz``. The checks: the right test ids fail
and no others, the report has the right finding (property, switch state, kind), the minimal case
sits at the planted threshold, and the finding reproduced in a fresh worker process.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import find

from bi_props.catalogue.strategies import cases
from bi_props.model.case import Batch, Case, Companion
from bi_props.model.space import parse

pytestmark = pytest.mark.slow

PLANTED = Path(__file__).resolve().parent / "planted"

PROPERTY_TESTS = (
    "from bi_props.suite.test_properties import test_batch_variance_control, test_property\n"
)

# Small and quick: one op, extents that reach the planted thresholds (M = 64, M = 101), at most
# three companions. [hypothesis] is written for the record; the plugin takes max_examples (15),
# derandomize (true) and the database (none) from --hypothesis-profile=ci.
BASE_SPACE: dict[str, dict[str, Any]] = {
    "hypothesis": {"max_examples": 15, "derandomize": True, "database": "none"},
    "runner": {"control_examples": 10, "example_timeout_s": 30, "start_timeout_s": 120},
    "ops": {"include": ["mm"]},
    "dtypes": {"choices": ["float32"]},
    "shapes": {
        "rows": {"min": 1, "max": 128},
        "dim": {"min": 0, "max": 48},
        "boundaries": [16, 32, 64],
    },
    "batch": {"max_companions": 3, "companion_rows": {"min": 1, "max": 128}},
}

# The test ids the suite has for mm (the negative control is test_batch_variance_control's).
MM_CELLS = {
    "test_property[mm-routing-enabled]",
    "test_property[mm-routing-disabled]",
    "test_property[mm-reference-enabled]",
    "test_property[mm-reference-disabled]",
    "test_property[mm-batch_invariance-enabled]",
    "test_property[mm-determinism-enabled]",
    "test_property[mm-determinism-disabled]",
    "test_property[mm-parity-both]",
    "test_batch_variance_control[mm-batch_invariance-disabled]",
}

FINDING_FIELDS = {
    "op": str,
    "property": str,
    "switch": str,
    "kind": str,
    "case": str,
    "message": str,
    "reproduced_in_fresh_process": bool,
}


# -- helpers ------------------------------------------------------------------------------------


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + " }"
    raise TypeError(f"no TOML for {value!r}")


def write_space(path: Path, **overrides: dict[str, Any]) -> Path:
    """Write BASE_SPACE, with whole keys of sections replaced by ``overrides``, as TOML."""
    sections = {name: dict(body) for name, body in BASE_SPACE.items()}
    for name, body in overrides.items():
        sections.setdefault(name, {}).update(body)
    lines = []
    for name, body in sections.items():
        lines.append(f"[{name}]")
        lines += [f"{key} = {_toml_value(value)}" for key, value in body.items()]
        lines.append("")
    path.write_text("\n".join(lines))
    return path


def parse_case(text: str) -> Case:
    """A report's case is a line of Python: evaluate it back into a Case."""
    case = eval(text, {"__builtins__": {}}, {"Case": Case, "Batch": Batch, "Companion": Companion})
    assert isinstance(case, Case), text
    assert repr(case) == text
    return case


def total_rows(case: Case) -> int:
    """Rows in the call that the kernel sees: the needle plus every companion."""
    assert case.batch is not None
    return case.shape[0] + sum(c.rows for c in case.batch.companions)


@pytest.fixture
def planted_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers inherit the environment: put the planted libraries on their PYTHONPATH."""
    paths = [str(PLANTED), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, paths)))


@dataclass
class SuiteRun:
    result: pytest.RunResult
    outcomes: dict[str, str]  # test id -> passed | failed | skipped | error
    report: dict[str, Any]

    @property
    def failed(self) -> set[str]:
        return {test for test, outcome in self.outcomes.items() if outcome != "passed"}

    @property
    def output(self) -> str:
        return self.result.stdout.str() + "\n" + self.result.stderr.str()


# Hypothesis' explain phase replays the minimal example with each part varied: for a crash or a
# hang nearly every variation fails again, and each failure costs a worker start (and the example
# timeout). The crash and hang runs drop that phase from the "ci" profile (registered by the
# bi_props plugin, which pytest imports before conftest files); shrinking is untouched.
NO_EXPLAIN_CONFTEST = """
from hypothesis import Phase, settings

settings.register_profile(
    "ci", settings.get_profile("ci"), phases=[p for p in Phase if p is not Phase.explain]
)
"""


def _suite_args(
    directory: Path, target: str, space: Path, args: tuple[str, ...], profile: str | None
) -> list[str]:
    return [
        *([f"--hypothesis-profile={profile}"] if profile else []),
        "--bi-target",
        target,
        f"--bi-strategies={space}",
        "--bi-report",
        str(directory / "report.json"),
        "-p",
        "no:cacheprovider",
        f"--junitxml={directory / 'junit.xml'}",
        *args,
    ]


def _suite_run(directory: Path, result: pytest.RunResult) -> SuiteRun:
    """The run's outcomes per test id (from its junit.xml) and its report."""
    junit, report = directory / "junit.xml", directory / "report.json"
    assert junit.exists(), result.stdout.str() + result.stderr.str()
    outcomes = {}
    for testcase in ET.parse(junit).getroot().iter("testcase"):
        outcome = "passed"
        for child, name in (("failure", "failed"), ("error", "error"), ("skipped", "skipped")):
            if testcase.find(child) is not None:
                outcome = name
        outcomes[testcase.get("name")] = outcome
    assert report.exists(), result.stdout.str()
    return SuiteRun(result, outcomes, json.loads(report.read_text()))


def run_suite(
    pytester: pytest.Pytester,
    target: str,
    space: Path,
    *args: str,
    explain: bool = True,
    profile: str | None = "ci",
) -> SuiteRun:
    """The property suite against ``target`` in a pytest subprocess, as a user would run it."""
    pytester.makepyfile(test_props=PROPERTY_TESTS)
    if not explain:
        pytester.makeconftest(NO_EXPLAIN_CONFTEST)
    result = pytester.runpytest_subprocess(
        *_suite_args(pytester.path, target, space, args, profile), timeout=300
    )
    return _suite_run(pytester.path, result)


def run_suite_in(
    directory: Path, target: str, space: Path, *args: str, explain: bool = True
) -> SuiteRun:
    """``run_suite`` without a ``pytester`` (which is per test and changes the process's
    directory), so that several runs can go at once: the same command, in ``directory``, with
    what ``runpytest_subprocess`` sets (the directory first on PYTHONPATH, no PYTEST_ADDOPTS,
    a basetemp inside) and the planted libraries on the path."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "test_props.py").write_text(PROPERTY_TESTS)
    if not explain:
        (directory / "conftest.py").write_text(NO_EXPLAIN_CONFTEST)
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    paths = [str(directory), str(PLANTED), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, paths))
    command = [sys.executable, "-m", "pytest", f"--basetemp={directory / 'basetemp'}"]
    command += _suite_args(directory, target, space, args, "ci")
    started = time.monotonic()
    done = subprocess.run(
        command,
        cwd=directory,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
    )
    result = pytest.RunResult(
        done.returncode,
        done.stdout.splitlines(),
        done.stderr.splitlines(),
        time.monotonic() - started,
    )
    return _suite_run(directory, result)


def check_findings_schema(findings: list[dict[str, Any]], target: str) -> None:
    for finding in findings:
        for name, kind in FINDING_FIELDS.items():
            assert isinstance(finding[name], kind), (name, finding)
        assert finding["kind"] in ("mismatch", "crash", "timeout", "error")
        assert finding.get("target", target) == target
        parse_case(finding["case"])


# -- the correct library ------------------------------------------------------------------------


def test_correct_library_passes_every_property(pytester, planted_on_path, tmp_path):
    space = write_space(tmp_path / "space.toml", dtypes={"choices": ["float32", "bfloat16"]})
    run = run_suite(pytester, "planted_correct", space)

    assert run.result.ret == pytest.ExitCode.OK, run.output
    assert set(run.outcomes) >= MM_CELLS
    assert run.failed == set(), run.output
    assert run.report["target"] == "planted_correct"
    assert run.report["findings"] == []
    assert run.report["not_covered"] == []
    assert run.report["examples"] > len(MM_CELLS)
    # The negative control ran (with the switch off: stock torch.mm) and said what it saw.
    assert re.search(r"^negative control mm\b.*\S", run.result.stdout.str(), re.M), run.output
    assert {c["op"] for c in run.report["controls"]} == {"mm"}
    assert all(isinstance(c["variance_seen"], bool) for c in run.report["controls"])


def test_a_prefixless_library_is_judged_from_the_dispatcher_and_says_so(
    pytester, planted_on_path, tmp_path
):
    """A thinking-machines-style module (no KERNEL_PREFIX, no ROUTES): routing passes on the
    dispatcher's evidence, and the run warns at its start, in the summary and in report.json."""
    space = write_space(tmp_path / "space.toml")
    run = run_suite(pytester, "planted_tm_correct", space, "-k", "routing")
    assert run.result.ret == pytest.ExitCode.OK, run.output
    assert run.outcomes == {
        "test_property[mm-routing-enabled]": "passed",
        "test_property[mm-routing-disabled]": "passed",
    }, run.output
    [note] = run.report["routing_notes"]
    assert "declares no KERNEL_PREFIX and no ROUTES" in note
    assert run.output.count(f"WARNING: {note}") == 2  # at the start and in the summary
    assert run.report["routing_not_observable"] == []


# -- one planted bug each -----------------------------------------------------------------------


@dataclass(frozen=True)
class Planted:
    target: str
    failing: frozenset[str]
    findings: frozenset[tuple[str, str, str]]  # (property, switch, kind)
    minimal: Callable[[dict[str, Any], Case], None]
    space: dict[str, dict[str, Any]] = field(default_factory=dict)
    select: tuple[str, ...] = ()
    explain: bool = True


def _batch_variant(finding: dict[str, Any], case: Case) -> None:
    # The large-M path starts at M = 64: the shrunk batch is exactly at the threshold.
    assert total_rows(case) == 64, case
    assert case.shape[0] <= 4  # a needle is a few rows; companions make up the rest
    assert case.shape[1] >= 2  # K = 1 is one exact product: both paths agree there
    assert case.values in ("general", "wide")  # exact integers sum exactly in any order
    assert "Mismatched elements" in finding["message"]


def _wrong_result(finding: dict[str, Any], case: Case) -> None:
    assert case.shape[1] == 1, case  # the smallest odd K the space allows (dim min is 0)
    assert case.shape[2] >= 1  # an empty output cannot be wrong
    assert case.batch is None
    assert "reference" in finding["message"] and "Mismatched elements" in finding["message"]


def _switch_leak(finding: dict[str, Any], case: Case) -> None:
    assert "switch leak" in finding["message"]
    assert "planted_switch_leak::mm" in finding["message"]


def _noop_enable(finding: dict[str, Any], case: Case) -> None:
    assert (
        "no evidence that mm reached target 'planted_noop_enable''s kernels" in finding["message"]
    )
    assert "looked for an event starting with 'planted_noop_enable::'" in finding["message"]


def _tm_leak(finding: dict[str, Any], case: Case) -> None:
    assert "switch leak" in finding["message"]
    assert "aten::mm [CPU] is registered from" in finding["message"]


def _nondeterministic(finding: dict[str, Any], case: Case) -> None:
    assert case.shape[1] >= 2, case  # one product rounds the same on both paths
    assert case.batch is not None
    assert "second run" in finding["message"]


def _contract(finding: dict[str, Any], case: Case) -> None:
    assert case.dtype == "bfloat16", case  # float32 inputs keep their contract
    if finding["property"] == "parity":
        assert "float32" in finding["message"] and "bfloat16" in finding["message"]
    else:
        assert "contract changed" in finding["message"]


def _crash(finding: dict[str, Any], case: Case) -> None:
    assert case.shape[0] == 101, case  # the kernel segfaults for M > 100
    assert "SIGSEGV" in finding["message"]
    assert finding["error_type"] == "WorkerCrash"


def _hang(finding: dict[str, Any], case: Case) -> None:
    assert case.shape[1] == 7, case  # the kernel hangs for K == 7
    assert "no answer within 2 s" in finding["message"]
    assert finding["error_type"] == "WorkerHang"


# A worker that crashes or hangs is replaced (one target import each), and Hypothesis replays many
# failing candidates while it shrinks: the crash and hang runs use one property pair (-k) and
# spaces with little else to shrink.
_FAILURE_SPACE = {
    "runner": {"control_examples": 5, "example_timeout_s": 3},
    "layouts": {"choices": ["contiguous"]},
    "values": {"choices": ["general"]},
}

PLANTED_BUGS = [
    Planted(
        "planted_batch_variant",
        frozenset({"test_property[mm-batch_invariance-enabled]"}),
        frozenset({("batch_invariance", "enabled", "mismatch")}),
        _batch_variant,
    ),
    Planted(
        "planted_wrong_result",
        frozenset({"test_property[mm-reference-enabled]"}),
        frozenset({("reference", "enabled", "mismatch")}),
        _wrong_result,
    ),
    Planted(
        "planted_switch_leak",
        frozenset({"test_property[mm-routing-disabled]"}),
        frozenset({("routing", "disabled", "mismatch")}),
        _switch_leak,
    ),
    Planted(  # enable() installs nothing: no kernel event, a routing failure
        "planted_noop_enable",
        frozenset({"test_property[mm-routing-enabled]"}),
        frozenset({("routing", "enabled", "mismatch")}),
        _noop_enable,
        select=("-k", "routing"),
    ),
    Planted(  # no prefix: the dispatcher shows the kernel in place with the switch off
        "planted_tm_leak",
        frozenset({"test_property[mm-routing-disabled]"}),
        frozenset({("routing", "disabled", "mismatch")}),
        _tm_leak,
        select=("-k", "routing"),
    ),
    Planted(
        "planted_nondeterministic",
        frozenset({"test_property[mm-determinism-enabled]"}),
        frozenset({("determinism", "enabled", "mismatch")}),
        _nondeterministic,
    ),
    Planted(
        "planted_contract",
        frozenset({"test_property[mm-reference-enabled]", "test_property[mm-parity-both]"}),
        frozenset({("reference", "enabled", "mismatch"), ("parity", "both", "mismatch")}),
        _contract,
        space={"dtypes": {"choices": ["float32", "bfloat16"]}},
    ),
    Planted(
        "planted_crash",
        frozenset({"test_property[mm-reference-enabled]"}),
        frozenset({("reference", "enabled", "crash")}),
        _crash,
        space={**_FAILURE_SPACE, "shapes": {"dim": {"min": 0, "max": 2}}},
        select=("-k", "reference"),
        explain=False,
    ),
    Planted(
        "planted_hang",
        frozenset({"test_property[mm-reference-enabled]"}),
        frozenset({("reference", "enabled", "timeout")}),
        _hang,
        # K = 7 sits on a tile boundary (8 - 1), which the strategies favour.
        # Each failing replay waits out the example timeout: 2 s here (an example of 1 row and
        # K <= 16 takes milliseconds, but CI's loaded 2 cores once took a second over one, which
        # the fresh-process replay then passed: a flaky finding), 3 s for the crash.
        # No zero extents, K <= 8: K = 7 is one of 8 values and a tile edge (8 - 1) besides.
        space={
            **_FAILURE_SPACE,
            "runner": {"control_examples": 5, "example_timeout_s": 2},
            "shapes": {
                "rows": {"min": 1, "max": 1},
                "dim": {"min": 1, "max": 8},
                "boundaries": [8],
            },
        },
        select=("-k", "reference"),
        explain=False,
    ),
]


@pytest.fixture(scope="module")
def planted_suite_runs(request, tmp_path_factory) -> Iterator[dict[str, Future[SuiteRun]]]:
    """The property suite against every planted library, two runs at a time, started when the
    first of the tests below needs one: a run mostly waits on one worker at a time, so two
    share the 2 cores well (about 200 s one after the other on a 2-core AMD EPYC)."""
    selected = {
        item.callspec.params["planted"].target
        for item in request.session.items
        if item.module is request.module and item.originalname == "test_planted_bug_is_found"
    }
    root = tmp_path_factory.mktemp("planted-suites")
    pool = ThreadPoolExecutor(max_workers=2)
    runs = {}
    for planted in PLANTED_BUGS:
        if planted.target not in selected:
            continue
        directory = root / planted.target
        directory.mkdir()
        space = write_space(directory / "space.toml", **planted.space)
        runs[planted.target] = pool.submit(
            run_suite_in,
            directory / "run",
            planted.target,
            space,
            *planted.select,
            explain=planted.explain,
        )
    try:
        yield runs
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


@pytest.mark.parametrize("planted", PLANTED_BUGS, ids=lambda p: p.target.removeprefix("planted_"))
def test_planted_bug_is_found(planted_suite_runs, planted: Planted):
    run = planted_suite_runs[planted.target].result()

    assert run.result.ret == pytest.ExitCode.TESTS_FAILED, run.output
    if not planted.select:
        assert set(run.outcomes) >= MM_CELLS
    assert planted.failing < set(run.outcomes)
    # Exactly the expected test ids fail; every other one passes (the disabled state included).
    assert run.failed == planted.failing, run.output
    findings = run.report["findings"]
    check_findings_schema(findings, planted.target)
    seen = {(f["property"], f["switch"], f["kind"]) for f in findings}
    assert seen == planted.findings, findings
    assert len(findings) == len(planted.findings)  # one finding per failing test, not per replay
    for finding in findings:
        assert finding["op"] == "mm"
        assert finding["target"] == planted.target
        assert finding["reproduced_in_fresh_process"] is True, finding
        case = parse_case(finding["case"])
        assert case.op == "mm"
        planted.minimal(finding, case)


# -- bi-props fuzz ------------------------------------------------------------------------------


FUZZ_BUDGETS = {"planted_batch_variant": 40, "planted_correct": 20}


@dataclass
class Campaign:
    process: subprocess.Popen
    out: Path
    budget: float
    log: str | None = None

    def wait(self) -> tuple[int, str, Path]:
        if self.log is None:
            try:
                self.process.wait(timeout=self.budget + 240)
            finally:
                self.process.kill()
                self.process.wait()
            self.log = (self.out.parent / f"{self.out.name}.log").read_text()
        return self.process.returncode, self.log, self.out


@pytest.fixture(scope="module", autouse=True)
def fuzz_campaigns(request, tmp_path_factory) -> Iterator[dict[str, Campaign]]:
    """``bi-props fuzz`` on the batch-variant and the correct library, started in the background
    when this module starts (if a fuzz test is selected): a campaign is bounded by its time budget,
    and the pytester runs above mostly wait on one worker at a time, so they overlap well."""
    ours = [item for item in request.session.items if item.module is request.module]
    if not any("fuzz" in item.name for item in ours):
        yield {}
        return
    root = tmp_path_factory.mktemp("fuzz")
    space = write_space(root / "space.toml")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PLANTED), env.get("PYTHONPATH", "")]))
    script = Path(sys.executable).with_name("bi-props")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "bi_props.cli"]
    campaigns = {}
    for target, budget in FUZZ_BUDGETS.items():
        out = root / target
        args = ["fuzz", "--target", target, "--budget", str(budget), "--out", str(out)]
        args += ["--ops", "mm", "--strategies", str(space)]
        # The campaign's console goes to a file, not a pipe: nobody reads a pipe until the fuzz
        # tests run, and a full pipe (64 KiB: a few hundred turns' progress lines) would block
        # the campaign on a print and make it overrun its budget.
        with (root / f"{target}.log").open("w") as console:
            process = subprocess.Popen(
                [*command, *args],
                stdout=console,
                stderr=subprocess.STDOUT,
                text=True,
                env=env,
                cwd=root,
            )
        campaigns[target] = Campaign(process, out, budget)
    try:
        yield campaigns
    finally:
        for campaign in campaigns.values():
            campaign.process.kill()
            campaign.process.communicate()


def _fuzz_report(log: str, out: Path) -> dict[str, Any]:
    """The campaign's report.json, checked against the documented schema. Exit status 1 is also
    what an uncaught exception gives: the campaign must have finished and said so."""
    assert "Traceback" not in log, log
    assert "report written to" in log, log
    path = out / "report.json"
    assert path.exists(), log
    report = json.loads(path.read_text())
    for key, kind in (
        ("target", str),
        ("examples", int),
        ("elapsed_s", (int, float)),
        ("findings", list),
        ("controls", list),
        ("not_covered", list),
    ):
        assert isinstance(report[key], kind), (key, report)
    check_findings_schema(report["findings"], report["target"])
    return report


@pytest.mark.campaign
def test_fuzz_finds_the_batch_variant_kernel(fuzz_campaigns):
    code, log, out = fuzz_campaigns["planted_batch_variant"].wait()
    assert code == 1, log
    report = _fuzz_report(log, out)
    assert report["target"] == "planted_batch_variant"
    assert report["examples"] > 100, log
    budget = FUZZ_BUDGETS["planted_batch_variant"]
    assert budget * 0.9 <= report["elapsed_s"] <= budget + 120
    assert {c["op"] for c in report["controls"]} == {"mm"}
    assert report["not_covered"] == []

    [finding] = report["findings"]
    assert (finding["op"], finding["property"], finding["switch"], finding["kind"]) == (
        "mm",
        "batch_invariance",
        "enabled",
        "mismatch",
    )
    assert finding["reproduced_in_fresh_process"] is True
    case = parse_case(finding["case"])
    assert total_rows(case) == 64, case
    assert case.shape[1] >= 2


@pytest.mark.campaign
def test_fuzz_on_the_correct_library_is_clean(fuzz_campaigns):
    code, log, out = fuzz_campaigns["planted_correct"].wait()
    assert code == 0, log
    report = _fuzz_report(log, out)
    assert report["target"] == "planted_correct"
    assert report["findings"] == []
    assert report["examples"] > 50, log
    assert {c["op"] for c in report["controls"]} == {"mm"}


# -- rough edges of src/ found by these tests (fixed; kept as regression tests) ---------------


def test_batch_invariance_strategy_accepts_rows_min_above_four():
    space = parse({"ops": {"include": ["mm"]}, "shapes": {"rows": {"min": 8, "max": 16}}}, "x", "x")
    case = find(cases(space, "mm", "batch_invariance"), lambda case: True)
    assert 8 <= case.shape[0] <= 16


def test_strategies_file_max_examples_is_honoured(pytester, planted_on_path, tmp_path):
    space = write_space(tmp_path / "space.toml", hypothesis={"max_examples": 3})
    # Without --hypothesis-profile the file's [hypothesis] table applies (an explicit profile wins).
    run = run_suite(pytester, "planted_correct", space, "-k", "mm-reference-disabled", profile=None)
    assert run.result.ret == pytest.ExitCode.OK, run.output
    # max_examples counts judged examples: one that compared nothing is drawn again
    assert run.report["evidence"]["judged"] == 3, run.report["evidence"]
    degenerate = run.report["degenerate"]["examples"]
    assert run.report["examples"] == 3 + degenerate, (run.report["examples"], degenerate)


# -- the model-level property catches a planted bug in one op of a correct library ---------------


@pytest.mark.slow
def test_model_level_logprobs_catch_a_planted_op_bug(pytester, planted_on_path, tmp_path):
    """planted_model_bug is bi_props's correct CPU library with one batch-variant op (silu above
    512 elements): the probe model's logprobs alone vs in a batch must expose it, and the finding
    must name the first diverging token and list silu among the ops the model used."""
    space = tmp_path / "model.toml"
    space.write_text(
        '[hypothesis]\nmax_examples = 30\n[ops]\ninclude = ["probe_model"]\n'
        "[attention]\nlength = { min = 1, max = 24 }\n"
    )
    run = run_suite(pytester, "planted_model_bug", space, "-k", "logprobs-enabled")
    assert run.outcomes.get("test_property[probe_model-logprobs-enabled]") == "failed", run.output
    (finding,) = [f for f in run.report["findings"] if f["property"] == "logprobs"]
    assert finding["switch"] == "enabled" and finding["reproduced_in_fresh_process"] is True
    assert "First mismatch at index" in finding["message"]
    assert "first diverging token: position" in finding["message"]
    assert "catalogue ops the model used" in finding["message"] and "silu" in finding["message"]
    # localized: the first diverging op, and its op-level reproducer confirmed standalone
    assert "first diverging op: aten::silu (layer " in finding["message"], finding["message"]
    assert "op-level reproducer:" in finding["message"]
    assert "fails standalone (exit 1" in finding["message"], finding["message"]
    assert finding["reproducer"].endswith("localize-aten_silu_default.py"), finding
