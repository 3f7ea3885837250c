"""The negative controls: a search for batch variance with the switch off, in turns.

Also the helpers the search shares with the session and the fuzz slice (``is_final_replay``,
``internal_message``); ``bi_props.campaigns.session`` re-exports them. Below the session: its
functions take the session as a ``ControlSession``, what they use of it.
Imports Hypothesis but never torch, like the session.
"""

from __future__ import annotations

import time
import traceback
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from hypothesis.control import current_build_context

from ..model import property_spec
from ..model.case import Batch, Case, Companion, case_size
from ..model.op_registry import OPS
from ..runner.controller import DeadlineReached, WorkerFailure
from .explicit import ExplicitSession, _simplest_of, add_variant, explicit_cases

if TYPE_CHECKING:
    from ..runner.controller import Runner


@dataclass
class Control:
    """What a negative control (a control property with the switch off) saw for one op."""

    op: str
    property: str
    variance_seen: bool
    case: str | None
    message: str
    examples: int = 0  # searched (no variance yet); shrink replays are not counted
    # "not run", "searching" (examples left, no variance yet), "shrinking" (variance seen, the
    # shrink was cut: a later turn continues it), or "done".
    state: str = "done"
    shrink: str = "complete"
    explicit: int = 0  # the op's explicit control examples tried (counted in ``examples``)
    judged: int = 0  # examples that compared something and saw no variance: the evidence
    # False when the whole quota, explicit examples included, was searched where reduction order
    # shows and found nothing: the stock kernel is invariant here, evidence not a list; None
    # while undecided (seen, or searching).
    applicable: bool | None = None
    # The power probe: draws of the enabled cell's own strategy run with the switch off
    # (``power_examples`` of the space), those that compared something (not degenerate, not
    # order-blind), and those on which the stock kernel was batch-variant: p = hits / judged is
    # the chance that one of the enabled cell's examples catches a kernel as variant as stock.
    power_draws: int = 0
    power_judged: int = 0
    power_hits: int = 0
    # Cases on which the stock kernel varied, kept as known-variant cases (campaigns/explicit.py).
    variant_cases: int = 0
    # Targeted probes run before "not applicable" (``targeted_probes``), and those judged.
    targeted: int = 0
    targeted_judged: int = 0

    @property
    def searching(self) -> bool:
        """Still looking: no variance seen yet, or its power probe has draws left (the
        scheduler gives such controls their turns before those that only shrink)."""
        return self.state != "done" and (not self.variance_seen or self.state == "probing")

    @property
    def probing(self) -> bool:
        """The power probe has draws left (the control is not done while it has)."""
        return self.state == "probing"

    @property
    def hit_rate(self) -> float | None:
        """p, the stock kernel's batch-variance rate on the enabled cell's own draws."""
        return self.power_hits / self.power_judged if self.power_judged else None


class ControlSession(ExplicitSession, Protocol):
    """What a negative control uses of the session (``Session`` is one): its controls, its
    runner, the control strategy, its report and internal errors; and what ``ExplicitSession``
    lists, for the known batch-variant cases a control adds."""

    controls: list[Control]
    runner: Runner

    def control_strategy(self, op: str, prop: str) -> Any: ...

    def internal(self, message: str) -> None: ...

    def write_report(self) -> None: ...


def internal_message(exc: BaseException) -> str:
    """What a finding of kind ``internal`` says: a bug of bi_props, with its traceback."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip()
    return (
        f"bi_props itself failed ({type(exc).__name__}: {exc}); this is a bug of bi_props, not "
        f"a finding about the target. Please report it with this traceback:\n{text}"
    )


def is_final_replay() -> bool:
    try:
        return bool(current_build_context().is_final)
    except Exception:  # outside a Hypothesis test (e.g. a direct call): treat as final
        return True


def _dtypes_first_float32(session: ControlSession) -> tuple[str, ...]:
    dtypes = tuple(session.space.dtypes)
    return tuple(sorted(dtypes, key=lambda d: d != "float32"))


def _saw_variance(
    session: ControlSession, control: Control, case: Case, message: str, how: str
) -> None:
    """A case on which the stock kernel varied: a known-variant case for the enabled cells
    (campaigns/explicit.py), and the control's case when it is the first or a smaller one."""
    case = session.runner.settle(case)  # kept in the mode it ran in (Case.mode)
    control.variant_cases += add_variant(session, case)
    if control.variance_seen and control.case is not None:
        from ..model.case import parse_case

        if case_size(parse_case(control.case))[:3] <= case_size(case)[:3]:
            return  # no smaller (elements, extents, companions): the first seen stays
    control.variance_seen = True
    control.case = repr(case)
    control.message = message
    control.shrink = how


