"""``DIR/junit.xml``: one testcase per cell (and per negative control), for CI dashboards.

Structure (the common JUnit schema that Jenkins, GitLab and GitHub test reporters read):
``<testsuites>`` > one ``<testsuite>`` per target > ``<testcase classname name time>`` with a
``<failure message type>`` (open findings), a ``<skipped message>`` (known failures, cells the
budget never reached, ops the target does not claim) or nothing (passed); ``<system-out>`` says
how many examples ran; a finding of kind ``internal`` (a bug of bi_props) is an ``<error>``.
Negative controls are testcases: one that saw no variance (blind) is ``<skipped>``, or a
``<failure>`` when the run was strict (``strict_controls``); their output says what they saw.
A contract widening (kind ``widening``, "accepts more than stock") is ``<skipped>`` with its case,
or a ``<failure>`` when the run was strict (``strict_contract``).
"""

from __future__ import annotations

import socket
import xml.etree.ElementTree as ET
from datetime import datetime, timezone

from .data import (
    ACCEPTS_MORE,
    BLIND_CONTROL,
    ReportData,
    cell_name,
    fails_run,
    fresh_process,
    unclaimed_text,
    widenings,
)
from .markdown import first_line


def _safe(text: object) -> str:
    """Text without the control characters XML 1.0 forbids."""
    return "".join(
        ch
        for ch in str(text)
        if ch in "\t\n\r" or (ord(ch) >= 0x20 and ord(ch) not in (0xFFFE, 0xFFFF))
    )


def render(data: ReportData) -> str:
    r = data.report
    root = ET.Element("testsuites", name="bi_props")
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    total_time = 0.0
    timestamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
    for target in data.targets:
        suite = ET.SubElement(root, "testsuite", name=f"bi_props.{target}")
        counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
        suite_time = 0.0
        cells = [c for c in data.cells if c.get("target", target) == target]
        for c in cells:
            op, prop, switch = c["op"], c["property"], c["switch"]
            seconds = float(c.get("seconds", 0.0) or 0.0)
            case = ET.SubElement(
                suite,
                "testcase",
                classname=f"bi_props.{target}.{op}",
                name=cell_name(op, prop, switch),
                time=f"{seconds:.3f}",
            )
            counts["tests"] += 1
            suite_time += seconds
            found = data.cell_findings(target, op, prop, switch)
            failing = [s for s in found if fails_run(s, r)]
            known = [s for s in found if s.status == "known"]
            wider = widenings(r, found)
            if failing:
                head = failing[0].finding
                internal = any(s.finding.get("kind") == "internal" for s in failing)
                counts["errors" if internal else "failures"] += 1
                failure = ET.SubElement(
                    case,
                    "error" if internal else "failure",
                    message=_safe(
                        f"{failing[0].status}: {head.get('kind')}: "
                        f"{first_line(head.get('message'))}"
                    ),
                    type=_safe(head.get("error_type") or head.get("kind") or "finding"),
                )
                failure.text = _safe(
                    "\n\n".join(
                        f"[{s.status}] {s.note}\nkind: {s.finding.get('kind')}\n"
                        f"fresh process: {fresh_process(s.finding)}\n"
                        f"shrink: {s.finding.get('shrink', 'complete')}\n"
                        f"case: {s.finding.get('case')}\n\n{s.finding.get('message')}"
                        for s in failing
                    )
                )
            elif wider:
                counts["skipped"] += 1
                ET.SubElement(
                    case,
                    "skipped",
                    message=_safe(
                        f"{ACCEPTS_MORE} (not a failure without --strict-contract): "
                        f"{first_line(wider[0].finding.get('message'))}; case: "
                        f"{wider[0].finding.get('case')}"
                    ),
                )
            elif known:
                counts["skipped"] += 1
                ET.SubElement(
                    case,
                    "skipped",
                    message=_safe(f"known failure: {first_line(known[0].finding.get('message'))}"),
                )
            elif not c.get("examples"):
                counts["skipped"] += 1
                ET.SubElement(case, "skipped", message="not run: the budget ended first")
            elif data.unobservable(target, op, prop, switch) is not None:
                counts["skipped"] += 1
                why = data.unobservable(target, op, prop, switch)
                ET.SubElement(case, "skipped", message=_safe(f"routing not observable: {why}"))
            elif (
                switch == "enabled"
                and prop in ("batch_invariance", "logprobs")
                and data.unclaimed(target, op) is not None
            ):
                counts["skipped"] += 1
                text = unclaimed_text(data.unclaimed(target, op) or {})
                ET.SubElement(case, "skipped", message=_safe(text))
            elif switch != "disabled" and data.not_covered(target, op) is not None:
                counts["skipped"] += 1
                ET.SubElement(
                    case,
                    "skipped",
                    message=_safe(f"not covered by the target: {data.not_covered(target, op)}"),
                )
            out = ET.SubElement(case, "system-out")
            out.text = _safe(
                f"{c.get('examples', 0)} examples in the campaign"
                + (
                    f", {c['examples_this_run']} in this run"
                    if c.get("examples_this_run") is not None
                    else ""
                )
            )
        for control in r.get("controls", []):
            if control.get("target", target) != target:
                continue
            counts["tests"] += 1
            case = ET.SubElement(
                suite,
                "testcase",
                classname=f"bi_props.{target}.controls",
                name=f"{control.get('op')} {control.get('property')} [disabled] (negative control)",
                time="0.000",
            )
            if not control.get("variance_seen"):
                if r.get("strict_controls"):
                    counts["failures"] += 1
                    blind = ET.SubElement(case, "failure", message=BLIND_CONTROL, type="blind")
                    blind.text = _safe(control.get("message", ""))
                else:
                    counts["skipped"] += 1
                    ET.SubElement(case, "skipped", message=BLIND_CONTROL)
            out = ET.SubElement(case, "system-out")
            seen = "batch variance seen" if control.get("variance_seen") else "no variance seen"
            out.text = _safe(f"{seen}\n{control.get('case') or ''}\n{control.get('message', '')}")
        suite.set("tests", str(counts["tests"]))
        suite.set("failures", str(counts["failures"]))
        suite.set("errors", str(counts["errors"]))
        suite.set("skipped", str(counts["skipped"]))
        suite.set("time", f"{suite_time:.3f}")
        suite.set("timestamp", timestamp)
        suite.set("hostname", _safe(socket.gethostname()))
        for key in totals:
            totals[key] += counts[key]
        total_time += suite_time
    for key, value in totals.items():
        root.set(key, str(value))
    root.set("time", f"{total_time:.3f}")
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
