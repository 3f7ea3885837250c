"""One testing session against one target: runner, space, findings, controls, coverage.

Shared by the pytest suite and the CLI. Imports Hypothesis (to draw, and to know the final replay)
but never torch: everything that touches tensors happens in the workers.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import note
from hypothesis.control import current_build_context

from ..catalogue.scale import reach_points, small_limit
from ..catalogue.strategies import cases, cases_near_known, control_cases
from ..integrations import switches
from ..model import property_spec
from ..model.batch_reach import BatchReach
from ..model.case import Case, case_class, case_size
from ..model.deployment import SizeReach
from ..model.known import KnownFailure
from ..model.observation import Hello
from ..model.op_registry import OPS
from ..model.space import Space
from ..reporting.ulp import coverage_extras, reference_ulps
from ..runner.controller import (
    CONFIRM_PATIENCE,
    ConfirmationCut,
    InternalError,
    Runner,
    WorkerFailure,
    WorkerHang,
    WorkerStartFailure,
)
from .controls import (
    Control,
    control_entry,
    internal_message,
    is_final_replay,
    run_control,
)
from .deployment_example import DEPLOYMENT_NOTE
from .localize import localize
from .localize import wanted as localizing
from .modes import fresh_compile_env, mode_space
from .records import (
    INTERNAL,
    LEAK,
    LEAK_PROPERTIES,
    PROMISE,
    RETIRING_KINDS,
    STATUS_COMPLETE,
    STATUS_INTERNAL,
    STATUS_RUNNING,
    Failure,
    Finding,
    InternalFailure,
    PropertyFailed,
    failure_class,
    strict_contract_requested,
)
from .session_report import degenerate_summary, routing_notes, session_report

CROSS_PROCESS_EVERY = 8
"""The default of ``[runner] cross_process_every``: one determinism example in this many (by a
hash of the case) is also compared bitwise in a second, freshly started worker: about 12% of
determinism examples, one extra example each, plus one worker start per switch state per
session (0 in the space turns it off)."""
CROSS_PROCESS_START_LEFT_S = 10.0
"""The second worker is not started when less than this is left of a campaign's budget."""
MAX_REASONS = 6  # reasons kept per unclaimed op
# Outcomes that are no evidence either way: nothing that could differ was compared, or no
# summation order could have shown (``Session.check`` returns them; the suite draws again).
COUNTED_APART = ("degenerate", "order-blind")


