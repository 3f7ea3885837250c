"""The record a property's judge returns: ``Verdict``. A record type of the bottom layer, so that
the property record (``property_spec``) can name it without importing the judges
(``properties``, which read the op registry). numpy-free, torch-free."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Verdict:
    ok: bool
    message: str = ""
    # "mismatch" | "error" | "not_covered" | "not_observable" | "widening" (parity)
    kind: str = "mismatch"
    error_type: str | None = None
    # reference only: at the element that used most of its allowed slack, the distance from the
    # reference rounded once and the slack allowed there, in ulps of the output dtype.
    ulps_observed: int | None = None
    ulps_allowed: float | None = None
    # Elements the judge compared (None: not a numeric comparison, e.g. routing or parity), and
    # why a verdict that would pass is no evidence: "" when judged, else the reason (zero
    # elements, all-zero outputs, both calls raising the same error). Such a verdict keeps
    # ``ok`` (it is no failure) but the session counts it apart as degenerate, never as a pass.
    compared: int | None = None
    degenerate: str = ""
    # Rows (samples' output rows along the batch axis) a batch-comparing judge compared: the
    # needle's and those of the batch's windows (``model.windows``); None where not counted.
    rows: int | None = None
