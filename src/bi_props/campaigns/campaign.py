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

import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from ..catalogue import controls as catalogue_controls
from ..model.space import Space
from ..runner.controller import WorkerFailure
from .evidence import FLOORED, MODEL_PROPERTIES
from .explicit import load_variants, pending
from .fuzz import SLICE_EXAMPLES, Cell, Interrupted, _on_sigterm, cells_for, run_slice
from .ledger import (  # noqa: F401 (the campaign's record; names other modules import)
    COVERAGE_FILE,
    DATABASE_DIR,
    EXIT_INCOMPLETE,
    FINDINGS_FILE,
    MAX_TURNS_RECORDED,
    REPORT_FILE,
    STATE_FILE,
    STATE_VERSION,
    CellStats,
    FindingsLog,
    Ledger,
    _atomic_write,
    _merge_degenerate,
    _merge_evidence,
    _now,
    _status,
    cell_key,
    derive_seed,
    done_outcome,
    finding_from_dict,
    live_outcome,
    round_seed,
    turn_seed,
)
from .records import STATUS_INTERNAL, Finding, target_status
from .scheduler import FLOOR_TURN_S, Item, Scheduler
from .session import Session
from .session_report import routing_lines
from .switching_check import SwitchingCheck
from .switching_check import finding_fields as switching_finding


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
        self.flush_examples()  # the coverage that led to a finding is on disk before it is
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
            for cell in state.cells:
                item = Item((target, cell), "cell", cell.switch, done=cell.done, group=target)
                item.claimed = state.session.covered(cell.op)
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
            f"after {len(failing)} new finding(s) (--max-findings {self.max_findings}), "
            f"{time.monotonic() - ledger.started_monotonic:.0f} s of the {self.budget_s:g} s budget"
        )
        ledger.extra["stopped_early"] = why
        ledger.progress(f"stopping {why}", examples())
        return True

    @staticmethod
    def strict_contract_requested() -> bool:
        from .records import strict_contract_requested

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
                    other.pending = session.explicit_examples and bool(
                        pending(session, o_cell.op, o_cell.prop, o_cell.switch)
                    )
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
        floor, floor_end, most = 0, None, SLICE_EXAMPLES
        if item.floor and item.turns == 0:  # a claimed op's floor of evidence in its first turn
            floor, floor_end = item.floor, min(deadline, started + FLOOR_TURN_S)
            most += 2 * floor  # degenerate examples do not count toward it
        ran = run_slice(
            state.session, cell, most, database, seed, stop_at, turn_end, why, floor, floor_end
        )
        seconds = time.monotonic() - started
        lines = list(state.session.examples_log)
        state.session.flush_examples()  # each turn's coverage on disk (a kill loses little)
        state.seconds += seconds
        cell.examples += ran
        ledger.turn_done(stats, ran, seconds, cell.done, cell.retired_why)
        shrink_s = cell.shrink_s - shrink_before
        ledger.turn("cell", target, cell.name, ran, seconds, shrink_s, turn_end - started)
        item.judged = state.session.judged.get((cell.op, cell.prop, cell.switch), 0)
        item.pending = state.session.explicit_examples and bool(
            pending(state.session, cell.op, cell.prop, cell.switch)
        )
        item.failed = item.failed or cell.findings > 0
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
