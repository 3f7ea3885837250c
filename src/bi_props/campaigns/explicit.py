"""Explicit examples: cases known to matter, run before anything is drawn, like ``@example``.

Two kinds, per cell:

- **Known batch-variant cases** for the enabled ``batch_invariance`` and ``row_permutation``
  cells: every case on which the *stock* kernel (the switch off) was seen batch-variant in this
  run or an earlier one: the op's explicit control examples that varied (in each dtype tried),
  what a negative control's search found, and the hits of its power probe. A "batch-invariant"
  kernel as batch-variant as the stock one it replaced fails exactly there, whatever the luck of
  the draws. Each runs with its own data and once more with other data (``SEEDS``).
- **Every dtype of the contract** for ``parity`` (and every space dtype for ``reference``): one
  case of the op in each dtype the stock op may accept, so that a contract break in one dtype
  is never a matter of a 1-in-32 draw.

The known-variant cases live in the session (``Session.variants``) and in the example database
under ``variant_key(target, op)`` (the campaign's, or the pytest profile's), so that later runs
and Ray actors start with them. Below the session and the controls: its functions take the
session as an ``ExplicitSession``, what they use of it. Imports Hypothesis' database API only;
never torch.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

from ..model.case import DTYPES, PARITY_DTYPES, Batch, Case, Companion, case_size, parse_case
from ..model.op_registry import OPS
from ..model.property_spec import controls_of

if TYPE_CHECKING:
    from ..model.space import Space
    from ..model.verdict import Verdict
    from ..runner.controller import Runner
    from .records import Failure, Finding

VARIANT_PROPERTIES = ("batch_invariance", "row_permutation")
"""The enabled cells that run the known batch-variant cases first."""
SEEDS = 2
"""Each known-variant case runs with its own data and with ``SEEDS - 1`` other draws of it."""
MAX_VARIANTS = 12
"""Known-variant cases kept per op (the smallest first): enough to cover each dtype and layout
that varied, few enough that explicit examples stay a small part of a turn."""
RESEED = 0x2545F491
"""Step between the data seeds of an explicit case's copies."""
EXPLICIT_SEED = 20261202  # the explicit examples' tensors: fixed, so a reader can replay them


class ExplicitSession(Protocol):
    """What the explicit examples use of the session (``Session`` is one): its known-variant
    cases and example database, the explicit cases run and the dtype templates, the cell's
    strategy, and the calls that check a case and record its failure; and what
    ``shrink.shrink`` uses (``shrink.ShrinkSession``: ``target``, ``judge``, ``leak_message``,
    ``promise_message``), for the failures it shrinks."""

    target: str
    space: Space
    runner: Runner
    database: Any
    variants: dict[str, dict[str, Case]]
    explicit_done: dict[tuple, set]
    dtype_templates: dict[tuple, Case]
    explicit_examples: bool
    skip_settled: bool
    shrink_note: str
    defer_finalize: bool
    last_failure: Failure | None

    def entries(self, op: str) -> tuple[str, ...] | None: ...

    def strategy(self, op: str, prop: str) -> Any: ...

    def check(self, op: str, prop: str, switch: str, case: Case) -> str: ...

    def recorded(self, failure: Failure) -> bool: ...

    def same_failure(self, failure: Failure) -> Finding | None: ...

    def finalize(
        self, failure: Failure, shrink: str = "complete", confirm_kind: str | None = None
    ) -> None: ...

    def judge(self, op: str, prop: str, switch: str, case: Case) -> Verdict: ...

    def leak_message(self, op: str, prop: str, case: Case) -> str | None: ...

    def promise_message(self, op: str, evidence: str) -> str: ...


def variant_key(target: str, op: str) -> bytes:
    """The example-database key under which a target's known batch-variant cases of ``op`` are
    kept (each value the UTF-8 repr of a Case)."""
    return f"bi_props:variant:{target}:{op}".encode()


def add_variant(session: ExplicitSession, case: Case) -> bool:
    """Remember a case on which the stock kernel was batch-variant (the switch off); True when
    it is new. Kept in the session (the smallest ``MAX_VARIANTS`` per op) and saved in the
    session's example database."""
    if case.batch is None or case.op not in OPS:
        return False
    kept = session.variants.setdefault(case.op, {})
    text = repr(case)
    if text in kept:
        return False
    kept[text] = case
    database = session.database
    key = variant_key(session.target, case.op)
    if len(kept) > MAX_VARIANTS:
        largest = max(kept, key=lambda k: case_size(kept[k]))
        del kept[largest]
        if database is not None:
            try:
                database.delete(key, largest.encode())
            except Exception:
                pass
        if largest == text:
            return False
    if database is not None:
        try:
            database.save(key, text.encode())
        except Exception:  # a read-only or full database never costs the finding itself
            pass
    return True


