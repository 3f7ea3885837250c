"""The records of a session's verdicts: a failing example (``Failure``), a recorded finding
(``Finding``), the root cause they share across cells (``failure_class``), the exceptions a
property raises and the finding kinds. Imported by the session, the campaign and the reports;
imports nothing of theirs."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace

from ..model.case import Case, case_class, class_of

INTERNAL = "internal"  # bi_props itself failed (controller side, or InternalError in a worker)
# An op the target does not swap, batch-variant with the switch on, under a target whose switch
# promises batch-invariant inference (the fresh process confirms it as a mismatch).
PROMISE = "promise"
FLAKY = "flaky"  # a failure that did not happen again when Hypothesis replayed the same case
# The switch changed an op the target does not claim: its enabled result differs from stock's.
LEAK = "leak"
LEAK_PROPERTIES = ("reference", "determinism")
"""The enabled cells of an unclaimed op whose failure is checked for a leak (the same case with
the switch off): parity judges both states already; batch invariance is stock's own business."""
RETIRING_KINDS = frozenset({"crash", "timeout", INTERNAL})
"""Kinds whose new finding still retires its cell: every later example that met it again would
cost a worker replacement (crash) or a whole example timeout (hang), and an ``internal`` finding
is bi_props' own failure. A worker that does not start (``WorkerStartFailure``) retires it too."""
CLASSLESS = (FLAKY, INTERNAL)
"""Finding kinds that are one finding of their cell whatever the case's class: the class of a
case that failed only once (nondeterminism) or through bi_props' own error says nothing."""
STRICT_CONTRACT_ENV = "BI_PROPS_STRICT_CONTRACT"
"""Set to 1 (``bi-props fuzz --strict-contract``): the sessions of the run record
``strict_contract``, so that a contract widening (parity's kind ``widening``: the switch-on
kernel accepts what stock refuses) fails the run (``reporting.data.exit_status``)."""


def strict_contract_requested() -> bool:
    return os.environ.get(STRICT_CONTRACT_ENV, "") == "1"


# report.json's "status": a plain string, set in one place per run (Session.status, or the
# campaign's Ledger.status). "running" while the run is on; others may add values.
STATUS_RUNNING = "running"
# The shrink note of a case Hypothesis stopped on because it failed differently when replayed.
FAILED_DIFFERENTLY = (
    "Hypothesis stopped: the same case failed differently when replayed (e.g. a crash, then a "
    "timeout on a loaded machine); the smallest failing case seen, not necessarily minimal"
)
STATUS_COMPLETE = "complete"
STATUS_INTERNAL = "internal error"


def target_status(hello_status: str) -> str:
    """The run status for a target that cannot run: "target missing" or "target broken"."""
    return f"target {hello_status}"


class PropertyFailed(AssertionError):
    """A property does not hold for a case (a mismatch, or an exception where none belongs)."""


class InternalFailure(Exception):
    """bi_props failed while running or judging an example: a bug of ours, recorded as a finding
    of kind ``internal`` (never mistaken for a pass, never for the target's bug)."""


