"""A session's execution modes (``Case.mode``): the space its strategies draw from, the second
worker of determinism across compiles, and what report.json says (``modes``, ``compile``).

The rules are ``model.modes``'; the runner applies them to every case it runs
(``Runner.settle``). Imports no torch.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ..execution.compiled import FRESH_ENV
from ..model.case import Case
from ..model.modes import CompileStats
from ..model.space import Space


def mode_space(session: Any) -> Space:
    """The session's space with the modes the run draws (the target's narrowing applied)."""
    drawn, _ = session.runner.drawn_modes()
    space: Space = session.space
    return space if tuple(space.modes) == tuple(drawn) else replace(space, modes=tuple(drawn))


def each_mode(session: Any, case: Case) -> list[Case]:
    """``case`` in each mode the run draws, its own first: a known batch-variant case (seen
    eagerly by a negative control) is also tried compiled, where a compiled path may bypass the
    kernel that holds eagerly."""
    drawn, _ = session.runner.drawn_modes()
    case = session.runner.settle(case)
    modes = [case.mode, *(m for m in drawn if m != case.mode)]
    return [
        case if m == case.mode else replace(case, mode=m, options=dict(case.options)) for m in modes
    ]


def fresh_compile_env(session: Any) -> dict[str, str]:
    """The environment of determinism's second worker: where compiled cases are drawn, it
    compiles afresh (``execution.compiled``: its own cache directory, caches off, autotuning
    distorted where torch can), so "another process" is also "another compile"."""
    drawn, _ = session.runner.drawn_modes()
    return {FRESH_ENV: "1"} if "compiled" in drawn else {}


def modes_report(session: Any) -> dict[str, Any]:
    """report.json's ``modes`` (asked, drawn, not applicable with reasons) and ``compile``
    (seconds, graphs and compiled observations, per op; the second worker's included)."""
    drawn, not_applicable = session.runner.drawn_modes(load=False)
    stats: CompileStats = session.runner.compile_stats
    second = getattr(session, "_second", None)
    if second is not None:
        stats = stats.merge(second.compile_stats)
    return {
        "modes": {
            "asked": list(session.space.modes),
            "drawn": list(drawn),
            "not_applicable": [
                {"mode": mode, "reason": why} for mode, why in not_applicable.items()
            ],
        },
        "compile": stats.to_json(),
    }
