"""ULP distances out of verdicts and messages, for the reports' histograms.

``coverage_extras`` is the helper that adds ``max_ulp`` to a coverage line (``examples.jsonl``):
``Session.check`` can call it on each verdict (wiring left to the session's owner; see the
campaign's notes). Until then the reports parse "Max ULP difference" out of finding and control
messages, which the comparison code (``compare.Mismatch``) always writes.
"""

from __future__ import annotations

import re
from typing import Any

ULP_PATTERN = re.compile(r"Max ULP difference \((?P<dtype>[A-Za-z0-9_]+)\): (?P<ulp>\d+)")


def max_ulp(message: str | None) -> int | None:
    """The largest "Max ULP difference (dtype): N" in a message; None when it has none."""
    if not message:
        return None
    values = [int(m.group("ulp")) for m in ULP_PATTERN.finditer(message)]
    return max(values) if values else None


def coverage_extras(verdict: Any) -> dict[str, Any]:
    """Extra fields for one coverage line from a property's verdict: ``{"max_ulp": N}`` when the
    verdict states a ULP distance (a ``max_ulp`` attribute, else its message), else ``{}``."""
    value = getattr(verdict, "max_ulp", None)
    if value is None:
        value = max_ulp(getattr(verdict, "message", None))
    return {} if value is None else {"max_ulp": int(value)}
