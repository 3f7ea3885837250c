"""Nightly fuzzing campaigns: rounds with fresh seeds, persistent findings, several targets.

A campaign is what ``bi-props fuzz`` runs. Its state lives in the output directory ``DIR`` and
survives the process (a nightly job restores and saves it between runs):

- ``DIR/examples/``: the Hypothesis example database. Each cell (target, op, property, switch)
  has a stable key (``fuzz.database_key``), so past failures replay first in every later run;
- ``DIR/findings.jsonl``: one finding per line, appended the moment it is recorded, flushed and
  fsync'ed: a SIGKILL loses nothing already found;
- ``DIR/campaign.json``: the runs (each with its seed and the range of rounds it ran per target)
  and the examples spent per cell (atomic rewrite);
- ``DIR/report.json`` (the README's schema, plus campaign keys), ``DIR/examples.jsonl`` (coverage
  lines) and, at the end of every run, ``report.md``, ``junit.xml``, ``report.html``.

A *round* sweeps every live cell of a target once, one turn of ``fuzz.SLICE_EXAMPLES`` examples
each, least-run first. Round ``r`` of target ``t`` uses the seed ``round_seed(S, t, r)`` where
``S`` is the run's seed (``--seed``, else random; recorded in the report with the range of rounds
the run covered), and each turn the seed ``derive_seed(round seed, op, property, switch)``: a
campaign with ``--seed`` is reproducible, and a resumed one continues with new round indices
(new seeds), never repeating old randomness.

One finding per distinct ``Finding.signature()`` across the whole campaign: previous findings are
reloaded on start (``--resume``, or automatically when ``DIR/findings.jsonl`` exists) and a cell
that fails again with a known signature is marked *still failing*, not reported twice. Several
targets get one Session each; the next turn goes to the target that has used the least time, so
the budget is split fairly between targets, and equally (in examples) between a target's cells.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO

from ..catalogue import controls as catalogue_controls
from ..model.space import Space
from ..runner.controller import WorkerFailure
from .evidence import FLOORED, MODEL_PROPERTIES
from .explicit import load_variants, pending
from .fuzz import SLICE_EXAMPLES, Cell, Interrupted, _on_sigterm, cells_for, run_slice
from .scheduler import Item, Scheduler
from .session import (
    INTERNAL,
    STATUS_INTERNAL,
    STATUS_RUNNING,
    Finding,
    Session,
    routing_lines,
    target_status,
)
from .switching_check import SwitchingCheck
from .switching_check import finding_fields as switching_finding

FINDINGS_FILE = "findings.jsonl"
STATE_FILE = "campaign.json"
REPORT_FILE = "report.json"
DATABASE_DIR = "examples"
COVERAGE_FILE = "examples.jsonl"
STATE_VERSION = 1

EXIT_INCOMPLETE = 3  # no enabled-state cell ran: the campaign gives no verdict
MAX_TURNS_RECORDED = 20000  # turns listed in report.json (a night has more; the shares count all)

_FINDING_FIELDS = tuple(f.name for f in fields(Finding))


def _status(ledger: Ledger) -> str:
    """report.json's ``status``, decided here only. An event may have decided it already
    (``ledger.status``: "target missing", "target broken", "internal error"); otherwise "running"
    while the run goes on, then "interrupted", "incomplete" (no enabled-state cell ran: no
    verdict), or "complete"."""
    if ledger.status != STATUS_RUNNING:
        return ledger.status
    if not ledger.finished:
        return STATUS_RUNNING
    if ledger.interrupted:
        return "interrupted"
    if not ledger.enabled_state_ran():
        return "incomplete"
    return "complete"


def _merge_degenerate(reports: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The targets' degenerate examples together (``Session.degenerate_summary``)."""
    merged: dict[str, Any] = {"examples": 0, "of": 0, "cells": []}
    for target, r in reports.items():
        d = r.get("degenerate") or {}
        merged["examples"] += int(d.get("examples", 0))
        merged["of"] += int(d.get("of", 0))
        merged["cells"] += [{**c, "target": target} for c in d.get("cells", [])]
    return merged