def load_variants(session: ExplicitSession, ops: tuple[str, ...]) -> int:
    """The known-variant cases of earlier runs, from the session's example database; returns
    how many were loaded. Entries that no longer parse (an older Case) are dropped."""
    database = session.database
    if database is None:
        return 0
    loaded = 0
    for op in ops:
        key = variant_key(session.target, op)
        try:
            values = list(database.fetch(key))
        except Exception:
            continue
        for value in values:
            try:
                case = parse_case(value.decode())
            except (ValueError, UnicodeDecodeError, TypeError):
                try:
                    database.delete(key, value)
                except Exception:
                    pass
                continue
            if case.op == op and case.batch is not None:
                kept = session.variants.setdefault(op, {})
                if repr(case) not in kept:
                    kept[repr(case)] = case
                    loaded += 1
        kept = session.variants.get(op, {})
        while len(kept) > MAX_VARIANTS:  # the smallest are kept
            del kept[max(kept, key=lambda k: case_size(kept[k]))]
            loaded -= 1
    return loaded


def variants(session: ExplicitSession, op: str) -> tuple[Case, ...]:
    """The known batch-variant cases of ``op``, smallest first."""
    return tuple(sorted(session.variants.get(op, {}).values(), key=case_size))


def structure(case: Case) -> tuple:
    """What a neighbour of a known case keeps of it (``strategies.near``): op, entry, shape,
    layouts, options and the companions' rows."""
    rows = tuple(c.rows for c in case.batch.companions) if case.batch is not None else None
    return (case.op, case.entry, case.shape, case.layouts, case.options, rows, case.padded)


def near_known(session: ExplicitSession, case: Case) -> bool:
    """Whether ``case`` has the structure of a known batch-variant case: drawn as its
    neighbour, so Hypothesis' own shrink could only move its data, place and dtype."""
    mine = structure(case)
    return any(structure(k) == mine for k in variants(session, case.op))


def reseeded(case: Case, step: int) -> Case:
    """The same case with other data: the needle's and each companion's seed moved by
    ``step`` x ``RESEED`` (0: the case itself)."""
    if step == 0:
        return case
    shift = step * RESEED

    def move(seed: int) -> int:
        return (seed + shift) % 2**32

    batch = case.batch
    if batch is not None:
        companions = tuple(replace(c, seed=move(c.seed)) for c in batch.companions)
        batch = Batch(batch.position, companions)
    return replace(case, seed=move(case.seed), batch=batch, options=dict(case.options))


def for_entry(session: ExplicitSession, case: Case) -> Case | None:
    """The case with an entry point the session's target offers for its op (a target may
    replace the op's entries); None where the op has none."""
    entries = session.entries(case.op) or OPS[case.op].entries
    if not entries:
        return None
    if case.entry in entries:
        return case
    return replace(case, entry=entries[0], options=dict(case.options))


def dtype_cases(session: ExplicitSession, op: str, prop: str, template: Case) -> list[Case]:
    """``template`` in each dtype the cell checks up front: every space dtype for reference,
    and the stock op's possible dtypes (the space's and its parity dtypes) for parity."""
    space = session.space
    dtypes = list(space.dtypes)
    if prop == "parity":
        dtypes += [d for d in space.parity_dtypes if d not in dtypes]
    known = (*DTYPES, *PARITY_DTYPES)
    return [
        replace(template, dtype=d, options=dict(template.options))
        for d in dtypes
        if d in known and d != template.dtype
    ]


def has_explicit(op: str, prop: str, switch: str) -> bool:
    """Whether a cell can have explicit cases: an enabled batch-comparing cell of an op whose
    stock kernel can vary (it has a negative control), or a parity or reference cell."""
    if prop in VARIANT_PROPERTIES:
        return switch == "enabled" and bool(controls_of(OPS[op]))
    return prop in ("parity", "reference")


