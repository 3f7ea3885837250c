"""One `bi-props fuzz` run against a planted library of tests/planted/, for the campaign tests
that each check one bug class end to end (tests/test_fuzz_*.py): the space file, PYTHONPATH, the
command line and the report, written once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

PLANTED = Path(__file__).parent / "planted"


def fuzz_planted(
    library: str, op: str, space: str, tmp_path: Path, budget_s: float, *extra: str
) -> tuple[int, str, dict[str, Any], Path]:
    """Run the campaign (seed 7) on ``library``'s ``op`` with the space file text ``space``;
    return (exit status, the console log, report.json, the output directory)."""
    space_file = tmp_path / "space.toml"
    space_file.write_text(space)
    out = tmp_path / "out"
    path = os.pathsep.join([str(PLANTED), os.environ.get("PYTHONPATH", "")])
    command = [sys.executable, "-m", "bi_props.cli", "fuzz", "--target", library, "--ops", op,
               "--budget", str(budget_s), "--out", str(out), "--strategies", str(space_file),
               "--seed", "7", *extra]  # fmt: skip
    done = subprocess.run(
        command,
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=budget_s * 6,
    )
    report_file = out / "report.json"
    report = json.loads(report_file.read_text()) if report_file.exists() else {}
    return done.returncode, done.stdout + done.stderr, report, out
