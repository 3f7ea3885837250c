"""``bi-props scenarios``: an engine-scenario campaign over switch states, and its report.

Each state (``targets.engine_states.STATES``: off, kernels, on) runs in its own spawned process
(``scenario_worker``), one after the other, with an equal share of the budget: the switch and the
installed kernels are process-wide and one-way. The controller collects what each found, judges
per state and property (held with how many scenarios judged, failed with the shrunk finding, not
judged, state broken), and writes report.json, report.md, report.html and one reproducer per
finding (``reporting.scenario_report``).

Exit status: 0 no finding, 1 a finding (a property failed, or a state broken at its first
forward), 3 a worker process failed (bi_props itself, or a crash that left no result).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from ..model.scenario import ScenarioSpace
from ..model.scenario_judge import PROPERTIES

GRACE_S = 180.0
"""A worker may run this much past its share: start-up (vLLM's first engine build costs tens of
seconds) and a shrink in progress. Past it, the worker is killed and the state reported failed."""
SHRINK_S = 60.0
"""How long a search may go on shrinking a failure past its share (``campaigns.scenarios.search``);
a run with a hard limit of its own (the GPU check's scenarios part) passes less."""


def verdicts(states: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per state and property: the verdict and its evidence counts (searches summed)."""
    rows = []
    for state in states:
        for prop in PROPERTIES:
            searches = [s for s in state.get("searches", []) if s["prop"] == prop]
            row: dict[str, Any] = {
                "state": state["state"],
                "prop": prop,
                "judged": sum(s["examples"] for s in searches),
                "not_applicable": sum(s["not_applicable"] for s in searches),
                "skipped": sum(s["skipped"] for s in searches),
                "replays": sum(s["replays"] for s in searches),
                "findings": sorted({s["finding"]["kind"] for s in searches if s["finding"]}),
            }
            if state.get("broken") or state.get("failed"):
                row["verdict"] = "state broken" if state.get("broken") else "worker failed"
            elif row["findings"]:
                row["verdict"] = "FAILED"
            elif row["judged"]:
                row["verdict"] = "held"
            else:
                row["verdict"] = "not judged"
            rows.append(row)
    return rows


def findings(states: list[dict[str, Any]], target: str) -> list[dict[str, Any]]:
    """Every finding, named by state and search (one per state, property and kind: the same
    property failing in several searches is one finding that lists the other spaces), plus one
    per state broken at its first forward."""
    out = []
    for state in states:
        if state.get("broken"):
            out.append(
                {
                    "state": state["state"],
                    "prop": "(first forward)",
                    "pass": None,
                    "kind": "state broken",
                    "message": state["broken"],
                    "target": target,
                }
            )
        seen: dict[tuple[str, str], dict[str, Any]] = {}
        for search in state.get("searches", []):
            if not search["finding"]:
                continue
            key = (search["prop"], search["finding"]["kind"])
            if key in seen:  # the same property failing again in a narrower space: one finding
                seen[key]["also_failed_in"].append(search["pass"])
                continue
            finding = dict(search["finding"])
            finding.update(state=state["state"], target=target, also_failed_in=[])
            finding["pass"] = search["pass"]
            seen[key] = finding
            out.append(finding)
    return out


def run_state(
    target: str,
    state: str,
    space: ScenarioSpace,
    examples: int,
    seconds: float,
    work: Path,
    model_dir: str | None = None,
    shrink_s: float = SHRINK_S,
    props: tuple[str, ...] | None = None,
) -> dict[str, Any]:
    """One state in a fresh interpreter; its result, or ``failed`` with why. ``props``: only the
    searches of the worker's plan that judge these properties (None: all of them)."""
    request = {
        "target": target,
        "state": state,
        "space": asdict(space),
        "examples": examples,
        "seconds": seconds,
        "model_dir": model_dir,
        "shrink_s": shrink_s,
    }
    if props is not None:
        from .scenario_worker import PLAN

        request["plan"] = [list(p) for p in PLAN if p[1] in props]
    request_path = work / f"state-{state}.request.json"
    result_path = work / f"state-{state}.json"
    log_path = work / f"state-{state}.log"
    request_path.write_text(json.dumps(request, indent=1))
    result_path.unlink(missing_ok=True)
    command = [sys.executable, "-m", "bi_props.campaigns.scenario_worker"]
    start = time.perf_counter()
    with log_path.open("w") as log:
        try:
            proc = subprocess.run(
                [*command, str(request_path), str(result_path)],
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=seconds + GRACE_S,
                env=dict(os.environ),
                check=False,
            )
            code: int | str = proc.returncode
        except subprocess.TimeoutExpired:
            code = f"killed after {seconds + GRACE_S:.0f} s"
    if code == 0 and result_path.exists():
        return json.loads(result_path.read_text())
    tail = log_path.read_text(errors="replace")[-1500:]
    return {
        "state": state,
        "failed": f"the worker exited with {code} after {time.perf_counter() - start:.0f} s; "
        f"log {log_path}:\n{tail}",
        "searches": [],
    }


def run_campaign(
    target: str,
    space: ScenarioSpace,
    states: list[str],
    budget: float,
    examples: int,
    out: Path,
    *,
    space_file: str = "",
    model_dir: str | None = None,
    shrink_s: float = SHRINK_S,
    props: tuple[str, ...] | None = None,
) -> tuple[dict[str, Any], int]:
    """Every state in turn, then the reports; (report, exit status)."""
    from ..reporting.scenario_report import write_all

    start = time.perf_counter()
    work = out / "states"
    work.mkdir(parents=True, exist_ok=True)
    results = []
    for n, state in enumerate(states):
        spent = sum(r.get("seconds", 0) - r.get("startup_s", 0) for r in results)
        share = max(1.0, (budget - spent) / (len(states) - n))
        results.append(
            run_state(target, state, space, examples, share, work, model_dir, shrink_s, props)
        )
    report = {
        "kind": "engine-scenarios",
        "target": target,
        "space_file": space_file,
        "space": asdict(space),
        "examples": examples,
        "budget_s": budget,
        "shrink_s": shrink_s,
        "props": list(props or PROPERTIES),
        "seconds": round(time.perf_counter() - start, 1),
        "states": results,
        "verdicts": verdicts(results),
        "findings": findings(results, target),
    }
    failed = [r["state"] for r in results if r.get("failed")]
    report["exit"] = 3 if failed else (1 if report["findings"] else 0)
    write_all(report, out)
    return report, report["exit"]