def _try_explicit(session: ControlSession, control: Control, prop: str, judge) -> list[str]:
    """Run the op's explicit control examples once, before any search, in each dtype of the
    space (float32 first): every one that shows variance becomes a known-variant case for the
    enabled cells, and the smallest is the control's case (small by construction: no shrink).
    Returns worker errors. An error of bi_props itself ends the control as an internal error,
    as in the search."""
    errors: list[str] = []
    for example in explicit_cases(session, control.op):
        for dtype in _dtypes_first_float32(session):
            case = replace(example, dtype=dtype, options=dict(example.options))
            control.explicit += 1
            control.examples += 1
            try:
                verdict = judge(session.runner.observe(prop, case, "disabled"))
            except DeadlineReached:
                return errors
            except WorkerFailure as exc:
                errors.append(str(exc).splitlines()[0])
                continue
            except Exception as exc:  # an InternalError or a judge's bug: ours, never silent
                text = internal_message(exc)
                session.internal(f"negative control {control.op} {prop} [disabled]: {text}")
                control.state = "done"
                control.shrink = "not started"
                control.message = (
                    f"INTERNAL ERROR after {control.examples} example(s): {text.splitlines()[0]}"
                )
                return errors
            if _varies(verdict):
                how = "not needed: an explicit control example of the op (its data)"
                _saw_variance(session, control, case, verdict.message, how)
            elif not _refused(verdict):
                control.judged += not verdict.degenerate
    return errors


def _varies(verdict) -> bool:
    """A stock kernel's batch variance: the needle's values differ alone and in the batch (a
    mismatch). A call that raised on one side only (vLLM refusing a batch longer than its model)
    is a refusal, not a differing result: no evidence that the control can see variance."""
    return not verdict.ok and verdict.kind == "mismatch"


def _refused(verdict) -> bool:
    """A failure that is no comparison (one side raised): neither variance nor a judged
    example."""
    return not verdict.ok and not _varies(verdict)


def _order_blind(case: Case) -> bool:
    return case.values == "exact"


def _probe(
    session: ControlSession,
    control: Control,
    prop: str,
    judge,
    stop_at: float | None,
    seed: int | None,
) -> list[str]:
    """The power probe: draws of the enabled cell's own strategy (``Session.strategy``, the
    known-variant neighbours included) run with the switch off, counted: p = hits / judged is
    how likely one enabled example is to catch a kernel as batch-variant as stock. Every hit
    is a known-variant case. Resumes over turns until ``power_examples`` draws ran; no draw
    starts after ``stop_at`` once one has run. Returns worker errors."""
    left = session.space.power_examples - control.power_draws
    if left <= 0:
        return []
    strategy = session.strategy(control.op, prop)
    errors: list[str] = []
    ran = 0

    class _Stop(KeyboardInterrupt):
        pass

    profile = settings()

    @settings(
        profile,
        max_examples=left,
        database=None,  # a probe saves nothing: it measures, it does not search
        deadline=None,
        derandomize=profile.derandomize if seed is None else False,
        print_blob=False,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.generate],
    )
    @given(data=st.data())
    def probe(data):
        nonlocal ran
        case = data.draw(strategy, label="case")
        if ran and stop_at is not None and time.monotonic() >= stop_at:
            raise _Stop()
        try:
            verdict = judge(session.runner.observe(prop, case, "disabled"))
        except DeadlineReached:
            raise _Stop() from None
        except WorkerFailure as exc:
            errors.append(str(exc).splitlines()[0])
            ran += 1
            control.power_draws += 1
            return
        ran += 1
        control.power_draws += 1
        if (verdict.ok and verdict.degenerate) or _order_blind(case) or _refused(verdict):
            return
        control.power_judged += 1
        if _varies(verdict):
            control.power_hits += 1
            how = "not needed: a hit of the power probe (the enabled cell's own strategy)"
            _saw_variance(session, control, case, verdict.message, how)

    if seed is not None:
        probe = hypothesis_seed(seed)(probe)
    key = f"bi_props:probe:{session.target}:{control.op}:{prop}".encode()
    probe.hypothesis.inner_test._hypothesis_internal_add_digest = key
    try:
        probe()
    except _Stop:
        pass
    return errors