def pending(session: ExplicitSession, op: str, prop: str, switch: str) -> list[Case]:
    """The explicit cases of one cell that have not run yet in this session."""
    done = session.explicit_done.setdefault((op, prop, switch), set())
    out: list[Case] = []
    if prop in VARIANT_PROPERTIES and switch == "enabled":
        from .modes import each_mode

        most = max(0, session.space.known_cases // SEEDS)  # the smallest known cases first
        for known in variants(session, op)[:most]:
            for case in each_mode(session, known):  # compiled too, where the run draws both
                for step in range(SEEDS):
                    ready = for_entry(session, reseeded(case, step))
                    if ready is not None:
                        out.append(ready)
    template = session.dtype_templates.get((op, prop, switch))
    if prop in ("parity", "reference") and template is None and session.explicit_examples:
        template = template_for(session, op, prop, switch)
    if template is not None and prop in ("parity", "reference"):
        out += dtype_cases(session, op, prop, template)
    return [c for c in out if repr(c) not in done]


def mark_done(session: ExplicitSession, op: str, prop: str, switch: str, case: Case) -> None:
    session.explicit_done.setdefault((op, prop, switch), set()).add(repr(case))


def _passes_again(session: ExplicitSession, failure) -> bool:
    """Whether the very case of ``failure`` passes when judged once more in the same worker
    (failing differently, a crash then a timeout under load, is no evidence of a flaky one)."""
    from ..runner.controller import WorkerFailure

    try:
        return session.judge(failure.op, failure.prop, failure.switch, failure.case).ok
    except WorkerFailure:
        return False


__all__ = [
    "MAX_VARIANTS",
    "SEEDS",
    "VARIANT_PROPERTIES",
    "add_variant",
    "dtype_cases",
    "explicit_cases",
    "for_entry",
    "has_explicit",
    "load_variants",
    "mark_done",
    "near_known",
    "pending",
    "reseeded",
    "run_cases",
    "run_explicit",
    "structure",
    "variant_key",
    "variants",
]


EXPLICIT_NOTE = (
    "not shrunk: an explicit example (a case known to matter: stock batch-variant there, or a "
    "dtype of the contract), small by construction"
)


def explicit_cases(session: ExplicitSession, op: str) -> list[Case]:
    """The op's ``control_examples`` as cases: float32, general values, the example's layouts
    (contiguous when it names none), the session's first entry point of the op."""
    spec = OPS[op]
    entry = (session.entries(op) or spec.entries)[0]
    out = []
    for i, example in enumerate(spec.control_examples):
        seed = EXPLICIT_SEED + 100 * i + example.seed
        case = Case(op, entry, "float32", tuple(example.shape), (), "general", seed)
        case = replace(case, options=dict(example.options))
        layouts = example.layouts or ("contiguous",) * len(spec.operands(case))
        case = replace(case, layouts=tuple(layouts))  # counts checked at registration
        companions = tuple(Companion(seed + 1 + j, r) for j, r in enumerate(example.companions))
        position = min(example.position, len(companions))
        out.append(case.with_batch(Batch(position=position, companions=companions)))
    return out


def template_for(session: ExplicitSession, op: str, prop: str, switch: str) -> Case | None:
    """The case a cell's dtype examples are made from: the op's first explicit control example
    without its batch (its data, before any draw), else the first case the cell judged."""
    key = (op, prop, switch)
    if key not in session.dtype_templates and OPS[op].control_examples:
        first = explicit_cases(session, op)[0].with_batch(None)
        session.dtype_templates[key] = first
    if key not in session.dtype_templates:
        session.dtype_templates[key] = _simplest(session, op, prop)
    return session.dtype_templates.get(key)


def _simplest(session: ExplicitSession, op: str, prop: str) -> Case | None:
    """The simplest case of the cell's strategy with no zero extent (Hypothesis' ``find``: no
    worker runs, nothing is judged), as a template where the op states no example of its own."""
    case = _simplest_of(session.strategy(op, prop))
    return None if case is None else case.with_batch(None)


def _simplest_of(strategy) -> Case | None:
    """The simplest case of ``strategy`` with no zero extent and no special values."""
    from random import Random

    from hypothesis import HealthCheck, Phase, find, settings
    from hypothesis.errors import NoSuchExample, Unsatisfiable

    quiet = settings(
        database=None,
        max_examples=200,
        phases=[Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck),
        deadline=None,
    )
    try:
        return find(
            strategy,
            lambda c: all(extent > 0 for extent in c.shape) and c.values != "special",
            settings=quiet,
            random=Random(0),
        )
    except (NoSuchExample, Unsatisfiable):
        return None


def generated(strategy, draws: int, seed: int, enough=lambda drawn: False) -> list[Case]:
    """Up to ``draws`` cases of ``strategy`` as Hypothesis generates them (fixed ``seed``, no
    shrinking, no database), stopping once ``enough(drawn so far)``: the drawn explicit
    examples (deployment_example.py, small_cover.py) are the same in every run of a space."""
    from random import Random

    from hypothesis import HealthCheck, Phase, find, settings
    from hypothesis.errors import NoSuchExample, Unsatisfiable

    quiet = settings(
        database=None,
        max_examples=draws,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
        deadline=None,
    )
    drawn: list[Case] = []

    def keep(case: Case) -> bool:
        drawn.append(case)
        return enough(drawn)

    try:
        find(strategy, keep, settings=quiet, random=Random(seed))
    except (NoSuchExample, Unsatisfiable):
        pass
    return drawn


def run_explicit(
    session: ExplicitSession,
    op: str,
    prop: str,
    switch: str,
    stop_at: float | None = None,
    shrink_end: float | None = None,
) -> tuple[int, list]:
    """Run the cell's pending explicit cases (``pending``); return (examples judged, the
    failures of signatures not settled before: each shrunk by Hypothesis from the explicit case
    (until ``shrink_end``), recorded as a finding and confirmed in a fresh worker). A settled
    signature met again is skipped (counted), as in a turn. No case starts after ``stop_at``
    once one has run."""
    if prop in ("parity", "reference"):
        template_for(session, op, prop, switch)
    cases = pending(session, op, prop, switch)

    def done(case: Case) -> None:
        mark_done(session, op, prop, switch, case)

    return run_cases(session, op, prop, switch, cases, EXPLICIT_NOTE, done, stop_at, shrink_end)


def run_cases(
    session: ExplicitSession,
    op: str,
    prop: str,
    switch: str,
    cases: list[Case],
    note: str,
    done: Any,
    stop_at: float | None = None,
    shrink_end: float | None = None,
    first_failure_ends: bool = False,
) -> tuple[int, list]:
    """Check ``cases`` in one cell as explicit examples (``note``: the session's
    ``shrink_note`` meanwhile; ``done(case)`` before each runs); see ``run_explicit``.
    ``first_failure_ends``: the first failing case ends the run, as a failure ends a turn's
    search (the cell's later turns explore for other classes)."""
    import time

    from ..runner.controller import DeadlineReached

    judged, new = 0, []
    saved = session.skip_settled, session.shrink_note, session.defer_finalize
    session.skip_settled, session.shrink_note = True, note
    try:
        for case in cases:
            if judged and stop_at is not None and time.monotonic() >= stop_at:
                break
            done(case)
            session.last_failure = None
            session.defer_finalize = True
            try:
                session.check(op, prop, switch, case)
            except DeadlineReached:
                break
            except Exception:  # a new failure: shrunk by Hypothesis, then recorded
                failure = session.last_failure
                if failure is not None and not session.recorded(failure):
                    session.defer_finalize = False
                    _record_shrunk(session, failure, shrink_end, note)
                    new.append(failure)
                if first_failure_ends:
                    judged += 1
                    break
            judged += 1
    finally:
        session.skip_settled, session.shrink_note, session.defer_finalize = saved
    return judged, new


def _record_shrunk(
    session: ExplicitSession, failure, stop_at: float | None, note: str = EXPLICIT_NOTE
) -> None:
    """Shrink an explicit example's failure (campaigns/shrink.py) and record it; ``note``: the
    session's ``shrink_note`` to put back."""
    from .records import FLAKY_SHRINK, as_flaky
    from .shrink import NOT_REPLAYED, shrink

    if session.same_failure(failure) is not None:  # its root cause is shrunk already
        session.shrink_note = ""
        try:
            session.finalize(failure)
        finally:
            session.shrink_note = note
        return
    shrunk, how = shrink(session, failure, stop_at)  # judges candidates, records nothing
    session.shrink_note = ""
    try:
        if NOT_REPLAYED in how and _passes_again(session, failure):  # nondeterminism
            session.finalize(as_flaky(failure), shrink=FLAKY_SHRINK, confirm_kind=failure.kind)
        else:
            session.finalize(shrunk, shrink=how)
    finally:
        session.shrink_note = note