@dataclass(repr=False)
class Session:
    target: str
    space: Space
    runner: Runner = field(init=False)
    findings: list[Finding] = field(default_factory=list)
    controls: list[Control] = field(default_factory=list)
    not_covered: dict[str, str] = field(default_factory=dict)
    # (op, switch) -> why routing could not be observed (never counted as a pass).
    unobservable: dict[tuple[str, str], str] = field(default_factory=dict)
    # Ops whose routing [enabled] was judged on evidence at least once: when routing was not
    # observable for any op, the run gives no routing verdict (exit status 3).
    routing_observed: set[str] = field(default_factory=set)
    # op -> what the enabled state's batch invariance showed for an op the target does not claim:
    # {"property", "batch_variant", "case" (smallest seen), "examples", "message"}.
    unclaimed: dict[str, dict[str, Any]] = field(default_factory=dict)
    _unclaimed_cases: dict[str, Case] = field(default_factory=dict, repr=False)
    report_path: Path | None = None
    known: list[KnownFailure] = field(default_factory=list)
    known_status: list[dict[str, Any]] = field(default_factory=list)
    started: float = field(default_factory=time.time)
    # Who turns the switch in the workers (switches.py): "env" or "verl"; default from
    # BI_PROPS_SWITCH_PROVIDER, so sessions built by the campaign follow `bi-props fuzz --switch`.
    switch_provider: str = field(default_factory=switches.selected)
    _strategies: dict = field(default_factory=dict, repr=False)
    examples_log: list[dict] = field(default_factory=list, repr=False)
    # (op, property, switch) -> how far its batches reached (batch-wide quantities, thresholds)
    batch_reach: dict[tuple, BatchReach] = field(default_factory=dict, repr=False)
    # per cell of an op with a deployment axis (OpSpec.scale): how far its examples reached
    size_reach: dict[tuple, SizeReach] = field(default_factory=dict, repr=False)
    last_failure: Failure | None = field(default=None, repr=False)
    status: str = STATUS_RUNNING  # report.json's "status"; close() turns "running" to "complete"
    strict_controls: bool = False  # a control that saw no variance is a failure (reports say so)
    # A contract widening (parity, kind "widening") fails the run (exit 1); else it is reported
    # apart as "accepts more than stock". Default: STRICT_CONTRACT_ENV (bi-props fuzz sets it).
    strict_contract: bool = field(default_factory=strict_contract_requested)
    # Errors of bi_props that are no finding of one case (e.g. a search that could not run).
    internal_errors: list[str] = field(default_factory=list)
    # Failure signatures skipped (not raised) because they were settled: (op, prop, switch) -> n.
    skipped_known: dict[tuple, int] = field(default_factory=dict, repr=False)
    # On: a failure whose signature is settled (``settled``) lets the example pass, so the search
    # goes on for other signatures. Set by the drivers (pytest plugin, run_slice).
    skip_settled: bool = False
    # The `switching` property's verdict (bi_props.runner.switching), judged once at close.
    switching: dict[str, Any] = field(default_factory=dict)
    # (op, prop, switch, repr(case)) -> the signature that case failed with, until it passes again
    _failed_cases: dict[tuple, tuple] = field(default_factory=dict, repr=False)
    # Signatures whose very case passed when it was run again: what makes a failure ``flaky``.
    _passed_again: set[tuple] = field(default_factory=set, repr=False)
    # Examples judged by the cells (``check``), and those of them that were degenerate: a
    # verdict that compared no element that could depend on the property, or both calls raising
    # the same error ("not judged"). (op, prop, switch) -> [count, first reason]; never passes.
    checked: int = 0
    degenerate: dict[tuple, list] = field(default_factory=dict, repr=False)
    _held: bool = field(default=False, repr=False)  # the last check's case did not fail
    # Determinism across processes: the second worker (started at the first due example), the
    # comparisons made, and the (op, switch) pairs that differed (then every case is due).
    _second: Runner | None = field(default=None, repr=False)
    cross_process_checks: int = 0
    # The exhaustive 16-bit sweeps run (campaigns/sweep.py): report.json's "sweeps".
    sweeps: list[dict] = field(default_factory=list)
    swept: set[tuple] = field(default_factory=set, repr=False)
    _cross_hot: set[tuple[str, str]] = field(default_factory=set, repr=False)
    # The example database of the run (the campaign's, the pytest profile's): where known
    # batch-variant cases are kept between runs (campaigns/explicit.py).
    database: Any = field(default=None, repr=False)
    # op -> {repr: case}: cases on which the stock kernel (switch off) was seen batch-variant.
    variants: dict[str, dict[str, Case]] = field(default_factory=dict, repr=False)
    # (op, prop, switch) -> reprs of the explicit cases run; and the template of a cell's dtype
    # examples (campaigns/explicit.py).
    explicit_done: dict[tuple, set] = field(default_factory=dict, repr=False)
    dtype_templates: dict[tuple, Case] = field(default_factory=dict, repr=False)
    # Explicit examples drawn once per session by kind (deployment_example.py, small_cover.py)
    drawn_examples: dict[tuple, Any] = field(default_factory=dict, repr=False)
    drawn_done: set[tuple] = field(default_factory=set, repr=False)
    # How a failure recorded now was shrunk, when not by Hypothesis (an explicit example).
    shrink_note: str = field(default="", repr=False)
    # Whether cells run their explicit examples before drawing (campaigns/explicit.py).
    explicit_examples: bool = True
    # On: a failure is remembered (``last_failure``) but not recorded at once: the caller
    # shrinks it first (campaigns/shrink.py), then records it.
    defer_finalize: bool = field(default=False, repr=False)
    # A final replay's failure to reduce further once Hypothesis' own test has ended (a nested
    # Hypothesis search is refused inside it): ``record_final``, then ``record_deferred``.
    deferred_final: tuple[Failure, str] | None = field(default=None, repr=False)
    # Cells that failed in this session: the suite stops rejecting their examples that judged
    # nothing, so that Hypothesis' shrink sees them pass, as a campaign's does.
    failed_cells: set[tuple[str, str, str]] = field(default_factory=set, repr=False)
    # The floor of evidence (campaigns/evidence.py) on every cell the space has (a campaign:
    # a cell it did not run is thin), or on the cells that ran only (pytest: a user's -k
    # selection leaves cells out on purpose).
    floor_all_cells: bool = False
    # The evidence per cell (op, prop, switch): examples judged (compared something that could
    # differ: not degenerate, not order-blind, not unobservable), order-blind ones (order-exact
    # values in a property comparing a batch's values: they check which rows a kernel reads,
    # not its reduction order), and rows judged (batch invariance: the needle's and its
    # windows', model/windows.py).
    judged: dict[tuple, int] = field(default_factory=dict, repr=False)
    order_blind: dict[tuple, int] = field(default_factory=dict, repr=False)
    rows_judged: dict[tuple, int] = field(default_factory=dict, repr=False)
    # Suspected hangs the fresh process did not confirm: notes, not findings (campaigns/hangs.py)
    hang_suspicions: list[dict] = field(default_factory=list)

    def __repr__(self) -> str:  # Hypothesis prints the fixture in every falsifying example
        return f"<bi_props session: target {self.target!r}, space {self.space.source}>"

    def _repr_pretty_(self, printer, cycle: bool) -> None:  # Hypothesis' and IPython's printer
        printer.text(repr(self))

    def __post_init__(self) -> None:
        from ..targets.module import declare_ops

        declare_ops(self.target)  # a module target's EXTRA_OPS, before any case is drawn
        self.runner = Runner(
            self.target,
            example_timeout_s=self.space.example_timeout_s,
            start_timeout_s=self.space.start_timeout_s,
            fork=self.space.fork_workers,
            extra_env=self._worker_env(),
            modes=self.space.modes,  # Case.mode: the target narrows them (campaigns/modes.py)
        )

    def _worker_env(self) -> dict[str, str]:
        """What every worker of this session gets in its environment: the switch provider, and
        how many windows a batch-invariance example runs (``[runner] batch_windows``; the
        variable set by hand wins: benchmarks/rows_judged.py's baseline)."""
        import os

        from ..execution.execute import WINDOWS_ENV

        windows = os.environ.get(WINDOWS_ENV, str(self.space.batch_windows))
        return {switches.PROVIDER_ENV: self.switch_provider, WINDOWS_ENV: windows}

    # -- the target ----------------------------------------------------------------------------

    def hello(self, switch: str = "disabled") -> Hello:
        return self.runner.hello(switch)

    def entries(self, op: str) -> tuple[str, ...] | None:
        return self.hello("enabled").entries.get(op) or None

    def strategy(self, op: str, prop: str):
        """The case strategy of one cell, built once per set of known batch-variant cases
        (Hypothesis validates each new strategy): an enabled batch-comparing cell draws, in
        part, neighbours of the cases where the stock kernel varied (campaigns/explicit.py)."""
        from .explicit import VARIANT_PROPERTIES, variants

        known = variants(self, op) if prop in VARIANT_PROPERTIES else ()
        key = (op, prop, len(known))
        if key not in self._strategies:
            if known:
                strategy = cases_near_known(mode_space(self), op, prop, self.entries(op), known)
            else:
                strategy = cases(mode_space(self), op, prop, self.entries(op))
            self._strategies[key] = strategy
        return self._strategies[key]

    def control_strategy(self, op: str, prop: str):
        """The case strategy of a negative control of (op, prop): ``control_cases``, built once."""
        key = (op, prop, "control")
        if key not in self._strategies:
            self._strategies[key] = control_cases(mode_space(self), op, prop, self.entries(op))
        return self._strategies[key]

    def covered(self, op: str) -> bool:
        """The target claims ``op``, or the space asks of it the model-level question
        (``Space.asked_ops``: ``bi-props model``)."""
        return op in self.hello("enabled").covered or op in self.space.asked_ops

    # -- one example ---------------------------------------------------------------------------

    def judge(
        self,
        op: str,
        prop: str,
        switch: str,
        case: Case,
        fresh: bool = False,
        patience: float = 1.0,
    ):
        """Observe and judge one case; worker crashes and hangs propagate as WorkerFailure.
        ``fresh``: in a brand-new interpreter, waiting ``patience`` example timeouts."""
        if fresh:

            def observe(prop: str, case: Case, switch: str):
                return self.runner.fresh(prop, case, switch, patience=patience)

        else:
            observe = self.runner.observe
        case = self.runner.settle(case)  # in a mode the run draws (Case.mode)
        spec = property_spec.get(prop)
        if spec.both_states:  # parity: the enabled and the disabled worker's observations
            return spec.judge(observe(prop, case, "enabled"), observe(prop, case, "disabled"))
        observation = observe(prop, case, switch)
        if spec.needs_hello:  # routing: what the worker's hello says it covers and emits
            verdict = spec.judge(observation, self.hello(switch), op)
        else:
            verdict = spec.judge(observation)
        if spec.explain is not None:  # logprobs: the ops the model used that are not claimed
            verdict = spec.explain(verdict, observation, self.hello("enabled").covered)
        cross = prop == "determinism" and verdict.ok and not getattr(verdict, "degenerate", "")
        if cross and self._cross_process_due(op, switch, case):
            across = self._across_processes(case, switch, observation, fresh, patience)
            verdict = verdict if across is None else across
        return verdict

    def _cross_process_due(self, op: str, switch: str, case: Case) -> bool:
        """Whether this determinism example is also compared across processes: one case in
        ``CROSS_PROCESS_EVERY`` (by a hash of the case, so a replay of the case is due too),
        and every case of an (op, switch) that has already differed across processes (so that
        Hypothesis can shrink it)."""
        import hashlib

        every = getattr(self.space, "cross_process_every", CROSS_PROCESS_EVERY)
        if every <= 0:
            return False
        if (op, switch) in self._cross_hot:
            return True
        digest = hashlib.sha256(repr(case).encode()).digest()
        return int.from_bytes(digest[:4], "big") % every == 0

    def _across_processes(self, case: Case, switch: str, observation, fresh: bool, patience):
        """Determinism across processes: the case's first call in a second, freshly started
        worker (spawned, never forked, kept for the session) against this worker's, bitwise.
        Per-process state (an autotuner's pick, a thread-count decision, a cache warmed by the
        first call) shows here. In a fresh-process confirmation: the fresh worker's
        observation against one more fresh worker's."""
        from ..model.properties import Verdict, same_outputs

        if fresh:  # ``observation`` came from a fresh worker already: one more
            first = observation
            second = self.runner.fresh("determinism", case, switch, patience=patience)
        else:
            deadline = self.runner.deadline
            late = deadline is not None and deadline - time.monotonic() < CROSS_PROCESS_START_LEFT_S
            if self._second is None and late:
                return None  # no time left to start a second worker: not compared
            if self._second is None:
                self._second = Runner(
                    self.target,
                    example_timeout_s=self.space.example_timeout_s,
                    start_timeout_s=self.space.start_timeout_s,
                    fork=False,  # its own interpreter: no state shared with the first worker
                    # compiled cases: a fresh compile too (its own caches; campaigns/modes.py)
                    extra_env={**self._worker_env(), **fresh_compile_env(self)},
                    modes=self.space.modes,
                )
            self._second.deadline = self.runner.deadline
            first, second = observation, self._second.observe("determinism", case, switch)
        self.cross_process_checks += 1
        verdict = same_outputs(
            second.calls["first"],
            first.calls["first"],
            "first run in a second, freshly started worker (actual) vs the first worker's "
            "(desired)",
        )
        if verdict.ok:
            return verdict
        self._cross_hot.add((case.op, switch))
        return Verdict(
            False,
            "determinism across processes: the same call on the same tensors gives other bits "
            "in another process (a per-process choice: an autotuner's pick, a thread count, "
            f"a cache warmed by the first call):\n{verdict.message}",
            verdict.kind,
            verdict.error_type,
        )

    def check(self, op: str, prop: str, switch: str, case: Case) -> str:
        """Run one example; raise on failure, else return how it ended ("ok", or
        ``COUNTED_APART``'s "degenerate" and "order-blind": no evidence, so the pytest suite
        rejects those and Hypothesis draws another). On Hypothesis' final replay of the minimal
        failing example, re-run it in a brand-new worker and record the finding. A case that
        failed before and passes now is remembered (``passed_again``): the evidence of a flaky
        one."""
        self._held = False
        self._outcome = ""  # set by _check when the example was judged
        case = self.runner.settle(case)  # recorded in the mode it runs in (Case.mode)
        if (self._check(op, prop, switch, case) or self._held) and self._failed_cases:
            signature = self._failed_cases.pop((op, prop, switch, repr(case)), None)
            if signature is not None:
                self._passed_again.add(signature)
        return self._outcome

    def passed_again(self, failure: Failure) -> bool:
        """Whether a case that failed with ``failure``'s signature passed when run again in
        this session. Hypothesis' Flaky alone is no proof: it is raised as well when the same
        case fails differently on replay (a crash, then a timeout on a loaded machine)."""
        return failure.signature() in self._passed_again

    def _check(self, op: str, prop: str, switch: str, case: Case) -> bool:
        """``check``'s work; True only when the property held (a skipped settled failure, an
        unclaimed or unobservable cell is no pass)."""
        try:
            verdict = self.judge(op, prop, switch, case)
        except WorkerFailure as failure:
            self._note_example(op, prop, switch, case, failure.kind)
            kind, error_type = failure.kind, type(failure).__name__
            found = Failure(op, prop, switch, case, kind, str(failure), error_type)
            if self._skip_settled(found):
                return False
            self._failed(found)
            raise
        except Exception as exc:  # InternalError from a worker, or a bug in a judge: ours
            self._note_example(op, prop, switch, case, INTERNAL)
            message, error_type = internal_message(exc), type(exc).__name__
            found = Failure(op, prop, switch, case, INTERNAL, message, error_type)
            if self._skip_settled(found):
                return False
            self._failed(found)
            raise InternalFailure(f"{prop} [{switch}] on {op}: {found.message}") from exc
        self.checked += 1
        cell = (op, prop, switch)
        degenerate = verdict.ok and getattr(verdict, "degenerate", "")
        blind = verdict.ok and not degenerate and order_blind(prop, case)
        if prop in ("parity", "reference") and verdict.ok and not degenerate:
            self.dtype_templates.setdefault(cell, case.with_batch(None))
        outcome = (
            "degenerate"
            if degenerate
            else "order-blind"
            if blind
            else "ok"
            if verdict.ok
            else verdict.kind
        )
        self._outcome = outcome
        extras = coverage_extras(verdict)
        if getattr(verdict, "rows", None):
            extras["rows"] = int(verdict.rows)
        self._note_example(op, prop, switch, case, outcome, extras)
        if degenerate:  # no evidence either way: counted apart, never a pass
            self._held = True  # but the case did not fail: evidence of a flaky failure
            entry = self.degenerate.setdefault(cell, [0, degenerate])
            entry[0] += 1
            return False
        if blind:  # it held, but no summation order could have shown: counted apart
            self._held = True
            self.order_blind[cell] = self.order_blind.get(cell, 0) + 1
            return False
        if verdict.kind == "not_covered":
            self.not_covered.setdefault(op, verdict.message)
            return False
        if verdict.kind == "not_observable":
            self.unobservable.setdefault((op, switch), verdict.message)
            return False
        self.judged[cell] = self.judged.get(cell, 0) + 1
        rows = getattr(verdict, "rows", None)
        if rows:
            self.rows_judged[cell] = self.rows_judged.get(cell, 0) + int(rows)
        if prop == "routing" and switch == "enabled":
            self.routing_observed.add(op)  # judged on evidence (a pass or a failure)
        if switch == "enabled" and not self.covered(op) and not self._promised(prop):
            self._note_unclaimed(op, prop, case, verdict)
            if self._broken_promise(prop, verdict):  # batch-variant, under a whole-model promise
                message = self.promise_message(op, verdict.message)
                found = Failure(op, prop, switch, case, PROMISE, message, None)
                if self._skip_settled(found):
                    return False
                self._failed(found)
                raise PropertyFailed(f"{prop} [{switch}] on {op}:\n{message}")
            if not verdict.ok:
                leak = self.leak_message(op, prop, case) if prop in LEAK_PROPERTIES else None
                if leak is not None:  # the switch changed an op it does not claim
                    found = Failure(op, prop, switch, case, LEAK, leak, None, verdict.kind)
                    if self._skip_settled(found):
                        return False
                    self._failed(found)
                    raise PropertyFailed(f"{prop} [{switch}] on {op}:\n{leak}")
                why = (verdict.message.splitlines() or [""])[0][:160]
                self._note_not_covered(
                    op,
                    f"{prop} fails ({why}), but the target does not claim {op}"
                    + (", and stock fails the same way" if prop in LEAK_PROPERTIES else ""),
                )
            return False
        if verdict.ok:
            return True
        found = Failure(op, prop, switch, case, verdict.kind, verdict.message, verdict.error_type)
        if self._skip_settled(found):
            return False
        self._failed(found)
        raise PropertyFailed(f"{prop} [{switch}] on {op}:\n{verdict.message}")

    def _note_not_covered(self, op: str, why: str) -> None:
        """Keep every distinct reason an unclaimed op's cells gave (not the first alone)."""
        known = self.not_covered.get(op)
        if known is None:
            self.not_covered[op] = why
        elif why not in known and known.count("; ") < MAX_REASONS:
            self.not_covered[op] = f"{known}; {why}"

    def leak_message(self, op: str, prop: str, case: Case) -> str | None:
        """Whether the switch changed ``op``, which the target does not claim: the same case in
        both states, and the enabled observation differs from the disabled one (stock's):
        reference compares the outputs bit for bit (or raising against returning);
        determinism is a leak where stock is deterministic on the case. None: no leak seen."""
        from ..model.properties import same_outputs

        try:
            on = self.runner.observe(prop, case, "enabled")
            off = self.runner.observe(prop, case, "disabled")
        except WorkerFailure:
            return None
        if prop == "determinism":
            if not property_spec.get(prop).judge(off).ok:
                return None  # stock is as nondeterministic here
            return (
                f"leak: the switch changed {op}, which target {self.target!r} does not claim: "
                f"with the switch on the same call gives other bits twice, with it off it does "
                f"not:\n{property_spec.get(prop).judge(on).message}"
            )
        verdict = same_outputs(
            on.calls["op"],
            off.calls["op"],
            "switch on (actual) vs switch off, stock (desired)",
        )
        if verdict.ok:
            return None
        try:  # stock must give the same bits twice: else the difference is its own noise
            again = self.runner.observe(prop, case, "disabled")
        except WorkerFailure:
            return None
        if not same_outputs(again.calls["op"], off.calls["op"], "stock twice").ok:
            return None
        return (
            f"leak: the switch changed {op}, which target {self.target!r} does not claim: on "
            f"the same inputs its result with the switch on differs from stock's (switch off):"
            f"\n{verdict.message}"
        )

    def promise_message(self, op: str, evidence: str) -> str:
        """A promise finding's message: what the switch promises, what it left unswapped, and
        the evidence (a shrunk case keeps the first part, with its own evidence)."""
        hello = self.hello("enabled")
        return (
            f"promise broken: target {self.target!r}'s switch promises batch-invariant "
            f"inference, but {op} is not swapped (the target claims "
            f"{sorted(hello.covered) or 'no op'}; not swapped: {op}) and is "
            f"batch-variant with the switch on:\n{evidence}"
        )

    def _broken_promise(self, prop: str, verdict) -> bool:
        """An op the target does not claim, batch-variant (a mismatch of a property that reports
        unclaimed ops) with the switch on, under a switch that promises batch-invariant
        inference as a whole (vllm, vllm-engine, ascend, verl): the promise is broken."""
        return (
            not verdict.ok
            and verdict.kind == "mismatch"
            and property_spec.get(prop).reports_unclaimed
            and bool(self.hello("enabled").promises_inference)
        )

    def _promised(self, prop: str) -> bool:
        """A model-level property of a target whose switch promises batch-invariant inference:
        judged whatever ops the target claims."""
        spec = property_spec.get(prop)
        return spec.inference_promise and self.hello("enabled").promises_inference

    def _note_unclaimed(self, op: str, prop: str, case: Case, verdict) -> None:
        """An op the target does not claim, with the switch on: is it batch-variant? Observed and
        reported (the user's question "is my model batch-invariant now?"), never a failure."""
        if not property_spec.get(prop).reports_unclaimed:
            return
        entry = self.unclaimed.setdefault(
            op,
            {"property": prop, "batch_variant": False, "case": None, "examples": 0, "message": ""},
        )
        entry["examples"] += 1
        if verdict.ok or verdict.kind != "mismatch":
            return
        kept = self._unclaimed_cases.get(op)
        if kept is None or case_size(case) < case_size(kept):
            self._unclaimed_cases[op] = case
            entry.update(batch_variant=True, case=repr(case), message=verdict.message)
        self.write_report()

    def _note_example(
        self, op: str, prop: str, switch: str, case: Case, outcome: str, extras: dict | None = None
    ) -> None:
        """One line of coverage (what was exercised, and how it ended), for reports and plots."""
        deployed = self.shrink_note == DEPLOYMENT_NOTE
        self.examples_log.append(
            {
                "op": op,
                "property": prop,
                "switch": switch,
                "dtype": case.dtype,
                "shape": list(case.shape),
                "layouts": list(case.layouts),
                "padded": case.padded,
                "values": case.values,
                "batch_rows": None
                if case.batch is None
                else case.shape[0] + sum(c.rows for c in case.batch.companions),
                "outcome": outcome,
                **({"mode": case.mode} if case.mode != "eager" else {}),  # Case.mode
                **({"explicit": True} if self.shrink_note and not deployed else {}),
                **({"deployment": True} if deployed else {}),
                **(extras or {}),
            }
        )
        axis = OPS[op].scale if op in OPS else ""
        # drawn examples and the deployment-size example: the other explicit ones are small
        if axis and (deployed or not self.shrink_note):
            reach = self.size_reach.get((op, prop, switch))
            if reach is None:
                limit = small_limit(self.space, op, axis)
                reach = SizeReach(axis, reach_points(self.space, axis), limit)
                self.size_reach[op, prop, switch] = reach
            reach.add(case)
        if case.batch is not None:
            key = (op, prop, switch)
            if key not in self.batch_reach:
                self.batch_reach[key] = BatchReach(self.space.switch_points)
            self.batch_reach[key].add(case)
        if len(self.examples_log) >= 500:
            self.flush_examples()

    def flush_examples(self) -> None:
        """Append the buffered coverage lines to ``examples.jsonl`` beside the report."""
        if self.report_path is None or not self.examples_log:
            self.examples_log.clear()
            return
        path = self.report_path.with_name("examples.jsonl")
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as f:
            f.writelines(json.dumps(line) + "\n" for line in self.examples_log)
        self.examples_log.clear()

    # -- settled signatures: a known failure does not stop the search ---------------------------

    def settled(self, signature: tuple) -> bool:
        """Is a failure signature with its class (``Failure.classed()``) already accounted
        for: listed in the known-failures file, or already recorded by this session?"""
        full = (self.target, *signature)
        return any(k.matches(full) for k in self.known) or any(
            f.accounts_for(full) for f in self.findings
        )

    def accounted(self, failure: Failure) -> bool:
        """Whether a failure is accounted for already: its class is settled (``settled``), or
        it is an exception of a root cause (``failure_class``) this very cell recorded: the
        same exception in another dtype or size says nothing new, where a mismatch might."""
        return self.settled(failure.classed()) or self._same_root_here(failure)

    def has_finding_for(self, failure: Failure) -> bool:
        """Whether this session holds a finding accounting for the failure: of its class
        (``recorded``), or of its root cause in its cell (``accounted``)."""
        return self.recorded(failure) or self._same_root_here(failure)

    def _same_root_here(self, failure: Failure) -> bool:
        root = failure_class(failure)
        if root is None:
            return False
        cell = (failure.op, failure.prop, failure.switch, failure.kind, failure.error_type)
        return any(
            (f.op, f.property, f.switch, f.kind, f.error_type) == cell
            and failure_class(
                Failure(f.op, f.property, f.switch, failure.case, f.kind, f.message, f.error_type)
            )
            == root
            for f in self.findings
        )

    def _skip_settled(self, failure: Failure) -> bool:
        """When ``skip_settled`` is on and the failure is accounted for (``accounted``), note it
        (the first time, a known-failures match is recorded as a *known* finding, unshrunk) and
        let the example pass, so that the cell keeps exploring for other signatures."""
        if not self.skip_settled or not self.accounted(failure):
            return False
        cell = (failure.op, failure.prop, failure.switch)
        self.skipped_known[cell] = self.skipped_known.get(cell, 0) + 1
        full = (self.target, *failure.classed())
        listed = any(k.matches(full) for k in self.known)  # the first sight of a known entry
        if listed and not self.has_finding_for(failure) and not self._known_recorded(failure):
            self.finalize(
                failure,
                shrink="not shrunk: a known failure, skipped so that the cell keeps exploring",
                confirm=False,
            )
        _note("A known failure (its signature is settled): skipped, the search goes on.")
        return True

    def _known_recorded(self, failure: Failure) -> bool:
        """Whether a known-failures entry naming every class of the cell (no case, no class)
        matches this failure and one of its findings is recorded already: one known finding
        per entry, not one per class met."""
        full = (self.target, *failure.classed())
        entries = [k for k in self.known if k.matches(full) and k.failure_class() is None]
        return any(k.matches(f.signature()) for k in entries for f in self.findings)

    def _failed(self, failure: Failure) -> None:
        """Remember the failure; on Hypothesis' final replay (the minimal case) record it.
        Nothing is skipped after it in this search (``skip_settled`` off until the driver sets
        it again): its shrink may pass through a settled class, and ends there when it is the
        same bug (then nothing new is recorded)."""
        self.skip_settled = False
        self.last_failure = failure
        self.failed_cells.add((failure.op, failure.prop, failure.switch))
        self._failed_cases[(failure.op, failure.prop, failure.switch, repr(failure.case))] = (
            failure.signature()
        )
        if is_final_replay() and not self.defer_finalize:
            self.record_final(failure, shrink=self.shrink_note or "complete")

    def record_final(
        self, failure: Failure, stop_at: float | None = None, shrink: str = "complete"
    ) -> None:
        """Record the minimal failure of Hypothesis' shrink. One drawn as the neighbour of a known
        batch-variant case kept that case's structure (rows, extents, companions: the neighbour
        strategy only moves data, place and dtype), so it is reduced further over its own knobs
        (``shrink.shrink``) before it is recorded; a crash or a hang is not (each candidate
        would cost a worker or a timeout)."""
        from hypothesis import currently_in_test_context

        from .explicit import near_known
        from .shrink import shrink as reduce

        left = stop_at is None or time.monotonic() < stop_at
        if left and failure.kind not in RETIRING_KINDS and near_known(self, failure.case):
            if currently_in_test_context():  # the pytest suite's replay: after its test ends
                self.deferred_final = (failure, shrink)
                return
            reduced, note = reduce(
                self, failure, stop_at, "a neighbour of a known stock-variant case"
            )
            if reduced.case != failure.case:
                failure, shrink = reduced, f"{shrink}, then {note}"
        self.finalize(failure, shrink=shrink)

    def record_deferred(self) -> None:
        """Record the failure ``record_final`` left for after Hypothesis' test, reduced."""
        if self.deferred_final is not None:
            (failure, shrink), self.deferred_final = self.deferred_final, None
            if not self.recorded(failure):  # its test's final replay recorded it already
                self.record_final(failure, shrink=shrink)

    def finalize(
        self,
        failure: Failure,
        shrink: str = "complete",
        confirm: bool = True,
        confirm_kind: str | None = None,
    ) -> None:
        """Record a failure as a finding: re-run it in a brand-new worker (unless ``confirm`` is
        False: an interrupted run records at once), match the known failures, and write a
        standalone reproducer. The fresh run confirms only the same property failing with the
        same kind (``confirm_kind``: the kind first seen, for a flaky finding)."""
        op, prop, switch, case = failure.op, failure.prop, failure.switch, failure.case
        same = self.same_failure(failure)
        if same is not None:  # its class was shrunk and confirmed once: not again
            confirm = False
            shrink = (
                f"not shrunk again: the same failure as {same.op} {same.property} "
                f"[{same.switch}] ({same.error_type} from {op}), shrunk and confirmed there"
            )
        if same is not None:
            reproduced, confirmation = (
                same.reproduced_in_fresh_process,
                (
                    f"as {same.op} {same.property} [{same.switch}] (the same failure): "
                    f"{same.confirmation}"
                ),
            )
        elif confirm:
            kind = confirm_kind or failure.confirm_as
            kind = kind or ("mismatch" if failure.kind == PROMISE else failure.kind)
            reproduced, confirmation = self._reproduces_fresh(
                op, prop, switch, case, kind, failure.error_type
            )
        else:
            reproduced, confirmation = None, "not confirmed: not re-run in a fresh process"
        from .hangs import settle_suspicion  # a suspected hang needs the full timeout's word

        noted, confirmation = settle_suspicion(
            self, failure, confirm_kind, reproduced, confirmation, shrink
        )
        _note(f"Fresh worker process: {confirmation}")
        if noted:  # not confirmed: a note in report.json's hang_suspicions, no finding
            return
        message, op_reproducer = failure.message, None
        if same is None and confirm and localizing(prop, switch, failure.kind, op):
            lines, op_reproducer = localize(self, case, len(self.findings))
            message = "\n".join([message, *lines])  # the first diverging op (localize.py)
            _note("\n".join(lines))
        finding = Finding(
            self.target,
            op,
            prop,
            switch,
            failure.kind,
            repr(case),
            message,
            reproduced,
            failure.error_type,
            shrink=shrink,
            confirmation=confirmation,
            **reference_ulps(failure.message),
            first_kind=confirm_kind if confirm_kind not in (None, failure.kind) else None,
            case_class=case_class(case),
        )
        if finding.kind == INTERNAL:
            self.status = STATUS_INTERNAL
        if any(k.matches(finding.signature()) for k in self.known):
            finding.status = "known"
            _note("This failure is listed as a known failure.")
        if confirm:
            finding.reproducer = self.write_reproducer(finding, case) or op_reproducer
        elif same is not None:
            finding.reproducer = same.reproducer
        if finding.reproducer:
            _note(f"Standalone reproducer: {finding.reproducer}")
        self.record(finding)

    def _reproduces_fresh(
        self,
        op: str,
        prop: str,
        switch: str,
        case: Case,
        kind: str,
        error_type: str | None = None,
    ) -> tuple[bool | None, str]:
        """(reproduced, why): True only for the same property failing with the same ``kind``
        (and, for an error, the same exception type where both name one);
        None when the fresh worker could not start (nothing was observed), unless not starting
        was the finding itself (a target that breaks when switched): then it reproduces."""
        hang = kind == WorkerHang.kind
        patience = 1.0 if hang else CONFIRM_PATIENCE
        try:
            verdict = self.judge(op, prop, switch, case, fresh=True, patience=patience)
        except WorkerStartFailure as exc:
            if error_type == WorkerStartFailure.__name__ and kind == exc.kind:
                return True, f"reproduced: a fresh worker did not start either: {_first_line(exc)}"
            return None, f"not confirmed: the fresh worker did not start: {_first_line(exc)}"
        except ConfirmationCut as exc:
            return None, f"not confirmed: the fresh worker's example was {_first_line(exc)}"
        except WorkerHang as exc:
            if not hang:  # silence shows neither this finding nor its absence
                return None, (
                    f"not confirmed: the fresh worker's example did not finish "
                    f"({_first_line(exc)}), so it showed no {kind}"
                )
            seen = exc.kind
        except WorkerFailure as exc:
            seen = exc.kind
        except Exception:
            seen = INTERNAL
        else:
            if verdict.ok:
                return False, "not reproduced: the case passed in a fresh worker"
            seen = verdict.kind
            if seen == kind and error_type and verdict.error_type not in (None, error_type):
                # An error finding names its exception: another exception is another failure.
                return False, (
                    f"not reproduced: a fresh worker raised {verdict.error_type}, not {error_type}"
                )
        if seen == kind:
            return True, f"reproduced: {prop} failed with {kind} in a fresh worker"
        return False, f"not reproduced: a fresh worker failed with {seen}, not {kind}"

    def write_reproducer(self, finding: Finding, case: Case) -> str | None:
        """A standalone script beside the report (``repro/``); None where none can be written."""
        from ..reporting import repro

        if self.report_path is None:
            return None
        state = "enabled" if finding.switch == "both" else finding.switch
        try:
            repro.call_source(case)
            exported = self.runner.export(finding.property, case, state)
            hello = self.hello(state)
            text = repro.script(
                asdict(finding),
                case,
                exported,
                hello.repro,
                hello.kernel_prefix,
                hello.environment,
                self.space.example_timeout_s,
                self.space.start_timeout_s,
            )
        except (NotImplementedError, WorkerFailure, InternalError) as exc:
            _note(f"No standalone reproducer: {exc}")
            return None
        name = "-".join(
            [finding.op, finding.property, finding.switch, finding.kind, str(len(self.findings))]
        )
        return str(repro.write(self.report_path.parent / "repro" / f"{name}.py", text))

    def same_failure(self, failure: Failure) -> Finding | None:
        """A finding of this session in the same failure class (``failure_class``), if any."""
        key = failure_class(failure)
        if key is None:
            return None
        for finding in self.findings:
            if finding.target != self.target:
                continue
            other = Failure(
                finding.op,
                finding.property,
                finding.switch,
                failure.case,
                finding.kind,
                finding.message,
                finding.error_type,
            )
            if failure_class(other) == key:  # the first of its class: shrunk and confirmed
                return finding
        return None

    def recorded(self, failure: Failure) -> bool:
        """Whether a finding accounting for this failure's full signature (``Finding.settles``)
        is recorded already."""
        full = (self.target, *failure.classed())
        return any(f.accounts_for(full) for f in self.findings)

    def record(self, finding: Finding) -> None:
        """Keep the finding and write the report at once: nothing a long run found is lost."""
        self.findings.append(finding)
        self.write_report()

    # -- the negative control ------------------------------------------------------------------

    # -- known failures ------------------------------------------------------------------------

    def known_for(self, op: str, prop: str, switch: str) -> KnownFailure | None:
        """The known-failure entry of this target naming this cell, if any."""
        for k in self.known:
            if k.target in ("*", self.target) and k.cell() == (op, prop, switch):
                return k
        return None

    def check_known(self) -> list[dict[str, Any]]:
        """Re-run every known failure of this target that records its case: still failing, or
        fixed? Entries without a case are marked 'listed' (judged by whether the run finds it)."""
        from ..model.case import parse_case

        self.known_status = []
        for k in self.known:
            if k.target not in ("*", self.target) or k.op not in self.space.ops:
                continue
            status = "listed"
            if k.case:
                case = parse_case(k.case)
                try:
                    verdict = self.judge(k.op, k.property, k.switch, case)
                    status = "fixed" if verdict.ok else "known"
                except WorkerFailure:
                    status = "known"
            # the class it names (from its case), so that the reports match it to that class only
            entry = {**asdict(k), "case_class": k.failure_class(), "status": status}
            self.known_status.append(entry)
        self.write_report()
        return self.known_status

    # One turn of a negative control (controls.run_control says how it works), and the control
    # of (op, prop), added "not run" on first use: functions of the session, bound as methods.
    control = run_control
    _control_entry = control_entry

    # -- report --------------------------------------------------------------------------------

    def report(self) -> dict[str, Any]:
        """report.json's content for this session (``session_report``)."""
        return session_report(self)

    def degenerate_summary(self) -> dict[str, Any]:
        return degenerate_summary(self)

    def routing_notes(self) -> list[str]:
        return routing_notes(self)

    def write_report(self) -> None:
        if self.report_path is None:
            return
        self.report_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.report_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.report(), indent=2, default=str))
        tmp.replace(self.report_path)

    def internal(self, message: str) -> None:
        """An error of bi_props that is no finding of one case: kept, and the run's status."""
        self.internal_errors.append(message)
        self.status = STATUS_INTERNAL

    def judge_switching(self) -> None:
        """The `switching` property, once: "not applicable" for one-way targets; a two-way
        switch is driven as state in a spawned interpreter, and a failure is a finding."""
        from ..runner import switching

        self.switching = switching.session_verdict(self.target)
        fields = switching.finding_fields(self.target, self.switching)
        if fields is not None:
            self.record(Finding(**fields))
        self.write_report()

    def close(self) -> None:
        if self.status == STATUS_RUNNING:
            self.status = STATUS_COMPLETE
        self.flush_examples()
        self.write_report()
        self.runner.close()
        if self._second is not None:  # nothing to flush there: ended at once, not waited for
            for pool in (self._second._workers, self._second._zygotes):
                for worker in pool.values():
                    worker.kill()
            self._second.close()


def order_blind(prop: str, case: Case) -> bool:
    """An example of a property comparing a batch's values (``PropertySpec.batched``) on
    order-exact values: every partial sum exact, so no summation order can show in it."""
    return case.values == "exact" and property_spec.get(prop).batched


def _first_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def _note(text: str) -> None:
    """Hypothesis' note() inside a test (it lands in the falsifying example), a no-op outside."""
    try:
        current_build_context()
    except Exception:
        return
    note(text)
