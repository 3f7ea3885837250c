"""Standalone reproducers, `bi-props repro`, known failures and regression cases.

Each planted bug's minimal case is judged in real workers, its reproducer is written, and the script
runs in a fresh interpreter that cannot import bi_props (``python -S`` with only torch's
site-packages and the planted library on the path): exit 1 against the buggy library, exit 0 against
the correct one (a shim module of the same name that re-exports ``planted_correct``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch

from bi_props.campaigns.records import Finding
from bi_props.campaigns.session import Session
from bi_props.model.case import Batch, Case, Companion, parse_case
from bi_props.model.known import DataFileError, load_known, load_regressions, promote
from bi_props.model.space import load_profile

PLANTED = Path(__file__).parent / "planted"
SITE_PACKAGES = Path(torch.__file__).resolve().parents[1]

MM = ("contiguous", "contiguous")


def mm_case(m: int, k: int, n: int, dtype: str = "float32", batch: Batch | None = None) -> Case:
    return Case("mm", "torch.mm", dtype, (m, k, n), MM, "general", 3, {}, batch)


# (library, property, switch, kind, minimal case): one per planted bug class.
PLANTED_FINDINGS = [
    (
        "planted_batch_variant",
        "batch_invariance",
        "enabled",
        "mismatch",
        mm_case(1, 8, 5, batch=Batch(0, (Companion(7, 63),))),
    ),
    (  # the needle (1 row) and the batch (5 rows) agree; a window of 2 rows does not
        "planted_even_rows",
        "batch_invariance",
        "enabled",
        "mismatch",
        mm_case(1, 8, 5, batch=Batch(0, (Companion(7, 4),))),
    ),
    ("planted_wrong_result", "reference", "enabled", "mismatch", mm_case(2, 1, 3)),
    ("planted_switch_leak", "routing", "disabled", "mismatch", mm_case(2, 4, 3)),
    (
        "planted_nondeterministic",
        "determinism",
        "enabled",
        "mismatch",
        mm_case(1, 9, 4, batch=Batch(0, (Companion(7, 2),))),
    ),
    ("planted_contract", "parity", "both", "mismatch", mm_case(2, 4, 3, "bfloat16")),
    ("planted_crash", "reference", "enabled", "crash", mm_case(101, 2, 2)),
    ("planted_hang", "reference", "enabled", "timeout", mm_case(1, 7, 2)),
]


def isolated_env(*paths: Path) -> dict[str, str]:
    """An environment where torch imports but bi_props does not (run with ``python -S``)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PYTHONPATH"] = os.pathsep.join([*map(str, paths), str(SITE_PACKAGES)])
    return env


def run_isolated(script: Path, *paths: Path) -> subprocess.CompletedProcess:
    """The script under ``python -S`` with only ``paths`` and torch's site-packages."""
    return run_isolated_each(script, paths)[0]


def run_isolated_each(
    script: Path, *path_sets: tuple[Path, ...]
) -> list[subprocess.CompletedProcess]:
    """``run_isolated`` once per set of paths, all at the same time (each mostly imports torch:
    on 2 cores two at once take about as long as one)."""
    processes = [
        subprocess.Popen(
            [sys.executable, "-S", str(script)],
            env=isolated_env(*paths),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=script.parent,
        )
        for paths in path_sets
    ]
    done = []
    try:
        for process in processes:
            out, err = process.communicate(timeout=300)
            done.append(subprocess.CompletedProcess(process.args, process.returncode, out, err))
    finally:
        for process in processes:
            process.kill()
            process.wait()
    return done


def test_isolated_interpreter_cannot_import_bi_props(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("import torch\nimport bi_props.model.case\n")
    done = run_isolated(probe, PLANTED)
    assert done.returncode != 0 and "bi_props" in done.stderr


@pytest.fixture()
def planted_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(PLANTED))


