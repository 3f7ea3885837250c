"""Ray scale-out of a campaign: ``bi-props fuzz --ray [ADDRESS]``.

Shards are units of work: a negative control, or a few turns of one cell in one round. They are
spread over Ray actors; each actor holds one accelerator (``num_gpus=1`` for CUDA targets, the
custom resource ``{"NPU": 1}`` for Ascend, for which Ray sets ``ASCEND_RT_VISIBLE_DEVICES``; one
CPU otherwise) and its own Session, i.e. its own isolated worker processes per switch state,
which inherit the device Ray gave the actor.

The driver keeps the campaign's ledger (``campaign.Ledger``): it merges each shard's findings
(deduplicated by signature, appended to ``findings.jsonl`` at once), coverage lines, controls and
example-database entries. A DirectoryBasedExampleDatabase is content-addressed files
(``<hash(key)>/<hash(value)>``), so the union of the actors' directories is the merged database:
an actor starts from a snapshot of the driver's, and returns the files it added. An actor that
dies (``ray.kill``, a node lost, out of memory) has its shard re-queued (up to ``MAX_REQUEUES``
times) on a replacement actor; what it already returned is in the ledger, so nothing reported is
lost. A cell never has two shards in flight, so its rounds stay in order.

Ray is imported only here, and this module only with ``--ray``.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import time
from collections import deque
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

from ..catalogue import controls as catalogue_controls
from ..model.space import Space
from .campaign import (
    COVERAGE_FILE,
    DATABASE_DIR,
    Campaign,
    Ledger,
    controls_database,
    done_outcome,
    finding_from_dict,
    turn_seed,
)
from .evidence import Tally, evidence
from .fuzz import SLICE_EXAMPLES, Cell, Interrupted, _on_sigterm, cells_for, run_slice
from .records import Finding
from .session import Session
from .switching_check import SwitchingCheck
from .switching_check import finding_fields as switching_finding

SHARD_TURNS = 2  # turns of SLICE_EXAMPLES per cell shard
MAX_REQUEUES = 3  # a shard whose actor died this often is dropped (its cell retired, logged)
GRACE_S = 60.0  # after the deadline, how long in-flight shards may still report
INTERRUPT_GRACE_S = 10.0
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
"""Ray sets OMP_NUM_THREADS to an actor's CPUs when it is unset; the actors put back the driver's
values (set or unset) before their workers start, so that a Ray campaign tests the same thread
configuration as a plain one (thread counts change how CPU kernels split their reductions)."""


# -- resources ---------------------------------------------------------------------------------


def device_for(target: str, device: str = "auto") -> str:
    """What one actor of this target reserves: "cuda", "npu" or "cpu"."""
    if device != "auto":
        return device
    return {"vllm": "cuda", "ascend": "npu"}.get(target, "cpu")


def actor_options(device: str) -> dict[str, Any]:
    """Ray actor options: one accelerator per actor (its Session's workers use it)."""
    if device == "cuda":
        return {"num_gpus": 1, "num_cpus": 1}
    if device == "npu":
        return {"resources": {"NPU": 1}, "num_cpus": 1}
    return {"num_cpus": 1}


def default_actors(device: str, targets: int, resources: dict[str, float]) -> int:
    """Actors per target: the cluster's accelerators of that kind (or CPUs), shared by targets."""
    total = {"cuda": resources.get("GPU", 0), "npu": resources.get("NPU", 0)}.get(
        device, resources.get("CPU", 1)
    )
    return max(1, int(total) // max(1, targets))


# -- the example database as files -------------------------------------------------------------


def db_entries(root: Path, skip: set[str] | frozenset[str] = frozenset()) -> dict[str, bytes]:
    """The database's files as {"<key dir>/<value file>": bytes}, less those in ``skip``."""
    entries: dict[str, bytes] = {}
    root = Path(root)
    if not root.is_dir():
        return entries
    for key_dir in root.iterdir():
        if not key_dir.is_dir():
            continue
        for value in key_dir.iterdir():
            name = f"{key_dir.name}/{value.name}"
            if name in skip or not value.is_file():
                continue
            try:
                entries[name] = value.read_bytes()
            except OSError:  # deleted meanwhile (Hypothesis prunes stale entries)
                continue
    return entries


def db_union(root: Path, entries: dict[str, bytes]) -> int:
    """Add the entries that are missing (atomic renames); return how many were added. Safe to
    repeat and to run concurrently: an entry's name is the hash of its content."""
    added = 0
    root = Path(root)
    for name, value in entries.items():
        key, _, leaf = name.partition("/")
        if not key or not leaf or "/" in leaf or key.startswith(".") or leaf.startswith("."):
            continue  # not a database entry: never write outside root
        path = root / key / leaf
        if path.exists():
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.parent / f".{leaf}.{os.getpid()}.tmp"
        tmp.write_bytes(value)
        tmp.replace(path)
        added += 1
    return added


# -- the actor ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shard:
    id: int
    target: str
    kind: str  # "control" | "cell"
    op: str
    prop: str
    switch: str = "disabled"
    round: int | None = None
    round_seed: int | None = None
    attempts: int = 0

    @property
    def cell(self) -> tuple[str, str, str, str]:
        return (self.target, self.op, self.prop, self.switch)

    @property
    def name(self) -> str:
        if self.kind == "control":
            return f"control {self.op} {self.prop}"
        return f"{self.op} {self.prop} [{self.switch}]"


class _ActorSession(Session):
    """Coverage lines go back to the driver with the shard's result, not to a file."""

    outbox: list[dict] | None = None

    def flush_examples(self) -> None:
        if self.outbox is None:
            self.outbox = []
        self.outbox.extend(self.examples_log)
        self.examples_log.clear()


class ShardActor:
    """One Ray actor: one target's Session (its own workers), its own copy of the database."""

    def __init__(
        self,
        target: str,
        space: Space,
        entries: dict[str, bytes],
        known: list | None = None,
        shard_turns: int = SHARD_TURNS,
        environment: dict[str, str | None] | None = None,
    ) -> None:
        from hypothesis.database import DirectoryBasedExampleDatabase

        for name, value in (environment or {}).items():  # before any worker starts
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value

        self.db_dir = Path(tempfile.mkdtemp(prefix="bi_props-ray-db-"))
        db_union(self.db_dir, entries)
        self.sent = set(db_entries(self.db_dir))
        self.database = DirectoryBasedExampleDatabase(str(self.db_dir))
        self.session = _ActorSession(target, space)
        self.session.known = list(known or [])
        self.session.database = self.database  # known-variant cases: shared like the rest
        self.session.floor_all_cells = True
        from .explicit import load_variants

        load_variants(self.session, space.ops)
        # Reproducer scripts are written beside this (scratch) report and shipped to the driver.
        self.scratch = Path(tempfile.mkdtemp(prefix="bi_props-ray-out-"))
        self.session.report_path = self.scratch / "report.json"
        self.shard_turns = shard_turns
        self._controls = controls_database(self.database)
        self._controls.__enter__()  # this process is ours: controls use the actor's database

    def hello(self) -> dict[str, Any]:
        self.session.runner.start_all()
        hello = self.session.hello("disabled")
        known = []
        if hello.status == "ready" and self.session.known:
            known = self.session.check_known()
        covered = self.session.hello("enabled").covered if hello.status == "ready" else ()
        return {
            "status": hello.status,
            "message": hello.message,
            "environment": dict(hello.environment),
            "known": known,
            "covered": list(covered),
            "pid": os.getpid(),
        }

    def run(self, shard: Shard, time_limit_s: float) -> dict[str, Any]:
        session = self.session
        started = time.monotonic()
        deadline = started + max(0.0, time_limit_s)
        examples_before = session.runner.examples
        findings_before = len(session.findings)
        notes_before = len(session.hang_suspicions)
        result: dict[str, Any] = {"shard": shard.id, "control": None, "done": False}
        ran = 0
        session.runner.deadline = deadline  # no example waits past the shard's time
        if shard.kind == "control":  # one turn, bounded like the local campaign's
            control = session.control(
                shard.op, shard.prop, stop_at=deadline, database=self.database
            )
            result["control"] = asdict(control)
        else:
            cell = Cell(shard.op, shard.prop, shard.switch)
            for turn in range(self.shard_turns):
                if turn and time.monotonic() >= deadline:
                    break
                seed = turn_seed(shard.round_seed or 0, shard.op, shard.prop, shard.switch, turn)
                ran += run_slice(session, cell, SLICE_EXAMPLES, self.database, seed, deadline)
                if cell.done or cell.found_new:
                    break
            # A shard's Cell is new on each actor, and an actor knows only its own findings:
            # a Ray cell still retires at its first new finding (the local campaign's cells
            # keep exploring for other bugs; fuzz.settle_turn).
            result["done"] = cell.done or cell.found_new
        session.flush_examples()
        coverage, session.outbox = session.outbox or [], []
        new = db_entries(self.db_dir, skip=self.sent)
        self.sent.update(new)
        environment = {}
        if "disabled" in session.runner._hellos:
            environment = dict(session.runner._hellos["disabled"].environment)
        findings = [asdict(f) for f in session.findings[findings_before:]]
        reproducers = {}
        for finding in findings:
            path = Path(finding["reproducer"]) if finding.get("reproducer") else None
            if path is not None and path.is_file():
                reproducers[path.name] = path.read_text()
        result.update(
            {
                "examples": session.runner.examples - examples_before,
                "turn_examples": ran,
                "seconds": time.monotonic() - started,
                "findings": findings,
                "hang_suspicions": session.hang_suspicions[notes_before:],  # campaigns/hangs.py
                "reproducers": reproducers,
                "coverage": coverage,
                "not_covered": dict(session.not_covered),
                "db": new,
                "environment": environment,
                "pid": os.getpid(),
            }
        )
        return result

    def close(self) -> None:
        import shutil

        self.session.close()
        self._controls.__exit__(None, None, None)
        shutil.rmtree(self.db_dir, ignore_errors=True)
        shutil.rmtree(self.scratch, ignore_errors=True)


# -- the driver --------------------------------------------------------------------------------


@dataclass
class Slot:
    """One actor place of a target; its actor is replaced when it dies."""

    index: int
    target: str
    actor: Any
    busy: bool = False
    deaths: int = 0


@dataclass
class _TargetData:
    cells: list[Cell]
    examples: int = 0
    environment: dict[str, Any] = field(default_factory=dict)
    controls: list[dict[str, Any]] = field(default_factory=list)
    not_covered: dict[str, str] = field(default_factory=dict)
    known: list[dict[str, Any]] = field(default_factory=list)
    round: int | None = None
    round_seed: int | None = None
    covered: list[str] = field(default_factory=list)  # the ops the target claims
    switching: dict[str, Any] = field(default_factory=dict)  # the switching verdict
    tally: Tally = field(default_factory=Tally)  # the actors' coverage lines, counted
    hang_suspicions: list[dict[str, Any]] = field(default_factory=list)  # unconfirmed: notes


class RayCampaign(Campaign):
    """The Ray campaign driver; same options, directory layout, ledger and reports as the local
    one (it shares Campaign's set-up and replaces its ``run``)."""

    def __init__(
        self,
        targets: list[str],
        space: Space,
        out: Path,
        budget_s: float,
        *,
        seed: int | None = None,
        resume: bool = False,
        address: str | None = None,
        actors: int | None = None,
        device: str = "auto",
        log: TextIO = sys.stderr,
        known: list | None = None,
        shard_turns: int = SHARD_TURNS,
        grace_s: float = GRACE_S,
        on_dispatch=None,
        write_reports: bool = True,
        max_findings: int | None = None,
        examples_per_cell: int | None = None,
    ) -> None:
        super().__init__(
            targets,
            space,
            out,
            budget_s,
            seed=seed,
            resume=resume,
            log=log,
            write_reports=write_reports,
            known=known,
            max_findings=max_findings,
            examples_per_cell=examples_per_cell,
        )
        self.address = address
        self.actors = actors
        self.device = device
        self.shard_turns = shard_turns
        self.grace_s = grace_s
        self.on_dispatch = on_dispatch  # (campaign, slot, shard) -> None; tests kill actors here
        self.slots: list[Slot] = []
        self.requeued: list[int] = []
        self.completed: list[int] = []
        self.dispatched: list[tuple[int, int]] = []  # (shard id, slot index)
        self._next_id = 0
        self._data: dict[str, _TargetData] = {}
        self._remote: Any = None

    # -- plumbing ------------------------------------------------------------------------------

    def _shard(self, **fields: Any) -> Shard:
        shard = Shard(id=self._next_id, **fields)
        self._next_id += 1
        return shard

    def _new_actor(self, ray, target: str) -> Any:
        options = actor_options(device_for(target, self.device))
        if self._remote is None:
            self._remote = ray.remote(ShardActor)
        remote = self._remote.options(max_restarts=0, max_task_retries=0, **options)
        entries = db_entries(self.out / DATABASE_DIR)
        environment = {name: os.environ.get(name) for name in THREAD_VARIABLES}
        return remote.remote(target, self.space, entries, self.known, self.shard_turns, environment)

    def _source(self, target: str, data: _TargetData):
        def report() -> dict[str, Any]:
            return {
                "target": target,
                "profile": self.space.profile,
                "strategies": self.space.source,
                "environment": data.environment,
                "examples": data.examples,
                "findings": [],
                "controls": data.controls,
                "not_covered": [{"op": op, "reason": why} for op, why in data.not_covered.items()],
                "known": data.known,
                "evidence": evidence(self.space, data.covered, data.tally, data.controls, True),
                "switching": data.switching or {"ok": None, "message": "not judged yet"},
                "hang_suspicions": list(data.hang_suspicions),
            }

        return report

    # -- the run -------------------------------------------------------------------------------

    def run(self) -> int:
        import ray

        started_ray = False
        if not ray.is_initialized():
            ray.init(address=self.address, include_dashboard=False, log_to_driver=False)
            started_ray = True
        try:
            return self._run(ray)
        finally:
            if started_ray:
                ray.shutdown()

    def _run(self, ray) -> int:
        ledger = self.ledger = self._open_ledger(mode="ray")
        (self.out / DATABASE_DIR).mkdir(parents=True, exist_ok=True)
        data = self._data = {t: _TargetData(cells_for(self.space)) for t in self.targets}
        for target, d in data.items():
            for cell in d.cells:
                ledger.cell(target, cell.op, cell.prop, cell.switch)
            ledger.sources[target] = self._source(target, d)
        resources = ray.cluster_resources()
        deadline = ledger.started_monotonic + self.budget_s
        previous = signal.signal(signal.SIGTERM, _on_sigterm)
        status: int | None = None
        inflight: dict[Any, tuple[Slot, Shard]] = {}
        try:
            for target in self.targets:
                device = device_for(target, self.device)
                count = self.actors or default_actors(device, len(self.targets), resources)
                for _ in range(count):
                    self.slots.append(Slot(len(self.slots), target, self._new_actor(ray, target)))
            ledger.extra["ray"] = {
                "actors": len(self.slots),
                "resources": {k: v for k, v in resources.items() if not k.startswith("node:")},
                "requeued": self.requeued,
            }
            try:
                hellos = ray.get(
                    [s.actor.hello.remote() for s in self.slots],
                    timeout=self.space.start_timeout_s + 60,
                )
            except (ray.exceptions.RayError, TimeoutError) as exc:
                print(
                    f"bi-props: the Ray actors could not start their workers:\n{exc}", file=self.log
                )
                status = 2
                return status
            for slot, hello in zip(self.slots, hellos, strict=True):
                if hello["status"] != "ready":
                    print(
                        f"bi-props: target {slot.target!r} is {hello['status']}:\n"
                        f"{hello['message']}",
                        file=self.log,
                    )
                    status = 2
                    return status
                data[slot.target].environment = hello["environment"]
                data[slot.target].covered = hello.get("covered", [])
                if hello["known"]:
                    data[slot.target].known = hello["known"]
            ledger.progress(
                f"ray: {len(self.slots)} actor(s) ready "
                f"({', '.join(f'{t}: {device_for(t, self.device)}' for t in self.targets)})",
                0,
            )
            queue: deque[Shard] = deque(
                self._shard(target=t, kind="control", op=op, prop=prop)
                for t in self.targets
                for op, prop in catalogue_controls(self.space.ops, self.space.exclude_properties)
            )
            check = SwitchingCheck(list(self.targets))  # beside the shards, in the driver
            self._loop(ray, ledger, data, queue, inflight, deadline)
            self._drain(ray, ledger, data, queue, inflight, self.grace_s)
            for target, verdict in check.finish().items():
                data[target].switching = verdict
                fields = switching_finding(target, verdict)
                if fields is not None:
                    ledger.record(Finding(**fields))
        except (KeyboardInterrupt, Interrupted):
            ledger.interrupted = True
            ledger.progress("interrupted: collecting in-flight shards, writing the report", 0)
            try:
                self._drain(ray, ledger, data, deque(), inflight, INTERRUPT_GRACE_S)
            except (KeyboardInterrupt, Interrupted):
                pass
        finally:
            signal.signal(signal.SIGTERM, previous)
            ledger.cells_phase_end(self._examples(data))
            self._close_actors(ray)
            ledger.finish()
        return self._reports_written(ledger, status)

    def _close_actors(self, ray) -> None:
        """Close each actor's Session (its workers, its scratch directories), then kill it."""
        closing = []
        for slot in self.slots:
            try:
                closing.append(slot.actor.close.remote())
            except Exception:
                pass
        if closing:
            ray.wait(closing, num_returns=len(closing), timeout=15)
        for slot in self.slots:
            try:
                ray.kill(slot.actor)
            except Exception:
                pass

    @staticmethod
    def _examples(data: dict[str, _TargetData]) -> int:
        return sum(d.examples for d in data.values())

    def _next_shard(
        self,
        ledger: Ledger,
        data: dict[str, _TargetData],
        queue: deque[Shard],
        inflight: dict[Any, tuple[Slot, Shard]],
        target: str,
    ) -> Shard | None:
        """The next shard for an idle actor of ``target``; starts a new round when the target's
        queue is empty. None when every live cell of the target is in flight (or none is live)."""
        for shard in queue:
            if shard.target == target:
                queue.remove(shard)
                return shard
        busy = {shard.cell for _, shard in inflight.values()}
        d = data[target]
        need = self.examples_per_cell
        live = [
            c
            for c in d.cells
            if not c.done
            and (need is None or c.examples < need)
            and (target, c.op, c.prop, c.switch) not in busy
        ]
        if not live:
            return None
        d.round, d.round_seed = ledger.next_round(target)
        # Enabled-state and parity cells first, as in the local campaign (scheduler.py).
        for cell in sorted(live, key=lambda c: (c.switch == "disabled", c.examples)):
            queue.append(
                self._shard(
                    target=target,
                    kind="cell",
                    op=cell.op,
                    prop=cell.prop,
                    switch=cell.switch,
                    round=d.round,
                    round_seed=d.round_seed,
                )
            )
        return self._next_shard(ledger, data, queue, inflight, target)

    def _dispatch(self, slot: Slot, shard: Shard, remaining: float, inflight) -> None:
        if shard.kind == "cell" and self.ledger is not None:
            self.ledger.cells_phase(self._examples(self._data))
        if shard.kind == "control":  # the controls share control_share of the budget
            listed = catalogue_controls(self.space.ops, self.space.exclude_properties)
            controls = max(1, len(listed) * len(self.targets))
            remaining = min(remaining, self.control_share * self.budget_s / controls)
        ref = slot.actor.run.remote(shard, remaining)
        slot.busy = True
        inflight[ref] = (slot, shard)
        self.dispatched.append((shard.id, slot.index))
        if self.on_dispatch is not None:
            self.on_dispatch(self, slot, shard)

    def _loop(self, ray, ledger, data, queue, inflight, deadline: float) -> None:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            if self._enough_findings(ledger, lambda: self._examples(data)):
                return  # the in-flight shards still report (_drain)
            for slot in self.slots:
                if slot.busy:
                    continue
                shard = self._next_shard(ledger, data, queue, inflight, slot.target)
                if shard is not None:
                    self._dispatch(slot, shard, remaining, inflight)
            if not inflight:  # every cell retired, or ran --examples-per-cell examples
                self._record_enough_examples(ledger, data)
                return
            ready, _ = ray.wait(list(inflight), num_returns=1, timeout=max(0.0, remaining))
            for ref in ready:
                self._collect(ray, ledger, data, queue, inflight, ref)

    def _record_enough_examples(self, ledger: Ledger, data: dict[str, _TargetData]) -> None:
        """The report's ``stopped_early`` when ``examples_per_cell`` ended the run: every cell of
        every target ran that many examples in this run or retired (the controls' shards are
        queued first, so each has reported by now)."""
        need = self.examples_per_cell
        cells = [c for d in data.values() for c in d.cells]
        if need is None or not any(not c.done for c in cells):
            return
        why = (
            f"once every cell had run {need} examples or retired ({len(cells)} cells, "
            f"--examples-per-cell {need}), "
            f"{time.monotonic() - ledger.started_monotonic:.0f} s of the {self.budget_s:g} s budget"
        )
        ledger.extra["stopped_early"] = why
        ledger.progress(f"stopping {why}", self._examples(data))

    def _drain(self, ray, ledger, data, queue, inflight, grace_s: float) -> None:
        """After the deadline: no new shards; in-flight ones may still report within grace_s."""
        end = time.monotonic() + grace_s
        while inflight:
            remaining = end - time.monotonic()
            if remaining <= 0:
                for slot, shard in inflight.values():
                    print(
                        f"bi-props: {shard.target} {shard.name} still running after the grace "
                        f"period on actor {slot.index}; abandoned",
                        file=self.log,
                    )
                inflight.clear()
                return
            ready, _ = ray.wait(list(inflight), num_returns=1, timeout=remaining)
            for ref in ready:
                self._collect(ray, ledger, data, queue, inflight, ref, requeue=False)

    def _collect(self, ray, ledger, data, queue, inflight, ref, requeue: bool = True) -> None:
        slot, shard = inflight.pop(ref)
        slot.busy = False
        try:
            result = ray.get(ref)
        except ray.exceptions.RayActorError as exc:
            slot.deaths += 1
            self.requeued.append(shard.id)
            again = replace(shard, attempts=shard.attempts + 1)
            cause = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            if requeue and again.attempts <= MAX_REQUEUES:
                queue.appendleft(again)
                what = "re-queued"
            else:
                what = "dropped" if requeue else "lost at the end of the budget"
                self._retire(data, shard)
            ledger.progress(
                f"actor {slot.index} ({slot.target}) died running {shard.name} "
                f"(shard {shard.id}): {what}; replacing the actor [{cause[:120]}]",
                self._examples(data),
            )
            slot.actor = self._new_actor(ray, slot.target)
            return
        except ray.exceptions.RayTaskError as exc:  # a bug of bi_props inside the actor
            ledger.progress(
                f"shard {shard.id} ({shard.target} {shard.name}) failed inside bi_props; "
                f"the cell is retired:\n{exc}",
                self._examples(data),
            )
            ledger.extra.setdefault("errors", []).append(
                {"shard": shard.id, "target": shard.target, "what": shard.name, "error": str(exc)}
            )
            self._retire(data, shard)
            return
        self.completed.append(shard.id)
        self._merge(ledger, data[shard.target], shard, result)

    @staticmethod
    def _retire(data, shard: Shard) -> None:
        if shard.kind != "cell":
            return
        for cell in data[shard.target].cells:
            if (cell.op, cell.prop, cell.switch) == (shard.op, shard.prop, shard.switch):
                cell.done = True

    def _merge(self, ledger: Ledger, d: _TargetData, shard: Shard, result: dict) -> None:
        d.examples += result["examples"]
        if result.get("environment"):
            d.environment = result["environment"]
        d.not_covered.update(
            {op: why for op, why in result["not_covered"].items() if op not in d.not_covered}
        )
        d.hang_suspicions.extend(result.get("hang_suspicions", []))
        new_before, reseen_before = len(ledger.new), len(ledger.reseen)
        for finding in result["findings"]:
            name = Path(finding["reproducer"]).name if finding.get("reproducer") else None
            if name in result.get("reproducers", {}):
                path = self.out / "repro" / name
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(result["reproducers"][name])
                finding = {**finding, "reproducer": str(path)}
            ledger.record(finding_from_dict(finding))
        if result["coverage"]:
            with (self.out / COVERAGE_FILE).open("a") as f:
                for line in result["coverage"]:
                    line.setdefault("target", shard.target)
                    line.setdefault("round", shard.round)
                    f.write(json.dumps(line) + "\n")
                    d.tally.add(line)
        db_union(self.out / DATABASE_DIR, result["db"])
        total = self._examples(self._data)
        if shard.kind == "control":
            control = result["control"]
            d.controls = [
                c for c in d.controls if (c["op"], c["property"]) != (shard.op, shard.prop)
            ] + [control]
            seen = "variance seen" if control["variance_seen"] else "none seen"
            ledger.write_report()
            ledger.progress(f"{shard.target} | control {shard.op} {shard.prop}: {seen}", total)
            return
        cell = next(
            c for c in d.cells if (c.op, c.prop, c.switch) == (shard.op, shard.prop, shard.switch)
        )
        cell.examples += result["turn_examples"]
        cell.done = cell.done or result["done"]
        stats = ledger.cell(shard.target, shard.op, shard.prop, shard.switch)
        ledger.turn_done(stats, result["turn_examples"], result["seconds"], result["done"])
        outcome = done_outcome(ledger, new_before, reseen_before) if result["done"] else ""
        if result["findings"]:
            ledger.write_report()
        ledger.progress(
            f"round {shard.round} | {shard.target} | {shard.name}: {cell.examples} examples"
            f"{outcome}",
            total,
        )


def run_ray_campaign(*args, log: TextIO = sys.stderr, **kwargs) -> int:
    """``bi-props fuzz --ray``: a campaign whose cells run on Ray actors."""
    try:
        import ray  # noqa: F401
    except ImportError:
        print("bi-props: --ray needs Ray: pip install 'bi_props[ray]' (ray>=2.9)", file=sys.stderr)
        return 2
    return RayCampaign(*args, log=log, **kwargs).run()