def _merge_evidence(reports: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The targets' evidence together (``evidence.evidence``): one entry per target and op."""
    merged: dict[str, Any] = {"min_judged": None, "ops": [], "thin": []}
    for key in ("rows_judged", "judged", "order_blind"):
        merged[key] = 0
    several = len(reports) > 1
    for target, r in reports.items():
        e = r.get("evidence") or {}
        merged["min_judged"] = e.get("min_judged", merged["min_judged"])
        merged["ops"] += [{**o, "target": target} for o in e.get("ops", [])]
        merged["thin"] += [f"{target}: {t}" if several else t for t in e.get("thin", [])]
        for key in ("rows_judged", "judged", "order_blind"):
            merged[key] += int(e.get(key, 0))
    return merged


def derive_seed(*parts: Any) -> int:
    """A 64-bit seed from the parts (same parts, same seed, on every machine and Python)."""
    digest = hashlib.sha256(repr(tuple(parts)).encode()).digest()
    return int.from_bytes(digest[:8], "big")


def round_seed(run_seed: int, target: str, index: int) -> int:
    """The seed of round ``index`` of ``target`` in a run whose seed is ``run_seed``."""
    return derive_seed(run_seed, target, index)


def turn_seed(round_seed: int, op: str, prop: str, switch: str, turn: int = 0) -> int:
    """The seed of one turn of a cell in a round (a Ray shard may run several turns)."""
    if turn == 0:
        return derive_seed(round_seed, op, prop, switch)
    return derive_seed(round_seed, op, prop, switch, turn)


def cell_key(target: str, op: str, prop: str, switch: str) -> str:
    return f"{target}|{op}|{prop}|{switch}"


def finding_from_dict(data: dict[str, Any]) -> Finding:
    """A Finding from its JSON form (unknown keys ignored, so later fields do not break old
    readers, and missing optional ones default)."""
    return Finding(**{k: data[k] for k in _FINDING_FIELDS if k in data})


def done_outcome(ledger: Ledger, new_before: int, reseen_before: int, why: str = "") -> str:
    """The progress line's end for a cell that is done: what its last turn found, and why the
    cell retired (``Cell.retired_why``)."""
    because = f"; retired: {why}" if why else ""
    if len(ledger.new) > new_before:
        return " -> FINDING" + because
    if len(ledger.reseen) > reseen_before:
        return " -> still failing (known from a previous run)" + because
    return " -> retired" + (f": {why}" if why else "")


def live_outcome(ledger: Ledger, new_before: int, reseen_before: int) -> str:
    """The progress line's end for a cell that stays live after its turn."""
    if len(ledger.new) > new_before:
        added = ledger.findings[len(ledger.findings) - (len(ledger.new) - new_before) :]
        if all(f.status == "known" for f in added):
            return " -> a known failure (recorded as known); the cell keeps exploring"
        return " -> FINDING; the cell keeps exploring for other bugs"
    if len(ledger.reseen) > reseen_before:
        return " -> still failing (known from a previous run); the cell keeps exploring"
    return ""


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


class FindingsLog:
    """``DIR/findings.jsonl``: append-only, one JSON finding per line, durable on return."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self, log: TextIO | None = None) -> list[Finding]:
        """Every finding in the file, in order. A torn last line (a kill mid-write) is skipped."""
        if not self.path.exists():
            return []
        found = []
        for number, line in enumerate(self.path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                found.append(finding_from_dict(json.loads(line)))
            except (json.JSONDecodeError, TypeError) as exc:
                if log is not None:
                    print(f"bi-props: {self.path}:{number}: skipped ({exc})", file=log)
        return found

    def append(self, finding: Finding) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        created = not self.path.exists()
        with self.path.open("a") as f:
            f.write(json.dumps(asdict(finding), default=str) + "\n")
            f.flush()
            os.fsync(f.fileno())
        if created:  # make the new directory entry itself durable
            try:
                fd = os.open(self.path.parent, os.O_RDONLY)
            except OSError:
                return
            try:
                os.fsync(fd)
            except OSError:
                pass
            finally:
                os.close(fd)


@dataclass
class CellStats:
    target: str
    op: str
    property: str
    switch: str
    examples: int = 0  # Hypothesis examples over the whole campaign
    examples_this_run: int = 0
    turns: int = 0
    seconds: float = 0.0
    retired: bool = False  # this run: the cell retired (fuzz.settle_turn's rule)
    retired_why: str = ""  # why, in words ("" while live)


TargetSource = Callable[[], dict[str, Any]]
"""Returns one target's ``Session.report()``-shaped dict (local session, or merged from actors)."""


class Ledger:
    """Campaign state shared by the local and the Ray drivers: findings (deduplicated by
    signature, persisted), rounds and seeds, per-cell statistics, and the combined report."""

    def __init__(
        self,
        out: Path,
        targets: list[str],
        space: Space,
        *,
        seed: int | None = None,
        resume: bool = False,
        budget_s: float = 0.0,
        log: TextIO = sys.stderr,
        mode: str = "local",
    ) -> None:
        self.out = Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.targets = list(targets)
        self.space = space
        self.log = log
        self.budget_s = budget_s
        self.mode = mode
        self.seed_given = seed is not None
        self.seed = seed if seed is not None else secrets.randbits(32)
        self.started = time.time()
        self.started_monotonic = time.monotonic()
        self.findings_log = FindingsLog(self.out / FINDINGS_FILE)
        self.sources: dict[str, TargetSource] = {}
        self.findings: list[Finding] = []
        self._signatures: set[tuple] = set()
        # signature -> that of the finding accounting for it (Finding.settles)
        self._settled: dict[tuple, tuple] = {}
        self.previous: set[tuple] = set()
        self.new: set[tuple] = set()
        self.reseen: set[tuple] = set()
        self.round_ranges: dict[str, list[int]] = {}  # this run: target -> [first, last]
        self._next_round: dict[str, int] = {}
        self.runs: list[dict[str, Any]] = []
        self.cells: dict[str, CellStats] = {}
        self.interrupted = False
        self.status = "running"  # report.json's "status" (session.py's STATUS_* values)
        self.extra: dict[str, Any] = {}
        self._cells_started: float | None = None
        self._cells_examples_start = 0
        self._cells_seconds = 0.0
        self._cells_examples = 0
        # Where the time went (seconds): control turns, cell turns less their shrinking, shrinking.
        self.time = {"controls": 0.0, "cells": 0.0, "shrinking": 0.0}
        self.turns: list[dict[str, Any]] = []  # one per turn: what ran, examples, examples/s
        self.finished = False
        self.resumed = self._load(resume)
        self.run_index = len(self.runs)
        self.runs.append(
            {
                "run": self.run_index,
                "started": _now(),
                "seed": self.seed,
                "seed_given": self.seed_given,
                "budget_s": budget_s,
                "mode": mode,
                "resumed": self.resumed,
                "rounds": self.round_ranges,
            }
        )
        self.save_state()

    # -- persistence ---------------------------------------------------------------------------

    def _load(self, resume: bool) -> bool:
        """Reload previous findings and state; True when this run continues a campaign."""
        previous = self.findings_log.load(self.log)
        if not previous and resume:
            previous = self._import_legacy_report()
        for finding in previous:
            if finding.signature() not in self._signatures:
                self._signatures.add(finding.signature())
                self._settle(finding)
                self.previous.add(finding.signature())
                self.findings.append(finding)
        state = self._read_state()
        self.runs = list(state.get("runs", []))
        for run in self.runs:
            for target, (_, last) in (run.get("rounds") or {}).items():
                self._next_round[target] = max(self._next_round.get(target, 0), last + 1)
        for key, stats in state.get("cells", {}).items():
            target, op, prop, switch = key.split("|")
            self.cells[key] = CellStats(
                target,
                op,
                prop,
                switch,
                int(stats.get("examples", 0)),
                0,
                int(stats.get("turns", 0)),
                float(stats.get("seconds", 0.0)),
            )
        resumed = bool(previous or self.runs)
        if resumed:
            print(
                f"bi-props: resuming the campaign in {self.out}: {len(self.findings)} previous "
                f"finding(s), {sum(self._next_round.values())} round(s) in {len(self.runs)} "
                f"run(s)",
                file=self.log,
                flush=True,
            )
        return resumed

    def _import_legacy_report(self) -> list[Finding]:
        """``--resume`` on a directory from before campaigns: take report.json's findings."""
        path = self.out / REPORT_FILE
        try:
            report = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            return []
        found = [finding_from_dict(f) for f in report.get("findings", [])]
        for finding in found:
            self.findings_log.append(finding)
        return found

    def _read_state(self) -> dict[str, Any]:
        path = self.out / STATE_FILE
        if not path.exists():
            return {}
        try:
            state = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            print(f"bi-props: {path} unreadable ({exc}); starting its record afresh", file=self.log)
            return {}
        return state if isinstance(state, dict) else {}

    def save_state(self) -> None:
        state = {
            "version": STATE_VERSION,
            "targets": self.targets,
            "seed": self.seed,
            "runs": self.runs,
            "cells": {
                key: {"examples": c.examples, "turns": c.turns, "seconds": round(c.seconds, 3)}
                for key, c in self.cells.items()
            },
        }
        _atomic_write(self.out / STATE_FILE, json.dumps(state, indent=1))

    # -- findings ------------------------------------------------------------------------------

    def record(self, finding: Finding) -> bool:
        """Keep a finding once per signature; True when it is new to the campaign. New findings
        are on disk (findings.jsonl, fsync'ed) before this returns."""
        signature = finding.signature()
        held = signature if signature in self._settled else (*signature[:-1], "*")
        if held in self._settled:  # its own, or met again as a flaky finding's first kind
            owner = self._settled[held]
            if owner in self.previous:
                self.reseen.add(owner)
            return False
        self._signatures.add(signature)
        self._settle(finding)
        self.new.add(signature)
        self.findings.append(finding)
        self.findings_log.append(finding)
        return True

    def _settle(self, finding: Finding) -> None:
        for signature in finding.settles():
            self._settled.setdefault(signature, finding.signature())

    def known_signature(self, signature: tuple) -> bool:
        """Whether a finding of the campaign accounts for this full signature (its own, or a
        flaky finding's first-seen kind: ``Finding.settles``; a class-free finding, any
        class)."""
        return signature in self._settled or (*signature[:-1], "*") in self._settled

    # -- rounds and cells ----------------------------------------------------------------------

    def next_round(self, target: str) -> tuple[int, int]:
        """Start the target's next round: (index, seed). Indices continue across runs."""
        index = self._next_round.get(target, 0)
        self._next_round[target] = index + 1
        self.round_ranges.setdefault(target, [index, index])[1] = index
        self.save_state()
        return index, round_seed(self.seed, target, index)

    @property
    def rounds(self) -> list[dict[str, Any]]:
        """Every run's rounds per target: the index range and the run's seed (round r's seed is
        ``round_seed(seed, target, r)``)."""
        return [
            {"run": run.get("run"), "target": target, "first": first, "last": last,
             "seed": run.get("seed")}
            for run in self.runs
            for target, (first, last) in (run.get("rounds") or {}).items()
        ]  # fmt: skip

    def cell(self, target: str, op: str, prop: str, switch: str) -> CellStats:
        key = cell_key(target, op, prop, switch)
        if key not in self.cells:
            self.cells[key] = CellStats(target, op, prop, switch)
        return self.cells[key]

    def turn_done(
        self, stats: CellStats, examples: int, seconds: float, retired: bool, why: str = ""
    ) -> None:
        stats.examples += examples
        stats.examples_this_run += examples
        stats.turns += 1
        stats.seconds += seconds
        if retired and not stats.retired:
            stats.retired, stats.retired_why = True, why

    def turn(
        self,
        kind: str,
        target: str,
        name: str,
        examples: int,
        seconds: float,
        shrink_s: float = 0.0,
        limit_s: float | None = None,
    ) -> None:
        """Record one turn: its examples/s go to the report, its time to the time shares."""
        if kind == "control":
            self.time["controls"] += seconds
        else:
            self.time["cells"] += max(seconds - shrink_s, 0.0)
            self.time["shrinking"] += shrink_s
        if len(self.turns) < MAX_TURNS_RECORDED:
            self.turns.append(
                {
                    "at_s": round(time.monotonic() - self.started_monotonic, 3),
                    "kind": kind,
                    "target": target,
                    "what": name,
                    "examples": examples,
                    "seconds": round(seconds, 4),
                    "examples_per_s": round(examples / seconds, 2) if seconds > 0 else None,
                    "limit_s": None if limit_s is None else round(limit_s, 3),
                    "shrink_s": round(shrink_s, 3),
                }
            )

    def cells_not_run(self) -> list[CellStats]:
        """Cells that had no example in this run."""
        return [c for c in self.cells.values() if c.examples_this_run == 0]

    def enabled_state_ran(self) -> bool:
        """Whether any enabled-state or parity cell ran an example in this run."""
        return any(
            c.examples_this_run > 0 for c in self.cells.values() if c.switch in ("enabled", "both")
        )

    def time_shares(self, elapsed: float) -> dict[str, Any]:
        seconds = {k: round(v, 3) for k, v in self.time.items()}
        seconds["other"] = round(max(elapsed - sum(self.time.values()), 0.0), 3)
        return {
            "seconds": seconds,
            "shares": {
                k: round(v / elapsed, 4) if elapsed > 0 else None for k, v in seconds.items()
            },
        }

    def cells_phase(self, examples_now: int) -> None:
        """Mark the start of the cells phase (after start-up and controls): throughput base."""
        if self._cells_started is None:
            self._cells_started = time.monotonic()
            self._cells_examples_start = examples_now

    def cells_phase_end(self, examples_now: int) -> None:
        if self._cells_started is not None:
            self._cells_seconds = time.monotonic() - self._cells_started
            self._cells_examples = examples_now - self._cells_examples_start

    # -- the report ----------------------------------------------------------------------------

    def examples_this_run(self, reports: dict[str, dict[str, Any]] | None = None) -> int:
        reports = reports if reports is not None else self._target_reports()
        return sum(int(r.get("examples", 0)) for r in reports.values())

    def _target_reports(self) -> dict[str, dict[str, Any]]:
        return {t: self.sources[t]() for t in self.targets if t in self.sources}

    def finding_status(self, signature: tuple) -> str:
        if signature in self.new:
            return "new"
        if signature in self.reseen:
            return "still failing"
        return "not seen this run"

    def report(self) -> dict[str, Any]:
        reports = self._target_reports()
        first = next(iter(reports.values()), {})
        report: dict[str, Any] = dict(first)  # keys other tooling adds to Session.report() pass
        previous_examples = sum(int(r.get("examples_this_run", 0)) for r in self.runs[:-1])
        this_run = self.examples_this_run(reports)
        known: list[dict[str, Any]] = []  # each Session's re-checked known failures
        for r in reports.values():
            for entry in r.get("known", []) or []:
                if entry not in known:
                    known.append(entry)
        elapsed = time.monotonic() - self.started_monotonic
        cells_seconds = self._cells_seconds
        cells_examples = self._cells_examples
        report.update(
            {
                "target": ",".join(self.targets),
                "targets": list(self.targets),
                "internal_errors": [
                    e for r in reports.values() for e in r.get("internal_errors", [])
                ],
                "degenerate": _merge_degenerate(reports),
                "evidence": _merge_evidence(reports),
                "batch_reach": [  # this run's sessions (a resumed run starts its count anew)
                    {**b, "target": t} for t, r in reports.items() for b in r.get("batch_reach", [])
                ],
                "sweeps": [  # every target's exhaustive 16-bit sweeps (campaigns/sweep.py)
                    {**w, "target": t} for t, r in reports.items() for w in r.get("sweeps", [])
                ],
                "profile": self.space.profile,
                "strategies": self.space.source,
                "examples": previous_examples + this_run,
                "examples_this_run": this_run,
                "elapsed_s": round(elapsed, 3),
                "findings": [asdict(f) for f in self.findings],
                "controls": [
                    {**c, "target": t} for t, r in reports.items() for c in r.get("controls", [])
                ],
                "not_covered": [
                    {**n, "target": t} for t, r in reports.items() for n in r.get("not_covered", [])
                ],
                "seed": self.seed,
                "rounds": self.rounds,
                "cells": [asdict(c) for c in self.cells.values()],
                "status": _status(self),
                "campaign": {
                    "mode": self.mode,
                    "run": self.run_index,
                    "runs": self.runs,
                    "resumed": self.resumed,
                    "interrupted": self.interrupted,
                    "budget_s": self.budget_s,
                    "finding_status": [
                        {"signature": list(f.signature()), "status": self.finding_status(s)}
                        for f in self.findings
                        for s in [f.signature()]
                    ],
                    "overrun_s": round(max(elapsed - self.budget_s, 0.0), 3)
                    if self.finished
                    else None,
                    "cells_total": len(self.cells),
                    "cells_not_run": len(self.cells_not_run()),
                    "time": self.time_shares(elapsed),
                    "turns": self.turns,
                    "turns_truncated": len(self.turns) >= MAX_TURNS_RECORDED,
                    "throughput": {
                        "cells_examples": cells_examples,
                        "cells_seconds": round(cells_seconds, 3),
                        "examples_per_s": round(cells_examples / cells_seconds, 3)
                        if cells_seconds > 0
                        else None,
                    },
                    **self.extra,
                },
            }
        )
        if len(reports) > 1:
            for key in ("routing_not_observable", "unclaimed", "routing_notes", "routing_observed"):
                report[key] = [
                    {**e, "target": t} if isinstance(e, dict) else f"{t}: {e}"
                    for t, r in reports.items()
                    for e in r.get(key, [])
                ]
            report["environment"] = {}
            report["per_target"] = {
                t: {k: r.get(k) for k in ("profile", "strategies", "environment", "examples")}
                for t, r in reports.items()
            }
        if known:
            report["known"] = known
        return report

    def write_report(self) -> None:
        _atomic_write(self.out / REPORT_FILE, json.dumps(self.report(), indent=2, default=str))

    def finish(self) -> None:
        """Close this run's record (state, report.json)."""
        self.finished = True
        reports = self._target_reports()
        if self.status == "running":
            internal = any(r.get("internal_errors") for r in reports.values())
            internal = internal or any(f.kind == INTERNAL for f in self.findings)
            if internal:
                self.status = STATUS_INTERNAL
        self.runs[-1].update(
            {
                "finished": _now(),
                "elapsed_s": round(time.monotonic() - self.started_monotonic, 3),
                "examples_this_run": self.examples_this_run(reports),
                "new_findings": len(self.new),
                "interrupted": self.interrupted,
            }
        )
        self.save_state()
        self.write_report()

    def exit_status(self, report: dict[str, Any] | None = None) -> int:
        """3 when bi_props itself failed (a finding of kind internal, or an internal error);
        else 1 when the campaign holds a finding not marked known (or fixed and not seen again);
        else 130 when interrupted, else 3 when no enabled-state cell ran (incomplete: no
        verdict), else 0."""
        from ..reporting.data import exit_status

        report = report if report is not None else self.report()
        return exit_status(report, bool(getattr(self, "interrupted", False)))

    def progress(self, what: str, examples: int) -> None:
        """One line per turn (no carriage returns, no colours): readable in a CI log."""
        elapsed = time.monotonic() - self.started_monotonic
        rate = examples / elapsed if elapsed else 0.0
        print(
            f"[{elapsed:7.1f}s/{self.budget_s:.0f}s] {examples:7d} examples ({rate:6.1f}/s) | "
            f"{len(self.findings)} findings ({len(self.new)} new) | {what}",
            file=self.log,
            flush=True,
        )


class CampaignSession(Session):
    """A Session whose findings go through the campaign's ledger (dedup by signature, appended
    to findings.jsonl at once) and whose report is the campaign's combined report."""

    ledger: Ledger | None = None
    round: int | None = None

    def settled(self, signature: tuple) -> bool:
        """Also settled: a signature the campaign already holds (from this run or an earlier)."""
        if self.ledger is not None and self.ledger.known_signature((self.target, *signature)):
            return True
        return super().settled(signature)

    def record(self, finding: Finding) -> None:
        if self.ledger is None:
            super().record(finding)
            return
        if self.ledger.record(finding):
            self.findings.append(finding)
        self.write_report()

    def write_report(self) -> None:
        if self.ledger is None:
            super().write_report()
            return
        self.ledger.write_report()

    def annotate(self) -> None:
        """Coverage lines carry the target and the round (several targets share one file)."""
        for line in self.examples_log:
            line.setdefault("target", self.target)
            line.setdefault("round", self.round)

    def flush_examples(self) -> None:
        self.annotate()
        super().flush_examples()


@contextmanager
def controls_database(database) -> Iterator[None]:
    """Run the negative controls (``hypothesis.find``, which uses the default settings) against
    the campaign's example database, with fresh randomness, then restore the previous profile."""
    from hypothesis import settings

    try:
        previous = settings.get_current_profile_name()
    except Exception:  # pragma: no cover - very old Hypothesis
        previous = None
    settings.register_profile(
        "bi_props_campaign", parent=settings.default, database=database, derandomize=False
    )
    settings.load_profile("bi_props_campaign")
    try:
        yield
    finally:
        if previous is not None:
            settings.load_profile(previous)


@dataclass
class _TargetState:
    session: CampaignSession
    cells: list[Cell]
    seconds: float = 0.0
    queue: list[Cell] = field(default_factory=list)
    round: int | None = None
    round_seed: int | None = None
    rounds: list[tuple[int, int]] = field(default_factory=list)  # this run's (index, seed)

    def live(self) -> bool:
        return any(not c.done for c in self.cells)

    def round_for(self, ledger: Ledger, target: str, turn: int) -> tuple[int, int]:
        """A cell's ``turn``-th turn of this run belongs to this run's ``turn``-th round of its
        target (the round's seed and this cell's name give the turn's seed)."""
        while len(self.rounds) <= turn:
            self.rounds.append(ledger.next_round(target))
        return self.rounds[turn]


class Campaign:
    """The local (non-Ray) campaign driver: one Session per target, round-robin by time used."""

    def __init__(
        self,
        targets: list[str],
        space: Space,
        out: Path,
        budget_s: float,
        *,
        seed: int | None = None,
        resume: bool = False,
        log: TextIO = sys.stderr,
        write_reports: bool = True,
        known: list | None = None,
        strict_controls: bool = False,
        control_share: float | None = None,
        max_findings: int | None = None,
        examples_per_cell: int | None = None,
    ) -> None:
        if not targets:
            raise ValueError("a campaign needs at least one target")
        if max_findings is not None and max_findings < 1:
            raise ValueError(f"max_findings must be at least 1, got {max_findings}")
        if examples_per_cell is not None and examples_per_cell < 1:
            raise ValueError(f"examples_per_cell must be at least 1, got {examples_per_cell}")
        # The negative controls' largest share of the budget: the argument, else the space's
        # [runner] control_share.
        self.control_share = space.control_share if control_share is None else control_share
        self.targets = list(dict.fromkeys(targets))
        self.space = space
        self.out = Path(out)
        self.budget_s = budget_s
        self.seed = seed
        self.resume = resume
        self.log = log
        self.write_reports = write_reports
        self.known = list(known or [])  # known.KnownFailure entries (re-checked at the start)
        self.strict_controls = strict_controls  # recorded in the report (its flags say so)
        # Stop once this many new findings are recorded (each shrunk and confirmed first), as
        # libFuzzer stops at its first crash: a bisection or a CI gate needs one reproducer, not
        # the whole budget. None: spend the budget.
        self.max_findings = max_findings
        # Stop once every cell ran this many examples in this run (or retired) and every negative
        # control settled: evidence of a stated size, as Hypothesis' max_examples, with the budget
        # as the upper bound. None: spend the budget.
        self.examples_per_cell = examples_per_cell
        self.ledger: Ledger | None = None

    def run(self) -> int:
        """Run the campaign; return the exit status (0 clean, 1 findings, 2 a target that cannot
        run, 130 interrupted)."""
        from hypothesis.database import DirectoryBasedExampleDatabase

        ledger = self.ledger = self._open_ledger()
        database = DirectoryBasedExampleDatabase(str(self.out / DATABASE_DIR))
        states: dict[str, _TargetState] = {}
        for target in self.targets:
            session = CampaignSession(target, self.space)
            session.ledger = ledger
            session.report_path = self.out / REPORT_FILE
            session.known = list(self.known)
            session.strict_controls = self.strict_controls
            session.floor_all_cells = True  # a cell the campaign did not run is thin evidence
            session.database = database  # known batch-variant cases of earlier runs, and this
            load_variants(session, self.space.ops)
            states[target] = _TargetState(session, cells_for(self.space))
            for cell in states[target].cells:  # every cell is in the report, run or not
                ledger.cell(target, cell.op, cell.prop, cell.switch)
            left_out = self.space.exclude_properties
            for op, prop in catalogue_controls(self.space.ops, left_out):  # and every control
                session._control_entry(op, prop)
            ledger.sources[target] = session.report
        deadline = ledger.started_monotonic + self.budget_s
        for state in states.values():  # no example waits past the budget's end
            state.session.runner.deadline = deadline
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
        status: int | None = None
        check = SwitchingCheck(list(states))  # beside the cells: a spawned interpreter each

        def examples() -> int:
            return sum(s.session.runner.examples for s in states.values())

        try:
            with controls_database(database):
                for target, state in states.items():
                    state.session.runner.start_all()  # both switch states import concurrently
                    hello = state.session.hello("disabled")
                    if hello.status != "ready":
                        print(
                            f"bi-props: target {target!r} is {hello.status}:\n{hello.message}",
                            file=self.log,
                        )
                        ledger.status = target_status(hello.status)
                        status = 2
                        return status
                    if hello.routing_note:
                        print(f"bi-props: WARNING: {hello.routing_note}", file=self.log)
                    if state.session.known:
                        state.session.check_known()
                ledger.cells_phase(examples())
                self._turns(states, ledger, database, deadline, examples)
        except (KeyboardInterrupt, Interrupted):
            ledger.interrupted = True
            ledger.progress("interrupted: writing the report", examples())
        except WorkerFailure:  # a worker that did not start
            ledger.status = target_status("broken")
            raise
        except Exception:
            ledger.status = STATUS_INTERNAL
            raise
        finally:
            signal.signal(signal.SIGTERM, previous)
            ledger.cells_phase_end(examples())
            if status is None and not ledger.interrupted:
                record_switching(check, {t: s.session for t, s in states.items()})
            for state in states.values():
                state.session.close()
                for line in routing_lines(state.session):
                    print(f"bi-props: {state.session.target}: {line}", file=self.log)
            ledger.finish()
        summary(ledger, self.log)
        return self._reports_written(ledger, status)

    def _open_ledger(self, **extra: Any) -> Ledger:
        """This run's ledger (``extra``: e.g. the Ray driver's ``mode``)."""
        return Ledger(
            self.out,
            self.targets,
            self.space,
            seed=self.seed,
            resume=self.resume,
            budget_s=self.budget_s,
            log=self.log,
            **extra,
        )

    def _reports_written(self, ledger: Ledger, status: int | None) -> int:
        """Say where report.json is, render the other reports, and return the exit status."""
        print(f"bi-props: report written to {self.out / REPORT_FILE}", file=self.log)
        if self.write_reports:
            render_reports(self.out, self.log)
        return status if status is not None else ledger.exit_status()

    def _turns(
        self,
        states: dict[str, _TargetState],
        ledger: Ledger,
        database,
        deadline: float,
        examples: Callable[[], int],
    ) -> None:
        """Run turns until the budget is spent, in the scheduler's order (scheduler.py)."""
        schedule = Scheduler(self.budget_s, self.control_share, self.examples_per_cell)
        for target, state in states.items():
            claimed = state.session.hello("enabled").covered
            for cell in state.cells:
                item = Item((target, cell), "cell", cell.switch, done=cell.done, group=target)
                item.claimed = cell.op in claimed
                item.batch_compared = cell.prop == "batch_invariance"
                if item.claimed and cell.switch == "enabled" and cell.prop in FLOORED:
                    item.floor = self.space.min_judged
                model = cell.prop in MODEL_PROPERTIES and cell.switch == "enabled"
                item.first = model or (item.claimed and item.batch_compared and
                                       cell.switch == "enabled")  # fmt: skip
                schedule.add(item)
        for target, state in states.items():
            for control in state.session.controls:
                key = (target, control.op, control.property)
                item = Item(key, "control", "disabled", done=control.state == "done")
                item.searching = control.searching
                schedule.add(item)
        start = ledger.started_monotonic
        while True:
            now = time.monotonic()
            picked = schedule.next(now - start)
            if self._enough_findings(ledger, examples):
                return
            # (before "nothing to pick": satisfied cells take no turns, scheduler.py's policy 5)
            if self._enough_examples(schedule, ledger, examples):
                return
            if picked is None or now >= deadline:
                return
            item, limit = picked
            turn_end = min(now + limit, deadline)
            if item.kind == "control":
                self._control_turn(states, ledger, database, schedule, item, turn_end, examples)
            else:
                self._cell_turn(
                    states, ledger, database, deadline, schedule, item, turn_end, examples
                )

    def _enough_findings(self, ledger: Ledger, examples: Callable[[], int]) -> bool:
        """True (and the stop recorded in the report) once ``max_findings`` new findings that
        fail the run are in (a contract widening is no failure unless strict)."""
        if self.max_findings is None:
            return False
        failing = [f for f in ledger.findings if f.signature() in ledger.new and
                   (f.kind != "widening" or self.strict_contract_requested())]  # fmt: skip
        if len(failing) < self.max_findings:
            return False
        why = (
            f"after {len(ledger.new)} new finding(s) (--max-findings {self.max_findings}), "
            f"{time.monotonic() - ledger.started_monotonic:.0f} s of the {self.budget_s:g} s budget"
        )
        ledger.extra["stopped_early"] = why
        ledger.progress(f"stopping {why}", examples())
        return True

    @staticmethod
    def strict_contract_requested() -> bool:
        from .session import strict_contract_requested

        return strict_contract_requested()

    def _enough_examples(
        self, schedule: Scheduler, ledger: Ledger, examples: Callable[[], int]
    ) -> bool:
        """True (and the stop recorded in the report) once every cell ran ``examples_per_cell``
        examples in this run or retired, and every negative control is done (saw variance and
        shrank it, or spent its quota): a control still searching keeps the campaign going."""
        need = self.examples_per_cell
        if need is None:
            return False
        cells = schedule.cells()
        if any(not c.done and (c.examples < need or getattr(c, "urgent", False)) for c in cells):
            return False
        if self.control_share > 0 and any(not c.done for c in schedule.controls()):
            return False
        why = (
            f"once every cell had run {need} examples or retired ({len(cells)} cells, "
            f"--examples-per-cell {need}) and every negative control had settled, "
            f"{time.monotonic() - ledger.started_monotonic:.0f} s of the {self.budget_s:g} s budget"
        )
        ledger.extra["stopped_early"] = why
        ledger.progress(f"stopping {why}", examples())
        return True

    def _control_turn(self, states, ledger, database, schedule, item, turn_end, examples) -> None:
        target, op, prop = item.key
        session = states[target].session
        entry = session._control_entry(op, prop)
        before = entry.examples + entry.power_draws
        variants_before = entry.variant_cases
        started = time.monotonic()
        seed = derive_seed(ledger.seed, target, "control", op, prop, ledger.run_index, item.turns)
        # turn_end is soft (no example starts after it); the controls' share is hard: an example
        # still running when the share is spent is cut (it decides nothing about the kernel).
        deadline = session.runner.deadline
        if any(not c.done for c in schedule.cells()):
            share_end = started + max(schedule.control_budget_s - schedule.control_seconds, 0.0)
            session.runner.deadline = min(deadline, share_end) if deadline else share_end
        try:
            others = [
                c for c in schedule.controls() if c is not item and c.searching and not c.done
            ]
            control = session.control(
                op, prop, stop_at=turn_end, seed=seed, database=database, shrink=not others
            )
        finally:
            session.runner.deadline = deadline
        seconds = time.monotonic() - started
        ran = control.examples + control.power_draws - before
        item.searching = control.searching
        schedule.done(item, seconds, ran, finished=control.state == "done")
        if control.variant_cases > variants_before:  # known cases for the op's enabled cells
            for other in schedule.cells():
                o_target, o_cell = other.key
                if o_target == target and o_cell.op == op and not other.done:
                    other.pending = bool(pending(session, o_cell.op, o_cell.prop, o_cell.switch))
        ledger.turn(
            "control", target, f"control {op} {prop}", ran, seconds, 0.0, turn_end - started
        )
        seen = "variance seen" if control.variance_seen else "none seen yet"
        ledger.progress(
            f"{target} | control {op} {prop}: {seen}, {control.state} "
            f"({control.examples} examples)",
            examples(),
        )

    def _cell_turn(
        self, states, ledger, database, deadline, schedule, item, turn_end, examples
    ) -> None:
        target, cell = item.key
        state = states[target]
        stats = ledger.cell(target, cell.op, cell.prop, cell.switch)
        state.round, state.round_seed = state.round_for(ledger, target, item.turns)
        state.session.round = state.round
        seed = turn_seed(state.round_seed, cell.op, cell.prop, cell.switch)
        reseen_before = len(ledger.reseen)
        new_before = len(ledger.new)
        shrink_before = cell.shrink_s
        started = time.monotonic()
        start = ledger.started_monotonic
        stop_at = min(deadline, start + schedule.shrink_end(started - start, item))
        why = "at the end of the budget"
        if stop_at < deadline:
            why = "to leave time for the first turns of the cells not yet run"
        ran = run_slice(state.session, cell, SLICE_EXAMPLES, database, seed, stop_at, turn_end, why)
        seconds = time.monotonic() - started
        lines = list(state.session.examples_log)
        state.session.flush_examples()  # each turn's coverage on disk (a kill loses little)
        state.seconds += seconds
        cell.examples += ran
        ledger.turn_done(stats, ran, seconds, cell.done, cell.retired_why)
        shrink_s = cell.shrink_s - shrink_before
        ledger.turn("cell", target, cell.name, ran, seconds, shrink_s, turn_end - started)
        item.judged = state.session.judged.get((cell.op, cell.prop, cell.switch), 0)
        item.pending = bool(pending(state.session, cell.op, cell.prop, cell.switch))
        new = schedule.done(item, seconds, ran, lines, finished=cell.done, shrink_s=shrink_s)
        if cell.done:
            outcome = done_outcome(ledger, new_before, reseen_before, cell.retired_why)
        else:
            outcome = live_outcome(ledger, new_before, reseen_before)
        ledger.progress(
            f"round {state.round} | {target} | {cell.name}: {cell.examples} examples, "
            f"{new:.0f} new behaviours{outcome}",
            examples(),
        )


def record_switching(check: SwitchingCheck, sessions: dict[str, Session]) -> None:
    """The switching verdicts of a campaign's end, in each session (a failure: a finding)."""
    for target, verdict in check.finish().items():
        session = sessions[target]
        session.switching = verdict
        fields = switching_finding(target, verdict)
        if fields is not None:
            session.record(Finding(**fields))


def summary(ledger: Ledger, log: TextIO = sys.stderr) -> None:
    """The console's last word on what ran: cells not run, unfinished controls, overrun, and
    when no enabled-state cell ran, that there is no verdict."""
    from ..reporting.data import BLIND_CONTROL, blind_controls

    report = ledger.report()
    cells = ledger.cells.values()
    not_run = ledger.cells_not_run()
    ran = len(ledger.cells) - len(not_run)
    line = f"bi-props: {ran} of {len(ledger.cells)} cells ran at least once"
    if not_run:
        line += f"; {len(not_run)} did NOT run"
        enabled = sum(1 for c in not_run if c.switch in ("enabled", "both"))
        line += f" ({enabled} enabled-state or parity)"
    print(line, file=log)
    controls = report.get("controls") or []
    if controls:
        states: dict[str, int] = {}
        for c in controls:
            states[c.get("state", "done")] = states.get(c.get("state", "done"), 0) + 1
        listed = ", ".join(f"{n} {state}" for state, n in sorted(states.items()))
        print(f"bi-props: negative controls: {listed}", file=log)
        for c in blind_controls(report):
            print(
                f"bi-props: control {c.get('op')} {c.get('property')} "
                f"({c.get('state', 'done')}): {BLIND_CONTROL}",
                file=log,
            )
    from ..reporting.verdict import degenerate_line, evidence_lines

    if degenerate_line(report):
        print(f"bi-props: {degenerate_line(report)}", file=log)
    for line in evidence_lines(report):
        print(f"bi-props: {line}", file=log)
    campaign = report.get("campaign") or {}
    shares = (campaign.get("time") or {}).get("shares") or {}
    if shares:
        print(
            "bi-props: time: " + ", ".join(f"{k} {100 * (v or 0):.0f}%" for k, v in shares.items()),
            file=log,
        )
    if campaign.get("overrun_s"):
        print(f"bi-props: ran {campaign['overrun_s']:.1f} s past the budget", file=log)
    from ..reporting.data import NO_ROUTING_VERDICT, no_routing_verdict

    if no_routing_verdict(report):
        print(f"bi-props: {NO_ROUTING_VERDICT}", file=log)
    if report.get("status") == "incomplete" and cells:
        print(
            "bi-props: INCOMPLETE: no enabled-state cell ran, so there is no verdict (exit 3); "
            "give the campaign a larger --budget",
            file=log,
        )


def render_reports(out: Path, log: TextIO = sys.stderr) -> dict[str, Path]:
    """Write report.md, junit.xml and report.html from DIR; a failure here is reported, never
    allowed to change the campaign's exit status."""
    from ..reporting import write_reports

    try:
        written = write_reports(out)
    except Exception as exc:  # pragma: no cover - defensive: reports must not lose a run
        print(f"bi-props: could not render the reports in {out}: {exc!r}", file=log)
        return {}
    print("bi-props: reports: " + ", ".join(str(p) for p in written.values()), file=log, flush=True)
    return written