@pytest.mark.slow
@pytest.mark.parametrize(
    ("library", "prop", "switch", "kind", "case"),
    PLANTED_FINDINGS,
    ids=[entry[0] for entry in PLANTED_FINDINGS],
)
def test_planted_finding_yields_a_standalone_reproducer(
    planted_path, tmp_path: Path, library, prop, switch, kind, case
) -> None:
    # The hang's judgement and its reproducer each wait out the example timeout: 2 s for it (its
    # case takes milliseconds when it does not hang), 5 s for the others.
    timeout = 2.0 if library == "planted_hang" else 5.0
    space = replace(load_profile("ci"), example_timeout_s=timeout, start_timeout_s=120.0)
    session = Session(library, space)
    session.report_path = tmp_path / "out" / "report.json"
    try:
        from bi_props.runner.controller import WorkerFailure

        try:
            verdict = session.judge("mm", prop, switch, case)
            failed, found_kind = not verdict.ok, verdict.kind
        except WorkerFailure as failure:
            failed, found_kind = True, failure.kind
        assert failed, f"the planted bug of {library} did not show on {case!r}"
        assert found_kind == kind
        if library == "planted_even_rows":
            assert "inside the batch's first 2 of 5 rows" in verdict.message, verdict.message
        finding = Finding(library, "mm", prop, switch, kind, repr(case), "planted", True)
        script = session.write_reproducer(finding, case)
    finally:
        session.close()
    assert script is not None
    text = Path(script).read_text()
    assert "import bi_props" not in text and "from bi_props" not in text
    assert "hypothesis" not in text.lower().replace("not hypothesis", "")

    # The script against the buggy library, and against the correct one under the same name.
    shim = tmp_path / "correct"
    shim.mkdir()
    # The hang's fixed run also exits slowly (past its 2 s example timeout): the exit is not
    # the example, and must not be judged a hang (it was, on a loaded machine, until the child
    # disarmed its timer when the experiment returned).
    slow_exit = "import atexit, time\natexit.register(time.sleep, 2.5)\n"
    (shim / f"{library}.py").write_text(
        "from planted_correct import *  # the same name, the correct library\n"
        "from planted_correct import enable\n" + (slow_exit if library == "planted_hang" else "")
    )
    buggy, fixed = run_isolated_each(Path(script), (PLANTED,), (shim, PLANTED))
    assert buggy.returncode == 1, buggy.stdout + buggy.stderr
    assert "REPRODUCES" in buggy.stdout
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    assert "does NOT reproduce" in fixed.stdout


def test_call_source_matches_the_catalogue_call() -> None:
    """The expression a reproducer runs is the catalogue's call, bit for bit."""
    from hypothesis import HealthCheck, given, settings

    from bi_props.catalogue import OPS
    from bi_props.catalogue.strategies import cases
    from bi_props.execution import materialize as M
    from bi_props.reporting.repro import call_source

    space = load_profile("dev")
    for op in ("mm", "matmul", "bmm", "addmm", "linear", "sum", "mean", "softmax"):

        @settings(max_examples=15, database=None, deadline=None,
                  suppress_health_check=list(HealthCheck))  # fmt: skip
        @given(cases(space, op, "reference"))
        def same(case: Case) -> None:
            args = M.operands(case, M.needle(case), "cpu")
            lengths = [case.shape[0]]
            definitions, expression = call_source(case)
            scope = {"torch": torch, "F": torch.nn.functional, "args": args, "lengths": lengths}
            exec(definitions, scope)
            ours = eval(expression, scope)
            theirs = OPS[case.op].call(case.entry, args, case, lengths)
            for a, b in zip(
                ours if isinstance(ours, tuple) else (ours,),
                theirs if isinstance(theirs, tuple) else (theirs,),
                strict=True,
            ):
                assert a.dtype == b.dtype and a.shape == b.shape
                assert torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))

        same()


def test_repro_cli_and_issue_markdown(tmp_path: Path) -> None:
    script = tmp_path / "repro" / "always.py"
    script.parent.mkdir()
    script.write_text("print('the bug is here')\nraise SystemExit(1)\n")
    report = tmp_path / "report.json"
    finding = {
        "target": "x",
        "op": "mm",
        "property": "batch_invariance",
        "switch": "enabled",
        "kind": "mismatch",
        "case": repr(mm_case(1, 2, 3)),
        "message": "needle rows inside the batch (actual) vs alone (desired)",
        "reproduced_in_fresh_process": True,
        "reproducer": str(script),
    }
    report.write_text(json.dumps({"environment": {"torch": "t"}, "findings": [finding]}))
    cli = [sys.executable, "-m", "bi_props.cli"]
    done = subprocess.run([*cli, "repro", str(report)], capture_output=True, text=True)
    assert done.returncode == 1 and "REPRODUCES" in done.stdout
    issue = subprocess.run([*cli, "repro", str(report), "--issue"], capture_output=True, text=True)
    assert issue.returncode == 1
    for piece in ("## mm: batch_invariance", "| torch (found with) | t |", "```python", "Case("):
        assert piece in issue.stdout
    missing = subprocess.run(
        [*cli, "repro", str(report), "--index", "3"], capture_output=True, text=True
    )
    assert missing.returncode == 2 and "--index 3" in missing.stderr


def test_parse_case_accepts_reprs_and_refuses_code() -> None:
    case = mm_case(1, 2, 3, batch=Batch(1, (Companion(5, 2),)))
    assert parse_case(repr(case)) == case
    for bad in ("__import__('os').system('true')", "Case(op=open('x'))", "1 + 1", "Case.mro()"):
        with pytest.raises(ValueError):
            parse_case(bad)


