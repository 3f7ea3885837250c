"""From a diverging logprob to the op that caused it: the session's step for a model-level finding.

After a model-level finding (the probe model's ``logprobs`` [enabled] mismatch) is confirmed, its
case is replayed once more in the enabled worker under a per-op tape (``Runner.localize``,
execution/tape.py); the first op whose needle rows differ while its inputs' did not is named in
the finding's message with its layer, catalogue op and kernel, and an op-level reproducer built
from that op's recorded inputs (reporting/op_repro.py) is run in a fresh interpreter: the finding
says whether it fails standalone. Searching never pays for it: only a finding is localized.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from ..reporting import op_repro
from ..runner.controller import InternalError, Worker, WorkerFailure

LOCALIZED_PROPERTIES = ("logprobs",)
"""Model-level properties whose findings are localized (the needle alone vs in its batch)."""


def wanted(prop: str, switch: str, kind: str, op: str) -> bool:
    """A confirmed probe_model mismatch of a localized property with the switch on."""
    found = prop in LOCALIZED_PROPERTIES and kind == "mismatch"
    return found and switch == "enabled" and op == "probe_model"


def localize(session: Any, case: Any, index: int) -> tuple[list[str], str | None]:
    """(the finding's extra lines, the op-level reproducer's path or None)."""
    if session.report_path is not None:
        out = Path(session.report_path).parent / "repro" / f"probe_model-logprobs-{index}"
    else:
        out = Path(tempfile.mkdtemp(prefix="bi_props_localize_"))
    try:
        summary = session.runner.localize(case, "enabled", str(out))
    except (WorkerFailure, InternalError) as exc:
        first = next((line for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        return [f"localized: not: the replay under a per-op tape failed: {first}"], None
    hello = session.hello("enabled")
    lines = op_repro.message_lines(summary, dict(hello.routes))
    if "saved" not in summary:
        return lines, None
    cause = summary["cause"]
    title = (
        f"Op-level reproducer: target {session.target!r}, {summary['saved']['op']}: the first"
        f" diverging op of a probe_model logprobs [enabled] finding ({cause['section']})."
    )
    path = op_repro.write(summary, hello.repro.get("enabled", ""), title, lines)
    env = Worker(session.target, "enabled", extra_env=session._worker_env()).environment()
    timeout = session.space.start_timeout_s + session.space.example_timeout_s
    code, tail = op_repro.confirm(path, op_repro.environment(env), timeout)
    if code == 1:
        verdict = "fails standalone (exit 1 in a fresh interpreter)"
    elif code == 0:
        verdict = (
            f"does not fail standalone (exit 0: the op alone on its recorded inputs gives the"
            f" needle's rows the same bits: {tail})"
        )
    else:
        verdict = f"does not fail standalone: exit {code}: {tail}"
    lines.append(f"op-level reproducer: {path}: {verdict}")
    return lines, str(path)
