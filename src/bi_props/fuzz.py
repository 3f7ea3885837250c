"""`bi-props fuzz`: every property for every op on a target, both switch states, within a budget.

The budget is spread fairly: cells (op x property x switch) take turns in short slices of examples,
each slice a Hypothesis run with fresh randomness and the example database under ``--out``. A cell
that fails is shrunk, confirmed in a fresh worker, recorded (and the report rewritten at once), and
retired. Negative controls run first, one per op. Ctrl-C or SIGTERM still writes the report.
"""

from __future__ import annotations

import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.database import DirectoryBasedExampleDatabase

from .catalogue import cells, controls
from .runner.controller import InternalError
from .session import Session
from .space import Space

SLICE_EXAMPLES = 10


@dataclass
class Cell:
    op: str
    prop: str
    switch: str
    examples: int = 0
    done: bool = False

    @property
    def name(self) -> str:
        return f"{self.op} {self.prop} [{self.switch}]"


def cells_for(space: Space) -> list[Cell]:
    return [Cell(op, prop, switch) for op, prop, switch in cells(space.ops)]


class Interrupted(Exception):
    pass


def _on_sigterm(signum, frame):  # pragma: no cover - exercised through a subprocess test
    raise Interrupted()


def run_slice(session: Session, cell: Cell, examples: int, database, seed: int | None) -> int:
    """Run up to ``examples`` examples of one cell; return how many ran. Failures are recorded by
    the session on Hypothesis' final replay and retire the cell."""
    count = 0
    strategy = session.strategy(cell.op, cell.prop)

    @settings(
        max_examples=examples,
        database=database,
        deadline=None,
        derandomize=False,
        print_blob=False,
        suppress_health_check=list(HealthCheck),
    )
    @given(data=st.data())
    def slice_test(data):
        nonlocal count
        count += 1
        case = data.draw(strategy, label="case")
        session.check(cell.op, cell.prop, cell.switch, case)

    slice_test.hypothesis.inner_test._hypothesis_internal_add_digest = (
        f"bi_props:fuzz:{session.target}:{cell.op}:{cell.prop}:{cell.switch}".encode()
    )
    try:
        slice_test()
    except InternalError:
        raise
    except Exception:  # a finding (PropertyFailed, WorkerFailure, or several at once)
        cell.done = True
    return count


def fuzz(
    session: Session, budget_s: float, out: Path, log: TextIO = sys.stderr, seed: int | None = None
) -> int:
    """Run the campaign; return the exit status (0 clean, 1 findings, 130 interrupted)."""
    out.mkdir(parents=True, exist_ok=True)
    session.report_path = out / "report.json"
    database = DirectoryBasedExampleDatabase(str(out / "examples"))
    start = time.monotonic()
    deadline = start + budget_s
    cells = cells_for(session.space)
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    interrupted = False

    def progress(what: str) -> None:
        elapsed = time.monotonic() - start
        rate = session.runner.examples / elapsed if elapsed else 0.0
        print(
            f"[{elapsed:7.1f}s/{budget_s:.0f}s] {session.runner.examples:6d} examples "
            f"({rate:6.1f}/s), {len(session.findings)} findings | {what}",
            file=log,
            flush=True,
        )

    try:
        hello = session.hello("disabled")
        if hello.status != "ready":
            print(
                f"bi-props: target {session.target!r} is {hello.status}:\n{hello.message}", file=log
            )
            return 2
        for op, prop in controls(session.space.ops):
            if time.monotonic() >= deadline:
                break
            control = session.control(op, prop)
            seen = "variance seen" if control.variance_seen else "none seen"
            progress(f"control {op} {prop}: {seen}")
        while time.monotonic() < deadline:
            live = [c for c in cells if not c.done]
            if not live:
                break
            for cell in sorted(live, key=lambda c: c.examples):
                if time.monotonic() >= deadline:
                    break
                cell.examples += run_slice(session, cell, SLICE_EXAMPLES, database, seed)
                progress(
                    f"{cell.name}: {cell.examples} examples" + (" -> FINDING" if cell.done else "")
                )
    except (KeyboardInterrupt, Interrupted):
        interrupted = True
        progress("interrupted: writing the report")
    finally:
        signal.signal(signal.SIGTERM, previous)
        session.close()
    print(f"bi-props: report written to {session.report_path}", file=log)
    if session.findings:
        return 1
    return 130 if interrupted else 0
