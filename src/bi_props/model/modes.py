"""Execution modes of a case (``Case.mode``): which modes a run draws, which are not applicable
and why, and the compile cost the workers report. Pure rules: no torch, no Hypothesis.

A space asks for modes (``[modes] choices``, default eager only); a target says which it supports
(``Target.modes()``, default both) and why not the others (``Target.unsupported_modes()``). The
run draws the modes both allow; where they share none, the target's own (the ``inductor``
target's switch is Inductor's config: every case compiles). A mode the space asks for and the
target does not support is *not applicable*, with the reason, in every report: never silently
skipped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from .case import MODES, Case

UNDECLARED = "the target does not list it in its modes (Target.modes, a module's MODES)"


def effective_modes(
    asked: Iterable[str], supported: Iterable[str], reasons: Mapping[str, str] | None = None
) -> tuple[tuple[str, ...], dict[str, str]]:
    """(the modes a run draws, in ``MODES`` order; {mode: why not applicable}).

    ``asked``: the space's modes; ``supported``: the target's; ``reasons``: its words for the
    modes it does not support. Where the two share no mode, the target's first mode is drawn
    (its switch exists only there) and every asked mode is not applicable."""
    asked, supported = tuple(asked), tuple(m for m in MODES if m in tuple(supported))
    if not supported:
        raise ValueError(f"a target must support at least one mode of {list(MODES)}")
    drawn = tuple(m for m in MODES if m in asked and m in supported) or supported[:1]
    why = dict(reasons or {})
    not_applicable = {m: why.get(m) or UNDECLARED for m in MODES if m in asked and m not in drawn}
    return drawn, not_applicable


def settle_mode(case: Case, drawn: tuple[str, ...], supported: Iterable[str] = ()) -> Case:
    """``case`` in a mode the target supports: itself where its mode is one of ``supported``
    (or of ``drawn``), else the run's first drawn mode (an explicit example, a known case or a
    sweep built eagerly, run against a target that compiles everything)."""
    if not isinstance(case, Case) or not drawn or case.mode in (*drawn, *supported):
        return case
    return replace(case, mode=drawn[0], options=dict(case.options))


def mode_lines(report: Mapping[str, Any]) -> list[str]:
    """One line on the modes of a run's ``report.json`` (empty for an eager-only run), and
    one per mode not applicable, with its reason."""
    modes = report.get("modes") or {}
    drawn = list(modes.get("drawn") or ())
    lines: list[str] = []
    compiled = report.get("compile") or {}
    if drawn and drawn != ["eager"]:
        line = f"Modes drawn: {', '.join(drawn)}"
        if compiled.get("examples"):
            line += (
                f"; compile: {compiled['graphs']} graph(s) in {compiled['seconds']:.1f} s over "
                f"{compiled['examples']} compiled observation(s) (measured apart, not counted "
                f"as kernel time)"
            )
        lines.append(line)
    for op, why in (compiled.get("piecewise") or {}).items():
        lines.append(
            f"compiled piecewise, not one graph (Dynamo runs what it cannot trace eagerly "
            f"between graphs): {op}: {why}"
        )
    for entry in modes.get("not_applicable") or ():
        lines.append(f"MODE NOT APPLICABLE: {entry['mode']}: {entry['reason']}")
    return lines


@dataclass
class CompileStats:
    """What the workers reported compiling (``Observation.evidence["compile"]``): seconds of
    Dynamo/Inductor compile (never kernel time), graphs compiled, observations that ran a
    compiled case, per op."""

    seconds: float = 0.0
    graphs: int = 0
    examples: int = 0
    per_op: dict[str, dict[str, float]] = field(default_factory=dict)
    # op -> why its call is compiled piecewise, not one graph (Dynamo's reason, first seen)
    piecewise: dict[str, str] = field(default_factory=dict)

    def add(self, op: str, evidence: Mapping[str, Any] | None) -> None:
        compiled = (evidence or {}).get("compile")
        if not compiled:
            return
        seconds, graphs = float(compiled.get("seconds", 0.0)), int(compiled.get("graphs", 0))
        if compiled.get("piecewise"):
            self.piecewise.setdefault(op, str(compiled["piecewise"]))
        self.seconds += seconds
        self.graphs += graphs
        self.examples += 1
        entry = self.per_op.setdefault(op, {"seconds": 0.0, "graphs": 0, "examples": 0})
        entry["seconds"] += seconds
        entry["graphs"] += graphs
        entry["examples"] += 1

    def merge(self, other: CompileStats) -> CompileStats:
        merged = CompileStats(self.seconds, self.graphs, self.examples, {})
        merged.piecewise = {**other.piecewise, **self.piecewise}
        merged.seconds += other.seconds
        merged.graphs += other.graphs
        merged.examples += other.examples
        for source in (self.per_op, other.per_op):
            for op, entry in source.items():
                mine = merged.per_op.setdefault(op, {"seconds": 0.0, "graphs": 0, "examples": 0})
                for key, value in entry.items():
                    mine[key] += value
        return merged

    def to_json(self) -> dict[str, Any]:
        return {
            "seconds": round(self.seconds, 3),
            "graphs": self.graphs,
            "examples": self.examples,
            "per_op": {
                op: {**entry, "seconds": round(entry["seconds"], 3)}
                for op, entry in sorted(self.per_op.items())
            },
            "piecewise": dict(sorted(self.piecewise.items())),
        }