def power_line(control: Control) -> str:
    """The probe's measurement in words: "p = 12/30 (0.40)"."""
    if not control.power_judged:
        return "p not measured"
    return f"p = {control.power_hits}/{control.power_judged} ({control.hit_rate:.2f})"


def control_entry(session: ControlSession, op: str, prop: str) -> Control:
    """The control of (op, prop) in the session, added ("not run") on first use."""
    for control in session.controls:
        if (control.op, control.property) == (op, prop):
            return control
    control = Control(op, prop, False, None, "not run", state="not run", shrink="not started")
    session.controls.append(control)
    return control


def run_control(
    session: ControlSession,
    op: str,
    prop: str = "batch_invariance",
    *,
    examples: int | None = None,
    stop_at: float | None = None,
    seed: int | None = None,
    database=None,
    shrink: bool = True,
) -> Control:
    """One turn of a negative control: search for batch variance with the switch off, and
    shrink what shows it toward the smallest case.

    Never a failure: it shows that the test can see variance at all (stock kernels are not
    promised to be invariant). Its budget, ``[runner] control_examples`` of the space, is
    spent over turns of up to ``examples`` examples (all of it when None); the search stops
    at the first variance. ``stop_at`` (``time.monotonic()``) bounds the turn: no example
    starts after it (the first always runs), so a shrink in flight stops there with the
    smallest case seen by ``case_size``, and a later turn continues it from the example
    database (``database``: the campaign's; without one, the cut shrink is final). With
    ``shrink`` False the turn ends at its first variance (saved in the example database; a
    later turn shrinks it): the campaign's scheduler leaves the time to the controls still
    searching. The control's ``state`` says where it stands: searching, shrinking, or done."""
    control = control_entry(session, op, prop)
    if control.state == "done":
        return control
    judge = property_spec.get(prop).judge
    errors: list[str] = []
    if control.explicit == 0 and control.examples == 0 and OPS[op].control_examples:
        errors += _try_explicit(session, control, prop, judge)
        if control.state == "done":  # an internal error
            session.write_report()
            return control
        if stop_at is not None and session.space.power_examples:  # a turn of a campaign: the
            # explicit examples alone, so every control's known cases are out early
            control.state = "probing"
            control.message = "explicit examples tried; the power probe comes next"
            session.write_report()
            return control
    if control.power_draws < session.space.power_examples:
        errors += _probe(session, control, prop, judge, stop_at, seed)
        if control.power_draws < session.space.power_examples:
            control.state = "probing"
            control.message = (
                f"power probe: {control.power_draws} of {session.space.power_examples} draws"
                f" of the enabled cell's strategy run with the switch off"
            )
            session.write_report()
            return control
    if control.variance_seen and control.state != "shrinking":
        control.state = "done"
        session.write_report()
        return control
    strategy = session.control_strategy(op, prop)
    left = session.space.control_examples - control.examples
    if left <= 0:
        return _settle(session, control, prop, errors)
    count = 0
    internal: list[str] = []  # errors of bi_props itself: an internal error of the run
    searched: list[int] = []
    variants: list[tuple[Case, str]] = []  # every variant case seen, in order
    started = time.monotonic()

    class _Variant(AssertionError):
        pass

    class _Stop(KeyboardInterrupt):  # Hypothesis stops at once, saves nothing as a failure
        pass

    profile = settings()  # the current profile (pytest's, or the campaign's)
    database = database if database is not None else profile.database

    @settings(
        profile,
        max_examples=max(1, left if examples is None else min(examples, left)),
        database=database,
        deadline=None,  # a first example may start a worker; timing belongs to benchmarks
        derandomize=profile.derandomize if seed is None else False,
        print_blob=False,
        suppress_health_check=list(HealthCheck),
        phases=[phase for phase in Phase if phase != Phase.explain],
    )
    @given(data=st.data())
    def search(data):
        nonlocal count, stop_at
        case = data.draw(strategy, label="case")
        past_end = count and stop_at is not None and time.monotonic() >= stop_at
        if past_end and not is_final_replay():
            raise _Stop()
        count += 1
        try:
            verdict = judge(session.runner.observe(prop, case, "disabled"))
        except DeadlineReached:
            raise _Stop() from None
        except WorkerFailure as exc:  # the disabled cells report it; here it is no variance
            errors.append(str(exc).splitlines()[0])
            return
        except Exception as exc:  # InternalError from a worker, or a judge's bug: ours
            internal.append(internal_message(exc))
            raise _Stop() from None
        if _varies(verdict):
            if not variants:
                searched.append(count)  # examples until the first variance
                if not shrink:  # no shrink in this turn: it ends at the next example
                    stop_at = time.monotonic()
            variants.append((case, verdict.message))
            raise _Variant()
        control.judged += not verdict.degenerate and not _refused(verdict)

    key = f"bi_props:control:{session.target}:{op}:{prop}".encode()
    search.hypothesis.inner_test._hypothesis_internal_add_digest = key
    search._hypothesis_internal_database_key = key
    if seed is not None:
        search = hypothesis_seed(seed)(search)
        search._hypothesis_internal_use_settings = settings(
            search._hypothesis_internal_use_settings, database=database
        )
    complete = False
    try:
        search()
    except _Stop:
        pass
    except Exception as exc:  # the variance, shrunk (Hypothesis' last replay is minimal)
        complete = bool(variants)
        if not variants:  # no variance raised it: an error of bi_props (or Hypothesis')
            internal.append(internal_message(exc))
    if internal:  # never a silent "searching": the run's internal errors and exit status 3
        where = f"negative control {op} {prop} [disabled]"
        session.internal(f"{where}: {internal[0]}")
        first = internal[0].splitlines()[0]
        if not control.variance_seen:
            control.examples += count
            control.state = "done"
            control.shrink = "not started"
            control.message = f"INTERNAL ERROR after {control.examples} example(s): {first}"
            session.write_report()
            return control
    if not control.variance_seen:
        control.examples += searched[0] if searched else count
    if variants:
        if complete:
            case, message = variants[-1]
            shrink = "complete"
        else:
            case, message = min(variants, key=lambda v: case_size(v[0]))
            spent = time.monotonic() - started
            shrink = f"cut after {spent:.1f} s of this turn: the smallest case seen" + (
                "" if database is not None else " (final: no example database to resume)"
            )
        control.variant_cases += add_variant(session, case)
        control.variance_seen = True
        control.case = repr(case)
        control.message = message
        control.shrink = shrink
        control.state = "done" if complete or database is None else "shrinking"
    elif control.variance_seen:  # a shrinking control whose saved case no longer varies
        control.state = "done"
    elif control.examples >= session.space.control_examples:
        return _settle(session, control, prop, errors)
    else:
        control.state = "searching"
        control.shrink = "not started"
        control.message = (
            f"no {prop} violation seen yet in {control.examples} of "
            f"{session.space.control_examples} examples"
        )
    if errors:
        control.message += f" ({len(errors)} example(s) failed in the worker: {errors[0]})"
    session.write_report()
    return control


