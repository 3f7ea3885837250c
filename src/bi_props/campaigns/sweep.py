"""The exhaustive 16-bit sweep: every bf16 and fp16 bit pattern through an elementwise op.

A random draw almost never meets a given bit pattern (a float16 value above 200, a bfloat16 one
above 2^23, a subnormal, a NaN payload): a kernel wrong on one rare pattern passes any budget of
random examples. 65,536 patterns are cheap, so, as PyTorch's inductor property tests do, a
campaign runs all of them once per elementwise op (``OpSpec.sweep``), 16-bit dtype of the space,
option choice and switch state, against the reference with the op's stated bound (NaN and
infinities as the reference says: NaN in, NaN out). Each sweep is recorded (report.json
``sweeps``: patterns checked, the ulps at the element nearest its bound); a failing one is halved
until a single failing pattern is left, a normal ``Case`` (values ``bit_patterns``, shape (1, 1),
seed = the pattern), recorded as a finding of the reference cell.
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

from ..catalogue import OPS
from ..model.case import BIT_PATTERNS, PATTERNS, SWEEP_DTYPES, Case
from ..runner.controller import DeadlineReached, WorkerFailure

SHAPE = (256, 256)  # 65,536 patterns
SHRINK = "halved to the single failing bit pattern of the exhaustive 16-bit sweep"


def sweep_cases(session: Any, op: str) -> list[Case]:
    """The sweep's cases of ``op``: one per 16-bit dtype of the space and option choice."""
    spec = OPS.get(op)
    if spec is None or spec.sweep is None or not getattr(session.space, "exhaustive", True):
        return []
    entry = (session.entries(op) or spec.entries)[0]
    names = sorted(spec.option_choices)
    choices = list(itertools.product(*(spec.option_choices[n] for n in names)))
    probe = Case(op, entry, "bfloat16", SHAPE, (), BIT_PATTERNS, 0)
    layouts = ("contiguous",) * len(spec.operands(probe))
    options = [dict(zip(names, values, strict=True)) for values in choices]
    return [
        Case(op, entry, dtype, SHAPE, layouts, BIT_PATTERNS, 0, chosen)
        for dtype in SWEEP_DTYPES
        if dtype in session.space.dtypes
        for chosen in options
    ]


def _fails(session: Any, op: str, switch: str, case: Case) -> bool:
    try:
        return not session.judge(op, "reference", switch, case).ok
    except WorkerFailure:
        return True


def halve(session: Any, op: str, switch: str, case: Case) -> Case:
    """The first failing half, again and again, down to one pattern (a (1, 1) case). Where
    neither half fails alone (a failure that needs its neighbours), the smallest failing
    case found so far."""
    while case.shape[0] * case.shape[1] > 1:
        rows, cols = case.shape[0], case.shape[1]
        if rows > 1:
            cut, first, rest = rows // 2, (rows // 2, cols), (rows - rows // 2, cols)
            step = cut * cols
        else:
            cut, first, rest = cols // 2, (1, cols // 2), (1, cols - cols // 2)
            step = cut
        low = replace(case, shape=first, options=dict(case.options))
        high = replace(case, shape=rest, seed=(case.seed + step) % PATTERNS,
                       options=dict(case.options))  # fmt: skip
        if _fails(session, op, switch, low):
            case = low
        elif _fails(session, op, switch, high):
            case = high
        else:
            break
    return case


def run_sweeps(session: Any, op: str, switch: str) -> None:
    """Run ``op``'s sweeps in ``switch`` once per session (``session.sweeps`` records them); a
    failing sweep becomes a finding of the reference cell, shrunk to one pattern. The campaign's
    end (``DeadlineReached``) ends them, unrecorded."""
    try:
        _run_sweeps(session, op, switch)
    except DeadlineReached:
        return


def _run_sweeps(session: Any, op: str, switch: str) -> None:
    for case in sweep_cases(session, op):
        key = (op, switch, case.dtype, tuple(case.options))
        if key in session.swept:
            continue
        session.swept.add(key)
        entry: dict[str, Any] = {
            "op": op,
            "switch": switch,
            "dtype": case.dtype,
            "options": dict(case.options),
            "patterns": PATTERNS,
        }
        try:
            verdict = session.judge(op, "reference", switch, case)
            ok, message = verdict.ok, verdict.message
            entry.update(ulps_observed=verdict.ulps_observed, ulps_allowed=verdict.ulps_allowed)
        except WorkerFailure as failure:
            ok, message = False, f"{type(failure).__name__}: {failure}"
        entry["ok"] = ok
        if not ok:
            single = halve(session, op, switch, case)
            entry["failing_case"] = repr(single)
            if single.shape[:2] == (1, 1):
                entry["failing_pattern"] = f"0x{single.seed:04x}"
            entry["message"] = message.splitlines()[0] if message else ""
            _record(session, op, switch, single)
        session.sweeps.append(entry)


def _record(session: Any, op: str, switch: str, case: Case) -> None:
    """The single pattern's failure as a finding (confirmed in a fresh worker, a reproducer)."""
    session.last_failure = None
    try:
        session.check(op, "reference", switch, case)
    except Exception:
        failure = session.last_failure
        if failure is not None and not session.recorded(failure):
            session.finalize(failure, shrink=SHRINK)