@dataclass
class Finding:
    target: str
    op: str
    property: str
    switch: str
    kind: str
    case: str
    message: str
    # True: the same property failed with the same kind in a brand-new worker; False: it ran there
    # and passed, or failed otherwise; None: not confirmed (not re-run, or the worker did not
    # start). ``confirmation`` says which, in words.
    reproduced_in_fresh_process: bool | None
    error_type: str | None = None
    reproducer: str | None = None
    status: str = "new"  # "known" when a known-failures entry names its signature
    # "complete": Hypothesis' minimal case. Otherwise why shrinking stopped early (the budget was
    # spent, or the run was interrupted): the case is then the smallest failing one seen.
    shrink: str = "complete"
    confirmation: str = ""
    # reference findings: ulps at the element nearest its bound (observed, allowed there).
    ulps_observed: int | None = None
    ulps_allowed: float | None = None
    # A ``flaky`` finding: the kind its first run failed with (a mismatch, a timeout, ...).
    first_kind: str | None = None
    # Its failure class within the cell (``model.case.case_class``): another dtype, layout,
    # value kind or size class is another finding.
    case_class: str = ""

    def signature(self) -> tuple:
        klass = self.case_class or class_of(self.case)
        return (
            self.target, self.op, self.property, self.switch, self.kind, self.error_type, klass
        )  # fmt: skip

    def settles(self) -> set[tuple]:
        """The signatures this finding accounts for: its own, and a flaky finding's first-seen
        one (that failure met again is this finding, not a new one to shrink every turn). A
        flaky or internal finding is one of its cell whatever the class (``CLASSLESS``): its
        class is ``"*"``."""
        target, op, prop, switch, kind, error_type, klass = self.signature()
        klass = "*" if kind in CLASSLESS else klass
        settled = {(target, op, prop, switch, kind, error_type, klass)}
        if self.first_kind and self.first_kind != self.kind:
            settled.add((target, op, prop, switch, self.first_kind, error_type, klass))
        return settled

    def accounts_for(self, signature: tuple) -> bool:
        """Whether this finding settles a full signature with its class (``settles``)."""
        mine = self.settles()
        return signature in mine or (*signature[:-1], "*") in mine


@dataclass(frozen=True)
class Failure:
    """One failing example as ``Session.check`` saw it: enough to record it as a finding."""

    op: str
    prop: str
    switch: str
    case: Case
    kind: str
    message: str
    error_type: str | None
    # The verdict kind a fresh worker must show to confirm it, where the finding's kind is a
    # reading of the verdict (a promise or a leak finding is a mismatch of the observation).
    confirm_as: str | None = None

    def signature(self) -> tuple:
        """The cell and kind: what one Hypothesis search shrinks as one failure."""
        return (self.op, self.prop, self.switch, self.kind, self.error_type)

    def classed(self) -> tuple:
        """``signature`` and the case's failure class (``case_class``): what is recorded, and
        what a known or recorded finding settles."""
        return (*self.signature(), case_class(self.case))


FLAKY_SHRINK = "not shrunk: the failure did not replay (flaky); the case as first seen"


def as_flaky(failure: Failure) -> Failure:
    """A failure whose very case passed when run again in the same worker: a ``flaky`` failure
    (nondeterminism: an atomic reduction, a race, a cache, a warm-up path) with both
    observations in its message. bi_props' own errors stay ``internal``."""
    kind = INTERNAL if failure.kind == INTERNAL else FLAKY
    message = (
        f"first run of the case: {failure.prop} [{failure.switch}] failed ({failure.kind}):\n"
        f"{failure.message}\n\n"
        f"replay of the same case in the same worker: passed. The result depends on more than "
        f"the inputs (nondeterminism), so Hypothesis could not reproduce it."
    )
    return replace(failure, kind=kind, message=message)


def failure_class(failure: Failure) -> tuple | None:
    """The root cause of an exception, across properties and ops: the same exception type and
    message stem (numbers and dtype names elided), or the same crash signal (a half-installed
    kernel raising TypeError in every cell of several ops; a library that segfaults on a
    dtype). A class is
    shrunk and confirmed once; its other cells are recorded as the same failure, at no fresh
    start each. None for failures that name no exception (a mismatch is each property's own
    evidence)."""
    if not failure.error_type or failure.kind == INTERNAL:
        return None
    if failure.kind == "crash":
        signal = re.search(r"SIG[A-Z]+|signal -?\d+", failure.message)
        return (failure.kind, failure.error_type, signal.group(0) if signal else "")
    match = re.search(rf"{re.escape(failure.error_type)}: (.*)", failure.message)
    text = match.group(1) if match else (failure.message.splitlines() or [""])[0]
    text = text.split("; disabled ")[0]  # parity's message goes on with the other state
    stem = re.sub(r"\b(torch\.)?(b?float|u?int|complex)\d*\b", "<dtype>", text.strip())
    return (failure.kind, failure.error_type, re.sub(r"\d+", "#", stem)[:200])
