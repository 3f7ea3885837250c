"""ULP distances out of verdicts and messages, for the reports' histograms.

``coverage_extras`` adds ``max_ulp`` and, for the reference property, ``ulps_observed`` and
``ulps_allowed`` (the distance and the allowed slack at the element nearest its bound) to a
coverage line (``examples.jsonl``); ``Session.check`` calls it on each verdict. Findings carry
the same two fields, parsed from the message by ``reference_ulps``. The reports parse
"Max ULP difference" out of finding and control messages, which ``compare.Mismatch`` writes.
"""

from __future__ import annotations

import re
from typing import Any

ULP_PATTERN = re.compile(r"Max ULP difference \((?P<dtype>[A-Za-z0-9_]+)\): (?P<ulp>\d+)")
SLACK_PATTERN = re.compile(
    r"ULPs at the element nearest its bound: observed (?P<observed>\d+), "
    r"allowed (?P<allowed>[0-9.eE+-]+|inf|nan)"
)


def reference_ulps(message: str | None) -> dict[str, Any]:
    """``{"ulps_observed": N, "ulps_allowed": X}`` from a reference verdict's message (the line
    properties.ulp_line writes), else ``{}``."""
    match = SLACK_PATTERN.search(message or "")
    if match is None:
        return {}
    return {
        "ulps_observed": int(match.group("observed")),
        "ulps_allowed": float(match.group("allowed")),
    }


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
    extras: dict[str, Any] = {} if value is None else {"max_ulp": int(value)}
    if getattr(verdict, "ulps_observed", None) is not None:
        extras["ulps_observed"] = int(verdict.ulps_observed)
        extras["ulps_allowed"] = float(verdict.ulps_allowed)
    return extras
