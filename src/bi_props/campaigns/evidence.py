"""The evidence a run collected, per op: what a green verdict rests on.

Per op: the examples each property's enabled cell judged (compared something that could differ:
not degenerate, not order-blind), the rows batch invariance judged, the known batch-variant
cases it ran, the stock kernel's hit rate ``p`` on the enabled cell's own draws (the negative
control's power probe) and the detection power ``1 - (1 - p)^n`` for its ``n`` judged examples:
the chance that this run would have caught a kernel as batch-variant as the stock one.

The floor: a claimed op whose enabled ``reference`` or ``batch_invariance`` cell judged fewer
than ``[runner] min_judged`` examples, or a model-level cell that did not run, is *thin*: the
run says so in its headline and exits 3 (no trustworthy verdict). A campaign holds every cell of
its space to it; a pytest run only the cells it ran (a ``-k`` selection leaves some out).

The counts come as a ``Tally``: a Session's own counters, or the coverage lines of
``examples.jsonl`` (a Ray driver receives its actors' lines). Below the session: it reads a
session as an ``EvidenceSession``, what it uses of it. Imports no torch.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from ..model.op_registry import OPS, cells
from ..model.space import Space

if TYPE_CHECKING:
    from ..runner.controller import Runner
    from .records import Finding

FLOORED = ("reference", "batch_invariance")
"""The enabled cells of a claimed op that must reach ``min_judged`` judged examples."""
MODEL_PROPERTIES = ("logprobs", "decode")
"""Model-level properties: each of their enabled cells must run at least once."""
JUDGED_OUTCOMES = frozenset({"ok", "mismatch", "error"})
"""Coverage-line outcomes of a judged example: the verdict compared something, pass or fail."""


class EvidenceSession(Protocol):
    """What the evidence reads of a session (``Session`` is one): its counters per cell, its
    findings, its controls (dataclasses: ``controls.Control``), its space, its runner (the
    enabled worker's hello) and whether the floor holds on every cell."""

    space: Space
    runner: Runner
    findings: list[Finding]
    controls: list[Any]
    judged: dict[tuple, int]
    order_blind: dict[tuple, int]
    rows_judged: dict[tuple, int]
    degenerate: dict[tuple, list]
    explicit_done: dict[tuple, set]
    floor_all_cells: bool


@dataclass
class Tally:
    """Per cell (op, property, switch): examples judged, order-blind, rows compared, explicit
    examples run, and whether the cell ran at all."""

    judged: dict[tuple, int] = field(default_factory=dict)
    order_blind: dict[tuple, int] = field(default_factory=dict)
    rows: dict[tuple, int] = field(default_factory=dict)
    explicit: dict[tuple, int] = field(default_factory=dict)
    ran: set[tuple] = field(default_factory=set)

    def add(self, line: dict[str, Any]) -> None:
        """Count one coverage line (``Session._note_example``)."""
        cell = (line.get("op"), line.get("property"), line.get("switch"))
        self.ran.add(cell)
        outcome = line.get("outcome")
        if outcome == "order-blind":
            self.order_blind[cell] = self.order_blind.get(cell, 0) + 1
        elif outcome in JUDGED_OUTCOMES:
            self.judged[cell] = self.judged.get(cell, 0) + 1
            if line.get("rows"):
                self.rows[cell] = self.rows.get(cell, 0) + int(line["rows"])
        if line.get("explicit"):
            self.explicit[cell] = self.explicit.get(cell, 0) + 1

    @classmethod
    def of_lines(cls, lines: Iterable[dict[str, Any]]) -> Tally:
        tally = cls()
        for line in lines:
            tally.add(line)
        return tally

    @classmethod
    def of_session(cls, session: EvidenceSession) -> Tally:
        ran = set(session.judged) | set(session.order_blind) | set(session.degenerate)
        ran |= {(f.op, f.property, f.switch) for f in session.findings}
        explicit = {cell: len(done) for cell, done in session.explicit_done.items()}
        return cls(
            dict(session.judged),
            dict(session.order_blind),
            dict(session.rows_judged),
            explicit,
            ran,
        )


def detection_power(p: float | None, n: int) -> float | None:
    """``1 - (1 - p)^n``: the chance that ``n`` independent draws, each catching a kernel as
    batch-variant as stock with probability ``p``, catch it at least once (None: p unknown)."""
    if p is None:
        return None
    return 1.0 - (1.0 - p) ** n


def _enabled(cell: tuple[str, str, str]) -> bool:
    return cell[2] in ("enabled", "both")


def op_evidence(
    space: Space,
    op: str,
    claimed: bool,
    tally: Tally,
    control: dict[str, Any] | None,
    every: bool,
) -> dict[str, Any]:
    """One op's evidence (see the module's docstring); ``thin`` lists why it is thin.
    ``control``: its batch-invariance negative control (``asdict(Control)``), if any;
    ``every``: the floor holds for cells that did not run too (a campaign)."""
    mine = [c for c in cells([op], space.exclude_properties) if _enabled(c)]
    judged = {prop: tally.judged.get(c, 0) for c in mine for prop in [c[1]]}
    blind = {c[1]: n for c in mine if (n := tally.order_blind.get(c, 0))}
    rows = {c[1]: n for c in mine if (n := tally.rows.get(c, 0))}
    entry: dict[str, Any] = {
        "op": op,
        "claimed": claimed,
        "judged": judged,
        "order_blind": blind,
        "rows": rows,
        "known_variant_judged": tally.explicit.get((op, "batch_invariance", "enabled"), 0),
    }
    if control is not None:
        hits, n = int(control.get("power_hits", 0)), int(control.get("power_judged", 0))
        # No variance seen with the switch off: there is no stock-like kernel to catch here.
        p = hits / n if n and control.get("variance_seen") else None
        stock = "variant" if control.get("variance_seen") else "unknown"
        if control.get("applicable") is False:
            stock = "invariant"
        entry.update(
            p=p,
            p_hits=hits,
            p_judged=n,
            power=detection_power(p, judged.get("batch_invariance", 0)),
            stock=stock,
        )
    elif "batch_invariance" in judged:
        entry["stock"] = "no control (stock cannot vary here)"
    thin = []
    for prop in FLOORED if claimed else ():
        cell = next((c for c in mine if c[1] == prop), None)
        if cell is None or not (every or cell in tally.ran):
            continue
        if judged[prop] < space.min_judged:
            thin.append(f"{prop}: {judged[prop]} judged < {space.min_judged}")
    for prop in MODEL_PROPERTIES if every else ():
        cell = next((c for c in mine if c[1] == prop), None)
        if cell is not None and cell not in tally.ran:
            thin.append(f"{prop}: the model-level cell did not run")
    entry["thin"] = thin
    return entry


def evidence(
    space: Space,
    claimed: Iterable[str],
    tally: Tally,
    controls: Iterable[dict[str, Any]],
    every: bool,
) -> dict[str, Any]:
    """The run's evidence per op, and the thin ones (``FLOORED``, ``MODEL_PROPERTIES``)."""
    claimed = set(claimed)
    by_op = {c["op"]: c for c in controls if c.get("property") == "batch_invariance"}
    ops = [op for op in space.ops if op in OPS]
    entries = [op_evidence(space, op, op in claimed, tally, by_op.get(op), every) for op in ops]
    return {
        "min_judged": space.min_judged,
        "ops": entries,
        "thin": [f"{e['op']} ({'; '.join(e['thin'])})" for e in entries if e["thin"]],
        "rows_judged": sum(tally.rows.values()),
        "judged": sum(tally.judged.values()),
        "order_blind": sum(tally.order_blind.values()),
    }


def session_evidence(session: EvidenceSession) -> dict[str, Any]:
    """``evidence`` of a Session: its own counters, controls and claims (the enabled worker's
    hello, when it has started)."""
    from dataclasses import asdict

    hello = session.runner._hellos.get("enabled")
    claimed = hello.covered if hello is not None else ()
    controls = [asdict(c) for c in session.controls]
    tally = Tally.of_session(session)
    return evidence(session.space, claimed, tally, controls, session.floor_all_cells)


def power_text(entry: dict[str, Any]) -> str:
    """One op's batch-invariance evidence in words, for headlines and summaries."""
    n = entry["judged"].get("batch_invariance")
    if n is None:
        return "no batch invariance cell"
    text = f"{n} judged"
    if entry.get("known_variant_judged"):
        text += f" ({entry['known_variant_judged']} known stock-variant cases)"
    if entry.get("p") is not None:
        text += f", p = {entry['p_hits']}/{entry['p_judged']}, power {entry['power']:.2f}"
    elif entry.get("stock") == "invariant":
        text += ", stock invariant here (power not measurable)"
    return text


__all__ = [
    "FLOORED",
    "MODEL_PROPERTIES",
    "Tally",
    "detection_power",
    "evidence",
    "power_text",
    "session_evidence",
]