def test_known_failures_file_validation(tmp_path: Path) -> None:
    good = tmp_path / "known.toml"
    good.write_text(
        '[[known]]\ntarget = "vllm"\nop = "bmm"\nproperty = "parity"\nswitch = "both"\n'
        'kind = "error"\nerror_type = "TypeError"\nreason = "no Triton CPU backend"\n'
    )
    (entry,) = load_known(good)
    assert entry.matches(("vllm", "bmm", "parity", "both", "error", "TypeError"))
    assert not entry.matches(("vllm", "bmm", "parity", "both", "error", "ValueError"))
    assert not entry.matches(("cpu", "bmm", "parity", "both", "error", "TypeError"))
    bad_cases = {
        'op = "nope"': "key 'op'",
        'property = "logprobs"': "key 'property'",
        'kind = "oops"': "key 'kind'",
        'switch = "on"': "key 'switch'",
        'case = "os.system()"': "key 'case'",
        'colour = "red"': "unknown keys",
    }
    for line, expected in bad_cases.items():
        key = line.split(" = ")[0]
        base = {"target": '"x"', "op": '"mm"', "property": '"reference"', "switch": '"enabled"',
                "kind": '"mismatch"'}  # fmt: skip
        body = "\n".join(f"{k} = {v}" for k, v in base.items() if k != key)
        path = tmp_path / f"bad-{key}.toml"
        path.write_text(f"[[known]]\n{body}\n{line}\n")
        with pytest.raises(DataFileError) as info:
            load_known(path)
        assert str(path) in str(info.value) and "#1" in str(info.value)
        assert expected in str(info.value)


def test_promote_appends_a_loadable_regression(tmp_path: Path) -> None:
    case = mm_case(1, 8, 5, batch=Batch(0, (Companion(7, 63),)))
    finding = asdict(
        Finding("t", "mm", "batch_invariance", "enabled", "mismatch", repr(case), "line 1\n2", True)
    )
    path = tmp_path / "regressions.toml"
    promote(finding, path)
    promote(finding, path, note="again")
    loaded = load_regressions(path)
    assert [r.case for r in loaded] == [case, case]
    assert loaded[0].note == "line 1" and loaded[1].note == "again"


SUITE = "from bi_props.suite.test_properties import test_property, test_regression\n"


@pytest.mark.slow
def test_known_failure_is_xfail_and_regressions_run_first(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(PLANTED))
    case = mm_case(1, 8, 5, batch=Batch(0, (Companion(7, 63),)))
    pytester.makepyfile(test_suite=SUITE)
    # Companions of 64+ rows, K and N >= 8, float32 general values: every batch crosses the planted
    # threshold with enough terms to round differently, so the generated test fails on its first
    # example whatever the seed (derandomized in CI, where the simplest case has K = N = 0).
    pytester.makefile(
        ".toml",
        space='[hypothesis]\nmax_examples = 5\n[ops]\ninclude = ["mm"]\n'
        "[batch]\ncompanion_rows = { min = 64, max = 128 }\n"
        '[shapes]\ndim = { min = 8, max = 16 }\n[dtypes]\nchoices = ["float32"]\n'
        '[values]\nchoices = ["general"]\n',
    )
    pytester.makefile(
        ".toml",
        known=f"""[[known]]
target = "planted_batch_variant"
op = "mm"
property = "batch_invariance"
switch = "enabled"
kind = "mismatch"
reason = "planted threshold at 64 rows"
case = "{case!r}"
""",
        regressions=f"""[[case]]
op = "mm"
property = "batch_invariance"
switch = "enabled"
case = "{case!r}"
""",
    )
    args = ["--bi-target", "planted_batch_variant", "--bi-strategies", "space.toml",
            "-p", "no:cacheprovider", "-k", "batch_invariance-enabled"]  # fmt: skip
    result = pytester.runpytest_subprocess(
        *args, "--bi-known", "known.toml", "--bi-regressions", "regressions.toml", "-v"
    )
    result.assert_outcomes(xfailed=2, deselected=8)  # the other mm cells (row_permutation too)
    lines = result.stdout.str().splitlines()
    first = next(i for i, line in enumerate(lines) if "test_regression[" in line)
    later = next(i for i, line in enumerate(lines) if "test_property[" in line)
    assert first < later, "the regression case must run before generated examples"
    result.stdout.fnmatch_lines(["*known failure mm batch_invariance [[]enabled[]]: KNOWN*"])

    # The same known entry against the correct library: its case passes again -> FIXED.
    pytester.makepyfile(planted_batch_variant="from planted_correct import *\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(pytester.path), str(PLANTED)]))
    fixed = pytester.runpytest_subprocess(*args, "--bi-known", "known.toml")
    fixed.assert_outcomes(passed=1, deselected=9)  # no regressions file: test_regression too
    fixed.stdout.fnmatch_lines(["*known failure mm batch_invariance*FIXED*remove it*"])
