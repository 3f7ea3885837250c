"""report.json's content for one session, and the console's lines on what it could not judge
(routing notes, unobservable routing, unclaimed ops): read from a Session, never written to it.
Below the session: it reads a session as a ``ReportSession``, what it uses of it."""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Protocol

from ..integrations import switches
from ..model import property_spec
from ..model.modes import mode_lines
from .evidence import EvidenceSession, session_evidence
from .modes import modes_report

if TYPE_CHECKING:
    from ..model.batch_reach import BatchReach
    from ..model.deployment import SizeReach


class ReportSession(EvidenceSession, Protocol):
    """What report.json and the console's lines read of a session (``Session`` is one): every
    verdict, note and count it keeps; and what ``evidence.EvidenceSession`` lists."""

    target: str
    started: float
    status: str
    not_covered: dict[str, str]
    unobservable: dict[tuple[str, str], str]
    routing_observed: set[str]
    unclaimed: dict[str, dict[str, Any]]
    known_status: list[dict[str, Any]]
    strict_controls: bool
    strict_contract: bool
    internal_errors: list[str]
    checked: int
    batch_reach: dict[tuple, BatchReach]
    size_reach: dict[tuple, SizeReach]
    cross_process_checks: int
    sweeps: list[dict]
    switching: dict[str, Any]
    skipped_known: dict[tuple, int]
    hang_suspicions: list[dict]

    def routing_notes(self) -> list[str]: ...


def report_properties(session: ReportSession) -> list[dict[str, Any]]:
    """The properties this run's ops are checked for, in registry order, with what each
    means: a user's property is listed in every report beside the built-in ones."""
    from ..catalogue import OPS

    ops = [OPS[op] for op in session.space.ops if op in OPS]
    used = {p for spec in ops for p in property_spec.properties_of(spec)}
    return [
        {
            "name": name,
            "description": spec.description,
            "control": spec.control,
            "builtin": name in property_spec.BUILTIN_PROPERTIES,
        }
        for name, spec in property_spec.PROPERTIES.items()
        if name in used
    ]


def session_report(session: ReportSession) -> dict[str, Any]:
    """report.json's content: every verdict, note and count of one session."""
    from ..reporting.certificate import provenance

    environment = {}
    try:
        environment = dict(session.runner._hellos["disabled"].environment)
    except KeyError:
        pass
    for hello in session.runner._hellos.values():  # the switch provider's record of each state
        environment.update(switches.rows(hello.provider))
    return {
        "target": session.target,
        "profile": session.space.profile,
        "strategies": session.space.source,
        "environment": environment,
        **provenance(),  # the command line and bi_props (the certificate's provenance)
        # the target's declared internal precision per op, per switch state (Target.precision)
        "precision": {state: hello.precision for state, hello in session.runner._hellos.items()},
        "examples": session.runner.examples,
        "elapsed_s": round(time.time() - session.started, 3),
        "findings": [asdict(f) for f in session.findings],
        "controls": [asdict(c) for c in session.controls],
        "not_covered": [{"op": op, "reason": why} for op, why in session.not_covered.items()],
        "routing_not_observable": [
            {"op": op, "switch": switch, "reason": why}
            | ({"declared": True} if op in (hello_field(session, "unobservable") or {}) else {})
            for (op, switch), why in session.unobservable.items()
        ],
        "unclaimed": [{"op": op, **entry} for op, entry in session.unclaimed.items()],
        "routing_observed": sorted(session.routing_observed),
        "routing_notes": routing_notes(session),
        "properties": report_properties(session),
        "promises_inference": hello_field(session, "promises_inference"),
        "known": session.known_status,
        "status": session.status,
        "strict_controls": session.strict_controls,
        "strict_contract": session.strict_contract,
        "internal_errors": list(session.internal_errors),
        "degenerate": degenerate_summary(session),
        "batch_reach": [
            {"op": op, "property": prop, "switch": switch, **reach.to_json()}
            for (op, prop, switch), reach in session.batch_reach.items()
        ],
        "size_reach": [
            {"op": op, "property": prop, "switch": switch, **reach.to_json()}
            for (op, prop, switch), reach in session.size_reach.items()
        ],
        "cross_process_checks": session.cross_process_checks,
        "sweeps": list(session.sweeps),
        "switching": session.switching or {"ok": None, "message": "not judged yet"},
        "evidence": session_evidence(session),
        # examples whose failure was a settled (known or recorded) class, let pass so that
        # the cell kept looking for other classes: counted, never silent
        "skipped_known": [
            {"op": op, "property": prop, "switch": switch, "examples": n}
            for (op, prop, switch), n in session.skipped_known.items()
        ],
        "hang_suspicions": list(session.hang_suspicions),
        **modes_report(session),  # modes drawn / not applicable, compile time (not kernel time)
    }


def degenerate_summary(session: ReportSession) -> dict[str, Any]:
    """The cells' degenerate examples: how many of the judged ones, and per cell why."""
    return {
        "examples": sum(n for n, _ in session.degenerate.values()),
        "of": session.checked,
        "cells": [
            {"op": op, "property": prop, "switch": switch, "examples": n, "reason": why}
            for (op, prop, switch), (n, why) in session.degenerate.items()
        ],
    }


def hello_field(session: ReportSession, name: str) -> Any:
    """A field of the enabled state's hello (the disabled one's before the switch ran)."""
    hello = session.runner._hellos.get("enabled") or session.runner._hellos.get("disabled")
    return getattr(hello, name, None) if hello is not None else None


def routing_notes(session: ReportSession) -> list[str]:
    """The targets' warnings about how routing is observed (e.g. a module without a prefix)."""
    notes = [h.routing_note for h in session.runner._hellos.values() if h.routing_note]
    return list(dict.fromkeys(notes))


def unclaimed_line(op: str, entry: dict[str, Any]) -> str:
    """One line on an op the target does not claim: batch-variant with the switch on?"""
    answer = "YES" if entry["batch_variant"] else "no"
    line = (
        f"not claimed: {op}: batch-variant with the switch on: {answer} "
        f"({entry['property']}, {entry['examples']} examples)"
    )
    return line + (f"; smallest case seen: {entry['case']}" if entry.get("case") else "")


def routing_lines(session: ReportSession) -> list[str]:
    """The console's lines on routing notes, unobservable routing and unclaimed ops."""
    lines = [f"WARNING: {note}" for note in session.routing_notes()]
    lines += [
        f"ROUTING NOT OBSERVABLE: {op} [{switch}]: {why}"
        for (op, switch), why in session.unobservable.items()
    ]
    lines += mode_lines(modes_report(session))  # compiled mode: modes drawn, not applicable
    return lines + [unclaimed_line(op, entry) for op, entry in session.unclaimed.items()]
