"""The ``switching`` property judged in every campaign, beside its cells.

A two-way switch (enable and disable, a context manager) is driven as state in a spawned
interpreter (``bi_props.runner.switching``): seconds of one core, so it runs in a thread while
the cells run, and its verdict is recorded at the campaign's end. A failure is a finding (exit 1,
in the headline); a one-way target's verdict says "not applicable" and why. Imports no torch.
"""

from __future__ import annotations

import threading
from typing import Any

from ..runner import switching

JOIN_S = 300.0
"""How long the campaign's end waits for a switching verdict still running (its own worker has
a timeout of its own; this only bounds a stuck thread)."""


class SwitchingCheck:
    """One thread per target, started with the campaign; ``verdicts`` once finished."""

    def __init__(self, targets: list[str]) -> None:
        self.verdicts: dict[str, dict[str, Any]] = {}
        self._threads = [
            threading.Thread(target=self._judge, args=(t,), daemon=True, name=f"switching {t}")
            for t in targets
        ]
        for thread in self._threads:
            thread.start()

    def _judge(self, target: str) -> None:
        try:
            self.verdicts[target] = switching.session_verdict(target)
        except Exception as exc:  # bi_props' own failure: said, never a silent pass
            why = f"{type(exc).__name__}: {exc}"
            self.verdicts[target] = {"ok": None, "message": f"not judged: it failed ({why})"}

    def finish(self, timeout: float = JOIN_S) -> dict[str, dict[str, Any]]:
        """The verdicts, each thread waited for (a thread still running: "not judged")."""
        for thread in self._threads:
            thread.join(timeout)
        for thread in self._threads:
            target = thread.name.removeprefix("switching ")
            self.verdicts.setdefault(
                target, {"ok": None, "message": f"not judged: still running after {timeout} s"}
            )
        return self.verdicts


def finding_fields(target: str, verdict: dict[str, Any]) -> dict[str, Any] | None:
    """A failed verdict as the fields of a Finding (None when it did not fail)."""
    return switching.finding_fields(target, verdict)


__all__ = ["SwitchingCheck", "finding_fields"]
