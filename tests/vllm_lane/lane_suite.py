"""What the vLLM lane's files share: run the property suite against a target in a subprocess (as a
user runs it) and read back its JUnit outcomes and JSON report. Imported by the lane_*.py files
only (pytest puts this folder on sys.path when it collects them)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LANE = Path(__file__).resolve().parent
REPO = LANE.parents[1]


@dataclass
class SuiteRun:
    returncode: int
    seconds: float
    log: str
    outcomes: dict[str, tuple[str, str]]  # test id -> (outcome, failure message)
    report: dict[str, Any] | None
    out: Path
    report_path: Path


def suite_file() -> Path:
    """The installed property suite (bi_props/suite/test_properties.py)."""
    import bi_props.suite

    return Path(bi_props.suite.__file__).with_name("test_properties.py")


def pytest_command(*args: str) -> list[str]:
    """``python -m pytest <suite> -p lane_profile <args>`` (lane_profile registers the lane's
    Hypothesis profile; see lane_env for the path that finds it)."""
    return [sys.executable, "-m", "pytest", str(suite_file()), "-p", "lane_profile", *args]


def lane_env(**extra: str) -> dict[str, str]:
    """This environment, with this folder on PYTHONPATH (for ``-p lane_profile``)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(LANE), env.get("PYTHONPATH", "")]))
    env.update(extra)
    return env


def junit_outcomes(path: Path) -> dict[str, tuple[str, str]]:
    """Test id -> ("passed" | "failed" | "error" | "skipped", message) from a JUnit file."""
    outcomes: dict[str, tuple[str, str]] = {}
    if not path.exists():
        return outcomes
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed"}.get(child.tag, child.tag)
                message = child.get("message", "")
        outcomes[case.get("name", "")] = (outcome, message)
    return outcomes


def run_suite(
    out: Path, command: list[str], env: dict[str, str], timeout_s: float, name: str
) -> SuiteRun:
    """Run ``command`` (a property-suite invocation) with a report and a JUnit file in ``out``;
    its output goes to ``out/suite.log``."""
    report_path, junit_path = out / "report.json", out / "junit.xml"
    command = [
        *command,
        "--bi-report", str(report_path), "--junitxml", str(junit_path),
        "-p", "no:cacheprovider", "-q",
    ]  # fmt: skip
    start = time.monotonic()
    proc = subprocess.run(
        command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s
    )
    seconds = time.monotonic() - start
    log = proc.stdout + proc.stderr
    (out / "suite.log").write_text(log)
    report = json.loads(report_path.read_text()) if report_path.exists() else None
    print(f"\n{name}: suite exit status {proc.returncode} in {seconds:.1f} s; output in {out}")
    return SuiteRun(
        proc.returncode, seconds, log, junit_outcomes(junit_path), report, out, report_path
    )


def finding_of(run: SuiteRun, op: str, prop: str, switch: str) -> dict[str, Any] | None:
    """The report's finding of one cell, if any."""
    for f in (run.report or {}).get("findings", []):
        if (f["op"], f["property"], f["switch"]) == (op, prop, switch):
            return f
    return None


def table_cell(text: str, limit: int = 200) -> str:
    """Text fit for one markdown table cell."""
    return " ".join(text.split()).replace("|", "\\|")[:limit]


def fuzz_vllm(
    out: Path, space: Path, budget_s: int, examples_per_cell: int, timeout_s: float
) -> tuple[int, str, dict]:
    """``bi-props fuzz --target vllm`` over ``space`` (seed 1, bounded by evidence, the budget
    as its cap) into ``out``: (exit status, its log, report.json)."""
    command = [sys.executable, "-m", "bi_props.cli", "fuzz", "--target", "vllm",
               "--strategies", str(space), "--budget", str(budget_s), "--seed", "1",
               "--examples-per-cell", str(examples_per_cell),
               "--out", str(out / "out")]  # fmt: skip
    log = out / "log.txt"
    with log.open("w") as sink:
        done = subprocess.run(command, stdout=sink, stderr=subprocess.STDOUT, timeout=timeout_s)
    report = json.loads((out / "out" / "report.json").read_text())
    return done.returncode, log.read_text(), report
