"""A campaign's record on disk: its findings log, its state, its cells and its report.

``Ledger`` holds what ``bi-props fuzz`` (local or Ray) keeps across a run and across runs in the
output directory ``DIR``: the findings (``findings.jsonl``, one per line, fsync'ed the moment one
is recorded: a SIGKILL loses nothing found), the runs and rounds with their seeds
(``campaign.json``), the per-cell counts and the turns, and the combined ``report.json`` of the
campaign's targets. The campaign drivers (campaign.py, ray_runner.py) write into it; reports read
what it writes. Imports no torch.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO

from ..model.space import Space
from ..reporting.certificate import provenance
from .records import INTERNAL, STATUS_INTERNAL, STATUS_RUNNING, Finding

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
                **provenance(),
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
                "size_reach": [  # this run's sessions, as batch_reach
                    {**b, "target": t} for t, r in reports.items() for b in r.get("size_reach", [])
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