PROBE_COMPANIONS = (15, 16, 255)
"""Targeted probes: a 1-row needle beside a companion of each of these rows (a vector or tile
edge, and past a typical row threshold)."""
PROBE_WIDTHS = (7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65)
"""Targeted probes: last dimensions at vector tails +- 1 (8, 16, 32 and 64 lanes)."""
PROBE_LAYOUTS = ("contiguous", "transposed")


def targeted_probes(session: ControlSession, op: str, prop: str) -> list[Case]:
    """Where stock kernels are known to vary, built from the control strategy's simplest case
    (every extent >= 2): a 1-row needle beside 15, 16 and 255 rows, its last dimension at each
    vector tail +- 1, all operands contiguous or all transposed. Some may not suit the op (a
    width it refuses): those fail in the worker and are counted apart, never as evidence."""
    base = _simplest_of(session.control_strategy(op, prop))
    if base is None or not base.shape:
        return []
    out = []
    for layout in PROBE_LAYOUTS:
        for rows in PROBE_COMPANIONS:
            for width in PROBE_WIDTHS:
                shape = (1, *base.shape[1:-1], width) if len(base.shape) > 1 else (1,)
                case = replace(
                    base,
                    shape=shape,
                    layouts=(layout,) * len(base.layouts),
                    options=dict(base.options),
                    batch=Batch(0, (Companion(base.seed + 1, rows),)),
                )
                out.append(case)
    return out


