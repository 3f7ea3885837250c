"""Hang suspicion in a campaign (`bi-props fuzz`, local and Ray): what a suspicion becomes.

While searching and shrinking, the runner suspects a hang from the op's own observed cost
(``Runner.example_timeout``: ``min(example_timeout_s, max(SUSPECT_FLOOR_S, SUSPECT_FACTOR x
slowest))``), so a hang shows in seconds and each hanging shrink candidate costs seconds, not the
profile's whole timeout. A suspicion is evidence of slowness only. The finding of a hang needs
its fresh-process confirmation, which always waits the profile's full ``example_timeout_s``
(``Session._reproduces_fresh``: a hang keeps patience 1):

- confirmed (no answer in the fresh process within the full timeout): a ``timeout`` finding like
  any other (exit 1); its confirmation says the full timeout was waited;
- not confirmed (the case passed there, failed otherwise, the confirmation was cut at the
  campaign's end, or not run at all): no finding (a few seconds of silence prove no hang), but a
  note in report.json's ``hang_suspicions`` (the case, what was seen, what the fresh process
  showed), and that (op, property, switch) goes back to the full timeout for the rest of the run
  (``Runner.trust``), so a slow cell costs one such confirmation, never a loop of them. The same
  holds for a suspected hang whose replay passed (it would otherwise be a ``flaky`` finding:
  slowness is not nondeterminism). A cell whose only failure was such a suspicion keeps running.

So that a real hang found late can still be confirmed, a shrink with a suspected hang pending
stops once the time left is less than a full-timeout confirmation needs (``confirmation_due``).
Imports neither torch nor Hypothesis.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from ..runner.controller import WorkerHang

CONFIRMATION_WHY = (
    "to leave time for the suspected hang's fresh-process confirmation (the profile's full "
    "example timeout)"
)
"""A shrink's stop reason (``Finding.shrink``) when ``confirmation_due`` stopped it."""

START_MARGIN_S = 5.0
"""What a fresh-process confirmation may need before its example starts (an interpreter that
imports the target; usually a spare already loading, ``Runner.prewarm``)."""


def suspect_hangs(session: Any) -> None:
    """Turn hang suspicion on for a campaign's session (its runner), where it has one."""
    runner = getattr(session, "runner", None)
    if runner is not None and hasattr(runner, "suspect_hangs"):
        runner.suspect_hangs = True


def suspicion(session: Any, failure: Any, kind: str | None = None) -> str | None:
    """Why ``failure`` (a ``session.Failure``; ``kind``: the kind it was first seen with, for a
    flaky one) is a suspected hang only, or None."""
    runner = getattr(session, "runner", None)
    kind = kind or failure.kind
    if runner is None or not hasattr(runner, "suspicion") or kind != WorkerHang.kind:
        return None
    return runner.suspicion(failure.prop, failure.case, failure.switch)


def confirmation_due(session: Any, pending: Iterable[Any]) -> bool:
    """Whether a shrink must stop now so that the fresh-process confirmation of a suspected hang
    among ``pending`` (failures seen) gets the full example timeout before the campaign's end:
    less is left than one more example (its suspected timeout), a fresh interpreter's start and
    the full timeout (less the grace a confirmation has past the end)."""
    from ..runner.controller import CONFIRM_GRACE_S

    runner = getattr(session, "runner", None)
    deadline = getattr(runner, "deadline", None)
    if deadline is None:
        return False
    suspected = [f for f in pending if suspicion(session, f) is not None]
    if not suspected:
        return False
    example_s = max(_example_s(runner, f) for f in suspected)
    need = example_s + START_MARGIN_S + runner.example_timeout_s - CONFIRM_GRACE_S
    return deadline - time.monotonic() < need


def _example_s(runner: Any, failure: Any) -> float:
    """The longest one more example of ``failure``'s case may wait (parity: both states')."""
    both = failure.switch == "both"
    states = ("enabled", "disabled") if both else (failure.switch,)
    return sum(runner.example_timeout(failure.prop, failure.case, s)[0] for s in states)


def settle_suspicion(
    session: Any,
    failure: Any,
    confirm_kind: str | None,
    reproduced: bool | None,
    confirmation: str,
    shrink: str,
) -> tuple[bool, str]:
    """Called by ``Session.finalize`` once the fresh process has spoken: (noted, confirmation).
    ``noted``: the failure was a suspected hang that the full timeout did not confirm, so it
    was kept as a note (report.json ``hang_suspicions``), not a finding, and its cell is back on
    the full timeout. Otherwise the confirmation in words (said more precisely for a confirmed
    suspicion)."""
    kind = confirm_kind or failure.kind
    if kind != WorkerHang.kind:
        return False, confirmation
    why = suspicion(session, failure, kind)
    if why is None:
        return False, confirmation
    full = session.runner.example_timeout_s
    if reproduced is True:
        return False, (
            f"{confirmation}, its full example timeout ({full:g} s) waited (in the search: {why})"
        )
    signature = (session.target, failure.op, failure.prop, failure.switch, kind, "WorkerHang")
    if any(k.matches(signature) for k in getattr(session, "known", [])):
        return False, confirmation  # a known failure: recorded as known, as any other
    session.runner.trust(failure.op, failure.prop, failure.switch)
    if not noted(session, failure):
        session.hang_suspicions.append(
            {
                "target": session.target,
                "op": failure.op,
                "property": failure.prop,
                "switch": failure.switch,
                "case": repr(failure.case),
                "suspicion": why,
                "confirmation": confirmation,
                "shrink": shrink,
                "outcome": (
                    "not a finding: a hang suspected from the op's own cost was not confirmed "
                    f"by a fresh process waiting the full example timeout ({full:g} s); this "
                    "cell is back on the full timeout for the rest of the run"
                ),
                "message": failure.message,
            }
        )
    session.write_report()
    return True, confirmation


def noted(session: Any, failure: Any) -> bool:
    """Whether ``failure`` was kept as an unconfirmed hang suspicion (``settle_suspicion``)."""
    case = repr(failure.case)
    return any(
        (n["op"], n["property"], n["switch"], n["case"])
        == (failure.op, failure.prop, failure.switch, case)
        for n in getattr(session, "hang_suspicions", [])
    )
