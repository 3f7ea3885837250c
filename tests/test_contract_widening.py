"""Contract parity has a direction.

A kernel that returns where stock PyTorch raises (an engine kernel computing in float64 that
takes int64 inputs stock refuses) *widens* the contract: parity's verdict kind ``widening``,
recorded, shrunk and confirmed like any failure, reported apart as "accepts more than stock", and
no exit 1 unless strict contract was asked (``bi-props fuzz --strict-contract``,
``--bi-strict-contract``). Narrowing (the switch-on call raises where stock returns, raises
another exception type, or returns another dtype, shape or device) stays a failure (exit 1).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import strategies as st

from bi_props.campaigns.fuzz import Cell, run_slice
from bi_props.campaigns.session import Session
from bi_props.model import properties
from bi_props.model.case import Case
from bi_props.model.observation import Call, Observation, TensorBits
from bi_props.model.space import parse
from bi_props.reporting import data as report_data
from bi_props.reporting.data import exit_status, load
from bi_props.reporting.verdict import verdict_line

PLANTED = Path(__file__).resolve().parent / "planted"
STOCK_ERROR = ("NotImplementedError", "\"silu_cpu\" not implemented for 'Long'")


def _parity_obs(switch: str, call: Call) -> Observation:
    return Observation("parity", switch, {"op": call})


def _returned(dtype: str = "int64", shape=(2, 3), device: str = "cpu") -> Call:
    return Call(outputs=(TensorBits(dtype, shape, device, None),))


def _raised(error_type: str = STOCK_ERROR[0], message: str = STOCK_ERROR[1]) -> Call:
    return Call(outputs=None, error_type=error_type, error_message=message)


def _parity(enabled: Call, disabled: Call) -> properties.Verdict:
    return properties.parity(_parity_obs("enabled", enabled), _parity_obs("disabled", disabled))


# -- the judge -----------------------------------------------------------------------------------


def test_returning_where_stock_raises_is_a_widening_not_a_mismatch():
    verdict = _parity(_returned(), _raised())
    assert (verdict.ok, verdict.kind) == (False, "widening")
    assert verdict.error_type == "NotImplementedError"  # what stock refused with
    assert "accepts more than stock" in verdict.message
    assert "enabled returned normally [('int64', [2, 3], 'cpu')]" in verdict.message
    assert "\"silu_cpu\" not implemented for 'Long'" in verdict.message


@pytest.mark.parametrize(
    ("enabled", "disabled", "kind"),
    [
        (_raised("KeyError", "torch.int64"), _returned(), "error"),  # raises where stock returns
        (_raised("RuntimeError", "no"), _raised("NotImplementedError", "no"), "error"),
        (_returned("float32"), _returned("bfloat16"), "mismatch"),  # another dtype
        (_returned(shape=(3, 2)), _returned(shape=(2, 3)), "mismatch"),  # another shape
        (_returned(device="cuda:0"), _returned(device="cpu"), "mismatch"),  # another device
    ],
)
def test_narrowing_stays_a_failure(enabled: Call, disabled: Call, kind: str):
    verdict = _parity(enabled, disabled)
    assert (verdict.ok, verdict.kind) == (False, kind), verdict


def test_the_same_contract_both_ways_holds():
    assert _parity(_returned(), _returned()).ok
    assert _parity(_raised(), _raised()).ok


# -- the exit status and the reports ---------------------------------------------------------------


def _finding(kind: str, **extra) -> dict:
    return {
        "target": "lib",
        "op": "silu",
        "property": "parity",
        "switch": "both",
        "kind": kind,
        "error_type": "NotImplementedError",
        "case": "Case(op='silu', entry='F.silu', dtype='int64', shape=(1, 2))",
        "message": "contract widening (accepts more than stock): enabled returned normally",
        "reproduced_in_fresh_process": True,
        "confirmation": "reproduced: parity failed with widening in a fresh worker",
        **extra,
    }


def _report(*findings: dict, strict: bool | None = None) -> dict:
    report = {"target": "lib", "status": "complete", "findings": list(findings)}
    if strict is not None:
        report["strict_contract"] = strict
    return report


def test_a_widening_alone_exits_0_and_1_only_when_strict_contract_was_asked():
    assert exit_status(_report(_finding("widening"))) == 0
    assert exit_status(_report(_finding("widening"), strict=False)) == 0
    assert exit_status(_report(_finding("widening"), strict=True)) == 1
    assert exit_status(_report(_finding("widening"), _finding("error"))) == 1  # narrowing
    assert exit_status(_report(_finding("error"), strict=False)) == 1
    assert exit_status(_report(_finding("widening"), strict=False), interrupted=True) == 130
    known = _finding("widening", status="known")
    assert report_data.widenings(_report(known)) == []


def test_every_report_lists_a_widening_apart_with_its_case(tmp_path: Path):
    from bi_props.reporting import write_reports

    (tmp_path / "report.json").write_text(json.dumps(_report(_finding("widening"))))
    write_reports(tmp_path)
    line = verdict_line(load(tmp_path))
    assert "no open findings" in line
    wider = "accepts more than stock: 1 contract widening(s), not failures (silu parity [both])"
    assert wider in line
    md = (tmp_path / "report.md").read_text()
    assert md.startswith("# bi_props campaign: lib (no open findings; accepts more than stock: 1)")
    assert "## Accepts more than stock (contract widening)" in md
    assert "`--strict-contract` fails on them" in md
    assert "- lib silu parity [both] (stock raised NotImplementedError)" in md
    assert "dtype='int64', shape=(1, 2))`" in md
    junit = (tmp_path / "junit.xml").read_text()
    assert 'failures="0"' in junit

    (tmp_path / "report.json").write_text(json.dumps(_report(_finding("widening"), strict=True)))
    write_reports(tmp_path)
    strict = verdict_line(load(tmp_path))
    assert "FAILED: 1 open finding(s) (silu parity [both])" in strict
    assert "failing under --strict-contract" in strict
    assert "these fail the run (exit 1)" in (tmp_path / "report.md").read_text()


def test_the_console_line_names_the_case_and_the_flag():
    [status] = report_data.widenings(_report(_finding("widening")))
    line = report_data.widening_line(status, _report(_finding("widening")))
    assert line.startswith("ACCEPTS MORE THAN STOCK: silu parity [both]")
    assert "not a failure; --strict-contract fails on it" in line and "dtype='int64'" in line


# -- the session: recorded, shrunk and confirmed like any failure ----------------------------------


def _silu(m: int, dtype: str) -> Case:
    return Case("silu", "F.silu", dtype, (m, 3), ("contiguous",), "general", 0)


def test_a_widening_is_shrunk_and_confirmed_in_a_fresh_process_like_any_failure():
    def judge(case: Case, fresh: bool) -> properties.Verdict:
        if case.dtype == "int64":
            return _parity(_returned(shape=case.shape), _raised())
        return properties.PASS

    space = parse({"ops": {"include": ["silu"]}}, "test", "test")
    session = Session("cpu", space)
    session.judge = lambda op, prop, switch, case, fresh=False, patience=1.0: judge(case, fresh)
    session.strategy = lambda op, prop: st.builds(
        _silu, st.integers(1, 64), st.sampled_from(["float32", "int64"])
    )
    session.explicit_examples = False
    run_slice(session, Cell("silu", "parity", "both"), 60, None, seed=1)
    [finding] = session.findings
    assert (finding.kind, finding.error_type) == ("widening", "NotImplementedError")
    assert finding.case == repr(_silu(1, "int64")), finding.case  # shrunk
    assert finding.reproduced_in_fresh_process is True, finding.confirmation
    assert finding.confirmation == "reproduced: parity failed with widening in a fresh worker"
    report = session.report()
    assert report["strict_contract"] is False and exit_status(report) != 1
    session.strict_contract = True
    assert exit_status(session.report()) == 1


def test_strict_contract_defaults_from_the_environment(monkeypatch: pytest.MonkeyPatch):
    from bi_props.campaigns.records import STRICT_CONTRACT_ENV

    space = parse({"ops": {"include": ["silu"]}}, "test", "test")
    monkeypatch.setenv(STRICT_CONTRACT_ENV, "1")
    assert Session("cpu", space).strict_contract is True
    monkeypatch.setenv(STRICT_CONTRACT_ENV, "0")
    assert Session("cpu", space).strict_contract is False


# -- end to end: bi-props fuzz on planted libraries ----------------------------------------------

SPACE = """
[hypothesis]
max_examples = 15
derandomize = true
database = "none"
[runner]
control_examples = 10
example_timeout_s = 30
start_timeout_s = 120
[dtypes]
choices = ["float32"]
[shapes]
rows = { min = 1, max = 64 }
dim = { min = 0, max = 32 }
[batch]
max_companions = 3
companion_rows = { min = 1, max = 64 }
"""


def _fuzz(tmp_path: Path, target: str, op: str, budget: int, *extra: str):
    space = tmp_path / "space.toml"
    space.write_text(SPACE)
    out = tmp_path / f"out-{target}-{len(extra)}"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PLANTED), env.get("PYTHONPATH", "")]))
    env.pop("BI_PROPS_STRICT_CONTRACT", None)
    command = [sys.executable, "-m", "bi_props.cli", "fuzz", "--target", target, "--ops", op,
               "--budget", str(budget), "--out", str(out), "--strategies", str(space),
               "--seed", "1", *extra]  # fmt: skip
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=budget + 300, env=env, cwd=tmp_path
    )
    report = json.loads((out / "report.json").read_text())
    return done, report, out


@pytest.mark.campaign
@pytest.mark.slow
def test_fuzz_reports_a_widening_library_apart_and_fails_it_only_when_strict(tmp_path: Path):
    done, report, out = _fuzz(tmp_path, "planted_widening", "silu", 30)
    assert done.returncode == 0, done.stderr[-3000:]
    [finding] = report["findings"]
    assert (finding["op"], finding["property"], finding["kind"]) == ("silu", "parity", "widening")
    assert "dtype='int64'" in finding["case"]
    assert finding["reproduced_in_fresh_process"] is True
    assert report["strict_contract"] is False
    assert "bi-props: ACCEPTS MORE THAN STOCK: silu parity [both]" in done.stderr
    assert "## Accepts more than stock (contract widening)" in (out / "report.md").read_text()

    strict, report, _ = _fuzz(tmp_path, "planted_widening", "silu", 20, "--strict-contract")
    assert strict.returncode == 1, strict.stderr[-3000:]
    assert report["strict_contract"] is True
    # one per failure class it met (a known case's, a drawn case's of another size class)
    assert report["findings"] and {f["kind"] for f in report["findings"]} == {"widening"}


@pytest.mark.campaign
@pytest.mark.slow
def test_fuzz_still_fails_a_narrowing_library(tmp_path: Path):
    """planted_dtype_table raises where stock mm returns (float64, integers): exit 1."""
    done, report, _ = _fuzz(tmp_path, "planted_dtype_table", "mm", 20)
    assert done.returncode == 1, done.stderr[-3000:]
    kinds = {(f["property"], f["kind"]) for f in report["findings"]}
    assert ("parity", "error") in kinds, report["findings"]
    assert all(f["kind"] != "widening" for f in report["findings"])


# -- the pytest plugin -----------------------------------------------------------------------------

PARITY_TESTS = "from bi_props.suite.test_properties import test_known_cases, test_property\n"


def _suite(pytester: pytest.Pytester, *extra: str) -> pytest.RunResult:
    space = pytester.path / "space.toml"
    space.write_text(SPACE + '[ops]\ninclude = ["silu"]\n')
    pytester.makepyfile(test_props=PARITY_TESTS)
    return pytester.runpytest_subprocess(
        "--hypothesis-profile=ci", "--bi-target", "planted_widening", f"--bi-strategies={space}",
        "--bi-report", str(pytester.path / "report.json"), "-p", "no:cacheprovider",
        "-k", "parity", "-rxX", *extra, timeout=300,
    )  # fmt: skip


@pytest.mark.slow
def test_the_plugin_reports_a_widening_as_xfail_and_fails_it_with_strict_contract(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
):
    paths = [str(PLANTED), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, paths)))
    result = _suite(pytester)
    output = result.stdout.str()
    assert result.ret == pytest.ExitCode.OK, output
    assert "xfailed" in output and "accepts more than stock (--bi-strict-contract" in output
    assert "ACCEPTS MORE THAN STOCK: silu parity [both]" in output  # the terminal summary
    report = json.loads((pytester.path / "report.json").read_text())
    assert [f["kind"] for f in report["findings"]] == ["widening"]
    certificate = json.loads((pytester.path / "certificate.json").read_text())  # beside it
    assert certificate["verdict"] == "PASS", certificate["not_measured"]
    assert certificate["provenance"]["command"].startswith("pytest")

    strict = _suite(pytester, "--bi-strict-contract")
    assert strict.ret == pytest.ExitCode.TESTS_FAILED, strict.stdout.str()
    assert "fails the run: --strict-contract" in strict.stdout.str()
    certificate = json.loads((pytester.path / "certificate.json").read_text())
    assert certificate["verdict"] == "FAIL"
