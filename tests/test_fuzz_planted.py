"""`bi-props fuzz` finds each planted bug, as a third-party target module, within its budget.

Each library in tests/planted/ carries one bug class; the campaign must report it with the right
op, property and switch, confirmed in a fresh process, and the correct library must give an empty
findings list. A campaign stops at its budget (checked between turns of 10 examples, so a shrink in
progress finishes first).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

PLANTED = Path(__file__).parent / "planted"
BUDGET_S = 60  # all campaigns run at once on 2 cores; the issue allows 120 s

SPACE = """
[hypothesis]
max_examples = 10
[runner]
example_timeout_s = 3
start_timeout_s = 120
control_examples = 100
[ops]
include = ["mm"]
[shapes]
rows = { min = 1, max = 128 }
dim = { min = 0, max = 16 }
boundaries = [16, 64]
[batch]
max_companions = 3
companion_rows = { min = 1, max = 128 }
"""

# library -> the (op, property, switch) that must be among its findings
EXPECTED = {
    "planted_batch_variant": ("mm", "batch_invariance", "enabled"),
    "planted_wrong_result": ("mm", "reference", "enabled"),
    "planted_switch_leak": ("mm", "routing", "disabled"),
    "planted_nondeterministic": ("mm", "determinism", "enabled"),
    "planted_contract": ("mm", "parity", "both"),
}
# The crash and hang libraries are found by fuzz too, but shrinking them costs a worker restart (and
# for a hang the timeout) per replay: minutes on 2 cores. Their end-to-end tests run through pytest
# with a narrow space in test_planted.py; the runner's crash/hang handling is in test_runner.py.
KINDS: dict[str, str] = {}


@pytest.fixture(scope="module")
def campaigns(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[int, str, dict, float]]:
    """All campaigns at once (each is wall-clock budgeted): library -> (exit, log, report, s)."""
    root = tmp_path_factory.mktemp("campaigns")
    space = root / "space.toml"
    space.write_text(SPACE)
    path = os.pathsep.join([str(PLANTED), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path}
    running = {}
    for library in [*sorted(EXPECTED), "planted_correct"]:
        out = root / library
        log = (root / f"{library}.log").open("w")
        command = [sys.executable, "-m", "bi_props.cli", "fuzz", "--target", library,
                   "--ops", "mm", "--budget", str(BUDGET_S), "--out", str(out),
                   "--strategies", str(space), "--seed", "7"]  # fmt: skip
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
        running[library] = (process, out, log, time.monotonic())
    results = {}
    for library, (process, out, log, start) in running.items():
        code = process.wait(timeout=BUDGET_S * 6)
        elapsed = time.monotonic() - start
        log.close()
        text = (root / f"{library}.log").read_text()
        report_file = out / "report.json"
        report = json.loads(report_file.read_text()) if report_file.exists() else {}
        results[library] = (code, text, report, elapsed)
    return results


@pytest.mark.slow
@pytest.mark.parametrize("library", sorted(EXPECTED))
def test_fuzz_finds_the_planted_bug(campaigns, library: str) -> None:
    code, log, report, elapsed = campaigns[library]
    assert code == 1, log[-3000:]
    assert "Traceback" not in log, log[-3000:]
    found = {(f["op"], f["property"], f["switch"]): f for f in report["findings"]}
    assert EXPECTED[library] in found, sorted(found)
    finding = found[EXPECTED[library]]
    assert finding["kind"] == KINDS.get(library, finding["kind"])
    assert finding["reproduced_in_fresh_process"] is True
    assert elapsed < BUDGET_S + 240, f"the campaign overran its budget: {elapsed:.0f} s"


@pytest.mark.slow
def test_fuzz_gives_no_finding_for_the_correct_library(campaigns) -> None:
    code, log, report, _ = campaigns["planted_correct"]
    assert code == 0, log[-3000:]
    assert report["findings"] == []
    assert report["examples"] > 20  # it ran (the rate depends on the load of the machine)
    # The control ran; whether 100 derandomized examples of this mixed-dtype space hit stock mm's
    # float32 variance depends on the seed (test_planted.py checks the control's line for this
    # library through pytest, and the property suite checks the controls on the CPU target).
    assert [c["op"] for c in report["controls"]] == ["mm"]
