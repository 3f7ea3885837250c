"""The building blocks of `bi-props fuzz`: cells and one time-boxed slice of a cell.

A cell is (op, property, switch state); a slice runs up to ``SLICE_EXAMPLES`` examples of it as one
Hypothesis run with its own seed and the campaign's example database (stable key per cell, so past
failures replay first). A failing slice is shrunk, confirmed in a fresh worker and recorded by the
session, and retires the cell. campaign.py (local) and ray_runner.py (Ray actors) drive them.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from .catalogue import cells
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


class Interrupted(BaseException):
    """SIGTERM. A BaseException, like KeyboardInterrupt: Hypothesis must not take it for a failure
    of the example that was running (it would shrink it, call it flaky, and retire the cell)."""


def _on_sigterm(signum, frame):  # pragma: no cover - exercised through a subprocess test
    raise Interrupted()


def database_key(target: str, op: str, prop: str, switch: str) -> bytes:
    """The example-database key of one cell (stable across bi_props versions and processes)."""
    return f"bi_props:fuzz:{target}:{op}:{prop}:{switch}".encode()


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
        # no explain phase: it replays the failure many times (a crash: a worker restart each)
        phases=[phase for phase in Phase if phase != Phase.explain],
    )
    @given(data=st.data())
    def slice_test(data):
        nonlocal count
        count += 1
        case = data.draw(strategy, label="case")
        session.check(cell.op, cell.prop, cell.switch, case)

    key = database_key(session.target, cell.op, cell.prop, cell.switch)
    slice_test.hypothesis.inner_test._hypothesis_internal_add_digest = key
    # The database key is the cell's name, not a digest of this function's source: past failures
    # replay first in every later run (and campaign), whatever edits this file sees.
    slice_test._hypothesis_internal_database_key = key
    if seed is not None:  # a campaign's derived seed: this turn's randomness is reproducible
        slice_test = hypothesis_seed(seed)(slice_test)
        # @seed also switches the example database off (Settings(database=None)); a campaign
        # needs both, so the database is put back.
        slice_test._hypothesis_internal_use_settings = settings(
            slice_test._hypothesis_internal_use_settings, database=database
        )
    try:
        slice_test()
    except InternalError:
        raise
    except Exception:  # a finding (PropertyFailed, WorkerFailure, or several at once)
        cell.done = True
    return count
