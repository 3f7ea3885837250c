"""OUT_DIR/summary.md of scripts/gpu_check.sh, from what each part left in OUT_DIR/<part>/.

    python3 summarize.py OUT_DIR TOTAL_SECONDS ALLOW_MISSING PART...

Written after every part, so a run that is itself cut still leaves a summary. Per part: status,
exit code, seconds of its limit, examples run (the scenarios part: scenarios judged, from its
campaign's report in ``scenarios/campaign/``), findings, negative controls that saw variance and
the largest shapes reached per op (from examples.jsonl); for a part that was cut or crashed, the
tests it finished, the one it was in, the processes killed and the last lines of its log.
Prints the summary; exits 0 (all ran, nothing found), 1 (findings) or 2 (a part could not run,
was cut, or left processes behind).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

RESULT = re.compile(r"^(\S+::\S+)\s+(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b")
STARTED = re.compile(r"^(\S+::\S+)\s*$")
# The largest shape entries per op, named (the case's shape, docs/ops.md).
AXES = {
    "mm": ("M", "K", "N"), "addmm": ("M", "K", "N"), "matmul": ("M", "K", "N"),
    "linear": ("M", "K", "N"), "bmm": ("B", "M", "K", "N"),
}  # fmt: skip


def _json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def largest_shapes(examples: Path) -> dict[str, dict[str, int]]:
    """op -> {axis: largest value} over every example line (batch_rows: the whole batch)."""
    out: dict[str, dict[str, int]] = {}
    if not examples.exists():
        return out
    for line in examples.read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        op, shape = row.get("op"), row.get("shape") or []
        names = AXES.get(op, ())
        if len(names) == 3 and len(shape) == 4:  # matmul/linear 3-D forms: (rows, batch, K, N)
            names = ("M", "B", "K", "N")
        names = names or tuple(f"d{i}" for i in range(len(shape)))
        entry = out.setdefault(op, {})
        for name, value in zip(names, shape, strict=False):
            entry[name] = max(entry.get(name, 0), int(value))
        if row.get("batch_rows"):
            entry["batch_rows"] = max(entry.get("batch_rows", 0), int(row["batch_rows"]))
    return out


def tests_in_log(log: Path) -> tuple[list[tuple[str, str]], str | None]:
    """(finished tests with their result, the test running when the log ends) from pytest -v."""
    done: list[tuple[str, str]] = []
    running = None
    if not log.exists():
        return done, running
    for line in log.read_text(errors="replace").splitlines():
        m = RESULT.match(line.strip())
        if m:
            done.append((m.group(1).split("::", 1)[1], m.group(2)))
            running = None
            continue
        m = STARTED.match(line.strip())
        if m:
            running = m.group(1).split("::", 1)[1]
    return done, running


def scenario_counts(report: dict, row: dict) -> None:
    """An engine-scenario campaign's report (``bi-props scenarios``) in a part's row: scenarios
    judged (all states and properties), findings, and per state what it judged and found."""
    verdicts = report.get("verdicts", [])
    findings = report.get("findings", [])
    row["examples"] = f"{sum(v.get('judged', 0) for v in verdicts)} scenarios"
    row["findings"] = str(len(findings))
    for state in report.get("states", []):
        name = state.get("state")
        mine = [v for v in verdicts if v.get("state") == name]
        judged = sum(v.get("judged", 0) for v in mine)
        held = sorted(v["prop"] for v in mine if v.get("verdict") == "held")
        text = f"state {name}: {judged} scenarios judged; held: {', '.join(held) or 'none'}"
        if state.get("broken"):
            text += f"; BROKEN at its first forward: {str(state['broken']).splitlines()[0]}"
        if state.get("failed"):
            text += f"; worker FAILED: {str(state['failed']).splitlines()[0]}"
        row["details"].append(text)
    for f in findings:
        first = (f.get("message") or "").strip().splitlines()[:1]
        features = ", ".join(f.get("features") or []) or "(none)"
        row["details"].append(
            f"finding: {f.get('state')} / {f.get('prop')} {f.get('kind', '')}: "
            f"{first[0] if first else ''} [features on: {features}]"
        )


def part_summary(out: Path, part: str, allow_missing: bool) -> tuple[dict, int]:
    folder = out / part
    row = {"part": part, "status": "not run yet", "exit": "-", "seconds": "-", "examples": "-",
           "findings": "-", "controls": "-", "largest": "-", "details": []}  # fmt: skip
    missing = folder / "missing"
    if missing.exists():
        text = missing.read_text().strip()
        if text.startswith("optional:"):
            row["status"] = "SKIPPED (optional): " + text[len("optional:") :].strip()
            return row, 0
        row["status"] = f"MISSING: {text}"
        return row, 0 if allow_missing else 2
    record = _json(folder / "part.json")
    if record is None:
        return row, 0
    code = record["exit"]
    row["exit"] = str(code)
    row["seconds"] = f"{record['seconds']:g} of {record['limit_s']:g}"
    if part == "scenarios":
        report = _json(folder / "campaign" / "report.json")
        if report is not None:
            scenario_counts(report, row)
    else:
        report = _json(folder / "report.json")
    if report is not None and part != "scenarios":
        row["examples"] = str(report.get("examples", "-"))
        findings = report.get("findings", [])
        row["findings"] = str(len(findings))
        seen = sorted(
            {str(c.get("op")) for c in report.get("controls", []) if c.get("variance_seen")}
        )
        row["controls"] = ", ".join(seen) or "none"
        for f in findings:
            first = (f.get("message") or "").strip().splitlines()[:1]
            row["details"].append(
                f"finding: {f.get('op')} {f.get('property')} [{f.get('switch')}] "
                f"{f.get('kind', '')}: {first[0] if first else ''}"
            )
    largest = largest_shapes(folder / "examples.jsonl")
    if largest:
        row["largest"] = "; ".join(
            f"{op} " + " ".join(f"{k}={v}" for k, v in axes.items())
            for op, axes in sorted(largest.items())
        )
    elif record["timed_out"]:
        row["largest"] = "(cut before examples.jsonl was written)"
    status = 0
    if record["timed_out"]:
        if part == "hang":
            row["status"] = f"cut as planted after {record['limit_s']:g} s (expected)"
        else:
            row["status"] = f"CUT after {record['limit_s']:g} s"
            status = 2
        done, running = tests_in_log(folder / "log")
        passed = sum(1 for _, r in done if r == "PASSED")
        row["details"].append(
            f"cut: {len(done)} tests finished ({passed} passed), "
            f"running: {running or '(none seen)'}"
        )
        for name, result in done:
            if result != "PASSED":
                row["details"].append(f"  {result}: {name}")
    elif code == 0:
        row["status"] = "ran, passed"
        if report is not None and report.get("findings"):
            row["status"], status = "ran, findings", 1  # e.g. the `switching` property
    elif code == 1:
        row["status"], status = "ran, findings", 1
    else:
        row["status"], status = f"FAILED to run (exit {code}; see {part}/log)", 2
    if report is None and not record["timed_out"] and code in (0, 1):
        row["status"], status = "FAILED: no report.json", 2
    if part == "hang" and not record["timed_out"]:
        row["status"], status = f"planted hang NOT cut (exit {code})", 2
    if record.get("killed"):
        row["details"].append(f"killed (group and workers): {record['killed']}")
    if record.get("survivors"):
        row["status"] += f"; SURVIVING PROCESSES {record['survivors']}"
        status = 2
    if status == 2 or record["timed_out"]:
        log = folder / "log"
        tail = log.read_text(errors="replace").splitlines()[-8:] if log.exists() else []
        row["details"] += ["log tail:"] + [f"    {ln}" for ln in tail]
    return row, status


def main(argv: list[str]) -> int:
    out, total, allow_missing, parts = Path(argv[0]), argv[1], argv[2] == "1", argv[3:]
    check = _json(out / "check.json") or {}
    lines = ["# bi_props GPU check", ""]
    env = out / "check.txt"
    if env.exists():
        lines += ["```", *env.read_text().strip().splitlines(), "```", ""]
    lines += [
        "| part | status | exit | seconds | examples | findings | controls with variance "
        "| largest shapes |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    details: list[str] = []
    overall = 0
    for part in parts:
        row, status = part_summary(out, part, allow_missing)
        if part == "hang" and status == 0:
            pass  # the planted hang does not count as a part of the check
        overall = max(overall, status)
        lines.append(
            f"| {part} | {row['status']} | {row['exit']} | {row['seconds']} | {row['examples']} "
            f"| {row['findings']} | {row['controls']} | {row['largest']} |"
        )
        if row["details"]:
            details += [
                f"### {part}",
                "",
                *(f"- {d}" if not d.startswith("  ") else d for d in row["details"]),
                "",
            ]
    lines += ["", *details] if details else [""]
    lines.append(
        f"Total {total} s; exit status {overall} (0 all ran and passed, 1 findings, 2 a part "
        f"could not run, was cut or left processes behind)"
        + ("; interpret mode (CPU)" if check.get("interpret") else "")
        + "."
    )
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return overall


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
