"""`bi-props repro FINDING [--issue]`: does a finding still reproduce, in a fresh interpreter?

FINDING is a reproducer script, or a report.json (``--index`` picks the finding; its reproducer is
used). ``--issue`` prints a Markdown bug report for the upstream tracker: environment, minimal case,
expected vs actual, the reproducer's output now, and the script itself.
"""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

OUTCOMES = {0: "does NOT reproduce", 1: "REPRODUCES", 2: "error while reproducing"}


def _locate(path: Path, index: int) -> tuple[Path, dict[str, Any], dict[str, Any]]:
    """(script, finding, report) from a script path or a report.json."""
    if path.suffix == ".py":
        return path, {}, {}
    report = json.loads(path.read_text())
    findings = report.get("findings", [])
    if not 0 <= index < len(findings):
        raise ValueError(f"{path} has {len(findings)} findings; --index {index} does not exist")
    finding = findings[index]
    if not finding.get("reproducer"):
        raise ValueError(
            f"finding #{index} of {path} has no standalone reproducer (see its message); "
            f"re-run its case with pytest instead: {finding.get('case')}"
        )
    script = Path(finding["reproducer"])
    if not script.is_absolute() and not script.exists():
        script = path.parent / "repro" / script.name
    return script, finding, report


def run(script: Path, timeout_s: float = 900.0) -> tuple[int, str]:
    """Run the reproducer in a fresh interpreter; (exit status, its output)."""
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=timeout_s
    )
    return done.returncode, done.stdout + done.stderr


def _environment(report: dict[str, Any]) -> dict[str, str]:
    env = {"python (now)": platform.python_version(), "platform": platform.platform()}
    try:
        import torch

        env["torch (now)"] = torch.__version__
    except Exception as exc:  # a broken torch is worth reporting too
        env["torch (now)"] = f"not importable: {exc}"
    env.update({f"{k} (found with)": v for k, v in report.get("environment", {}).items()})
    return env


def issue_markdown(
    script: Path, finding: dict[str, Any], report: dict[str, Any], status: int, output: str
) -> str:
    switch = finding.get("switch", "?")
    state = "on vs off" if switch == "both" else {"enabled": "on", "disabled": "off"}.get(switch)
    title = (
        f"{finding.get('op', '?')}: {finding.get('property', '?')} fails with the switch "
        f"{state} ({finding.get('kind', '?')})"
        if finding
        else f"Reproducer {script.name}"
    )
    rows = "\n".join(f"| {k} | {v} |" for k, v in _environment(report).items())
    parts = [
        f"## {title}",
        "",
        "| environment | |",
        "| --- | --- |",
        rows,
        "",
    ]
    if finding:
        parts += [
            f"Target: `{finding.get('target')}`. Found by bi_props (Hypothesis), shrunk to:",
            "",
            "```python",
            finding.get("case", ""),
            "```",
            "",
            "### Expected vs actual",
            "",
            "```",
            finding.get("message", "").strip(),
            "```",
            "",
        ]
    parts += [
        f"### Reproducing now: {OUTCOMES.get(status, f'exit status {status}')}",
        "",
        "```",
        output.strip()[-4000:],
        "```",
        "",
        "### Reproducer (torch and the target's packages only; exit 1 = the bug reproduces)",
        "",
        "```python",
        script.read_text().strip(),
        "```",
    ]
    return "\n".join(parts)


def repro(path: Path, index: int = 0, issue: bool = False) -> int:
    """Exit status: 1 reproduces, 0 does not, 2 usage or reproduction error."""
    try:
        script, finding, report = _locate(path, index)
        if not script.exists():
            raise ValueError(f"no such reproducer: {script}")
    except (OSError, ValueError, json.JSONDecodeError) as exc:
        print(f"bi-props: error: {exc}", file=sys.stderr)
        return 2
    status, output = run(script)
    if issue:
        print(issue_markdown(script, finding, report, status, output))
    else:
        sys.stdout.write(output)
        print(f"bi-props: {script}: {OUTCOMES.get(status, f'exit status {status}')}")
    return status if status in (0, 1) else 2