def _try_targeted(session: ControlSession, control: Control, prop: str, judge) -> list[str]:
    """Run the targeted probes once (``targeted_probes``); a variant one is the control's case
    and a known-variant case. Returns worker errors."""
    errors: list[str] = []
    for case in targeted_probes(session, control.op, prop):
        control.targeted += 1
        try:
            verdict = judge(session.runner.observe(prop, case, "disabled"))
        except DeadlineReached:
            break
        except WorkerFailure as exc:
            errors.append(str(exc).splitlines()[0])
            continue
        except Exception:  # a probe the op cannot take (a width it refuses): not evidence
            continue
        if _varies(verdict):
            how = "not needed: a targeted probe (1-row needle, vector-tail width)"
            _saw_variance(session, control, case, verdict.message, how)
        elif not verdict.degenerate and not _refused(verdict):
            control.targeted_judged += 1
    return errors


def _settle(session: ControlSession, control: Control, prop: str, errors: list[str]) -> Control:
    """A control that spent its whole quota without variance: first the targeted probes
    (``targeted_probes``); then not applicable, by that evidence, worded with how much was
    judged and the bound it gives (no hit in n judged: p < 3/n at 95%, the rule of three);
    blind when no example compared anything (all degenerate or failed in the worker)."""
    if not control.targeted:
        judge = property_spec.get(prop).judge
        errors = errors + _try_targeted(session, control, prop, judge)
        if control.variance_seen:
            control.state = "done"
            session.write_report()
            return control
    control.state = "done"
    control.shrink = "not needed"
    if not control.judged and not control.targeted_judged and not control.power_judged:
        control.message = (
            f"no {prop} example of {control.examples} compared anything (each degenerate or "
            "failed in the worker): blind, not evidence that stock is invariant"
        )
        if errors:
            control.message += f" ({len(errors)} failed in the worker: {errors[0]})"
        session.write_report()
        return control
    control.applicable = False
    explicit = (
        f", {control.explicit} of them the op's explicit examples" if control.explicit else ""
    )
    total = control.judged + control.targeted_judged + control.power_judged
    control.message = (
        f"stock kernel invariant here: control not applicable (no {prop} violation in {total} "
        f"judged examples: {control.judged} of {control.examples} drawn where reduction order "
        f"can show (every extent >= 2, general or wide values{explicit}), "
        f"{control.power_judged} of the enabled cell's own strategy, {control.targeted_judged} "
        f"targeted probes (a 1-row needle beside 15, 16 and 255 rows, widths at vector tails "
        f"+-1, contiguous and transposed); so the stock hit rate p < {3 / total:.3f} at 95%)"
    )
    if errors:
        control.message += f" ({len(errors)} example(s) failed in the worker: {errors[0]})"
    session.write_report()
    return control
