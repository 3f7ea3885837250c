"""Everything the reports show, read once from an output directory (no matplotlib here).

Inputs: ``report.json`` (required: the Session/campaign schema of the README, with the optional
campaign keys ``cells``, ``rounds``, ``campaign`` and the optional ``known`` list) and
``examples.jsonl`` (coverage lines; optional, streamed and aggregated, so a night of examples
does not have to fit in memory as dicts).
"""

from __future__ import annotations

import json
import random
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .ulp import max_ulp

SIGNATURE_FIELDS = ("target", "op", "property", "switch", "kind", "error_type", "case_class")
MAX_POINTS_PER_OP = 4000  # scatter points kept per op (failures always kept)

FAILING_STATUSES = ("new", "still failing", "not seen this run", "regression")
STATUS_NOTES = {
    "new": "found in this run",
    "still failing": "found before, failed again in this run",
    "not seen this run": "found before, not reproduced in this run (fixed, or not re-tested)",
    "known": "a known failure (report.json 'known')",
    "fixed": "marked fixed and not seen in this run",
    "regression": "marked fixed, but failed again in this run",
}


BLIND_CONTROL = (
    "NO VARIANCE SEEN: this control is blind: the run did not show that it can see batch "
    "variance on this op (a stronger search, or other shapes, may be needed)"
)


NOT_APPLICABLE_CONTROL = (
    "stock kernel invariant here: the control searched its whole quota where reduction order "
    "shows and saw no variance, so it is not applicable on this platform (not a pass of "
    "anything; --strict-controls still fails on it)"
)


def blind_controls(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The negative controls that saw no batch variance and did not spend their quota (flagged
    in every report; a failure with ``--strict-controls`` / ``--bi-strict-controls``, recorded
    as ``strict_controls``). A control that spent it is ``not applicable`` instead."""
    return [
        c
        for c in report.get("controls") or []
        if not c.get("variance_seen") and c.get("applicable") is not False
    ]


def inapplicable_controls(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The negative controls whose whole quota showed no variance: stock is invariant here."""
    return [
        c
        for c in report.get("controls") or []
        if not c.get("variance_seen") and c.get("applicable") is False
    ]


def control_seen_cell(control: dict[str, Any]) -> str:
    """The "variance seen" column of a control, in words."""
    if control.get("variance_seen"):
        return "yes"
    if control.get("applicable") is False:
        return "not applicable (stock invariant here)"
    return "NO (blind)"


def no_routing_verdict(report: dict[str, Any]) -> list[str]:
    """The claimed ops whose routing [enabled] ran and was never judged on evidence: every
    example of theirs was ``not_observable``, so the run cannot say whether the switch reached
    the target's kernels for them (exit 3). An op the target declares unobservable (its
    ``UNOBSERVABLE``, entries marked ``declared``) is reported with its reason instead. Names
    are ``op``, or ``target: op`` in a report of several targets. Reports from before
    ``routing_observed`` was recorded never count."""
    observed = report.get("routing_observed")
    if observed is None:
        return []
    missing = []
    for entry in report.get("routing_not_observable") or []:
        if entry.get("switch") != "enabled" or entry.get("declared"):
            continue
        name = f"{entry['target']}: {entry.get('op')}" if "target" in entry else entry.get("op")
        if name not in observed and name not in missing:
            missing.append(name)
    return missing


NO_ROUTING_VERDICT = (
    "NO ROUTING VERDICT: routing was never observed with the switch on for a claimed op (no "
    "profiler event naming it, no identity or dispatcher evidence; each is listed as ROUTING "
    "NOT OBSERVABLE), so the run cannot say whether the switch reached the target's kernels "
    "there (exit 3; a target that cannot show an op's routing declares it in UNOBSERVABLE)"
)


WIDENING = "widening"  # parity's kind for a contract the switch widened (model.properties)
ACCEPTS_MORE = "accepts more than stock"


def strict_contract(report: dict[str, Any]) -> bool:
    """Whether the run was asked to fail on a contract widening (``--strict-contract``,
    ``--bi-strict-contract``): recorded in the report as ``strict_contract``."""
    return bool(report.get("strict_contract"))


def fails_run(status: FindingStatus, report: dict[str, Any]) -> bool:
    """An open finding that fails the run (exit 1): every failing one, except a contract
    widening (kind ``widening``: the switch-on kernel returns where stock raises), which is
    reported apart as "accepts more than stock" unless the report says strict contract."""
    return status.failing and (status.finding.get("kind") != WIDENING or strict_contract(report))


def widenings(report: dict[str, Any], statuses: list[FindingStatus] | None = None) -> list:
    """The open findings of kind ``widening`` ("accepts more than stock"), strict or not."""
    statuses = finding_statuses(report) if statuses is None else statuses
    return [s for s in statuses if s.failing and s.finding.get("kind") == WIDENING]


def widening_line(status: FindingStatus, report: dict[str, Any]) -> str:
    """ "ACCEPTS MORE THAN STOCK: silu parity [both] (RuntimeError from stock): case" ."""
    f = status.finding
    what = cell_name(f.get("op"), f.get("property"), f.get("switch"))
    stock = f" (stock raised {f['error_type']})" if f.get("error_type") else ""
    strict = (
        "fails the run: --strict-contract"
        if strict_contract(report)
        else "not a failure; --strict-contract fails on it"
    )
    return f"{ACCEPTS_MORE.upper()}: {what}{stock} ({strict}): {f.get('case')}"


def exit_status(report: dict[str, Any], interrupted: bool = False) -> int:
    """The verdict classes and the exit status they give, for ``bi-props fuzz`` and the pytest
    plugin alike (README, docs/campaigns.md):

    - 3: bi_props itself failed (a finding of kind ``internal``, an internal error, in a cell
      or a negative control; report status ``internal error``);
    - 1: an open finding (not known, or a regression): a mismatch, crash, timeout, error,
      flaky, switch leak, or a ``promise`` finding (an op the target does not swap,
      batch-variant with the switch on, under a switch that promises batch-invariant
      inference); a ``widening`` (the switch-on kernel accepts what stock refuses) only with
      ``strict_contract`` (``fails_run``), else it is reported as "accepts more than stock";
    - 130: interrupted without findings;
    - 3: no verdict: no enabled-state cell ran (``incomplete``), routing was never observed
      for a claimed op not declared unobservable (``no_routing_verdict``), or the evidence is
      thin (``thin_evidence``);
    - 0: otherwise.
    """
    statuses = finding_statuses(report)
    if report.get("status") == "internal error" or any(
        s.failing and s.finding.get("kind") == "internal" for s in statuses
    ):
        return 3
    if report.get("internal_errors"):
        return 3
    if any(fails_run(s, report) for s in statuses):
        return 1
    if interrupted:
        return 130
    if report.get("status") == "incomplete" or no_routing_verdict(report):
        return 3
    if thin_evidence(report):
        return 3
    return 0


def thin_evidence(report: dict[str, Any]) -> list[str]:
    """The ops whose evidence is below the floor (``campaigns/evidence.py``): a claimed op's
    enabled reference or batch-invariance cell with fewer than ``min_judged`` judged examples,
    or a model-level cell that did not run. Non-empty: no trustworthy verdict (exit 3)."""
    return list((report.get("evidence") or {}).get("thin") or [])


def fresh_process(finding: dict[str, Any]) -> str:
    """The fresh-process confirmation in words (older reports: from the boolean alone)."""
    if finding.get("confirmation"):
        return str(finding["confirmation"])
    value = finding.get("reproduced_in_fresh_process")
    return {True: "reproduced", False: "not reproduced", None: "not confirmed"}.get(value, "?")


def signature(finding: dict[str, Any]) -> tuple:
    return tuple(finding.get(k) for k in SIGNATURE_FIELDS)


def cell_name(op: str, prop: str, switch: str) -> str:
    return f"{op} {prop} [{switch}]"


def known_entry(finding: dict[str, Any], known: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The ``known`` entry matching a finding: an entry gives a ``signature`` list (in
    ``Finding.signature()`` order) or some of the signature's fields by name (as
    ``Session.report()``'s ``known`` does); fields it leaves out, or sets to ``"*"`` or null,
    match anything."""
    sig = signature(finding)
    for entry in known or []:
        if not isinstance(entry, dict):
            continue
        wanted = entry.get("signature")
        if isinstance(wanted, (list, tuple)):
            pairs = zip(wanted, sig, strict=False)
        else:
            pairs = ((entry[k], finding.get(k)) for k in SIGNATURE_FIELDS if k in entry)
        if all(w in ("*", None) or w == v for w, v in pairs):
            return entry
    return None


@dataclass
class FindingStatus:
    finding: dict[str, Any]
    status: str
    known: dict[str, Any] | None = None

    @property
    def signature(self) -> tuple:
        return signature(self.finding)

    @property
    def failing(self) -> bool:
        return self.status in FAILING_STATUSES

    @property
    def note(self) -> str:
        note = STATUS_NOTES.get(self.status, self.status)
        if self.known:
            extra = ", ".join(str(self.known[k]) for k in ("reason", "link") if self.known.get(k))
            if extra:
                note += f": {extra}"
        return note


def finding_statuses(report: dict[str, Any]) -> list[FindingStatus]:
    """Each finding with its campaign status, overridden by the ``known`` list when present
    (entry status "fixed": fixed, or a regression when it failed in this run; any other entry
    status, and a finding the session itself marked ``status: known``: known)."""
    campaign = {
        tuple(s["signature"]): s["status"]
        for s in (report.get("campaign") or {}).get("finding_status", [])
    }
    known = report.get("known") or []
    result = []
    for finding in report.get("findings", []):
        sig = signature(finding)  # a report from before failure classes has 6 fields
        status = campaign.get(sig, campaign.get(sig[:-1], "new"))
        entry = known_entry(finding, known)
        if entry is None and finding.get("status") == "known":
            status = "known"
        elif entry is not None:
            marked = entry.get("status", "known")
            if marked == "fixed":
                status = "regression" if status in ("new", "still failing") else "fixed"
            else:
                status = "known"
        result.append(FindingStatus(finding, status, entry))
    return result


def round_counts(rounds: list[dict[str, Any]], run: int | None) -> tuple[int, int]:
    """(rounds in this run, rounds in the campaign) from the report's round ranges."""
    sizes = [(r.get("run"), int(r["last"]) - int(r["first"]) + 1) for r in rounds if "last" in r]
    return sum(n for k, n in sizes if k == run), sum(n for _, n in sizes)


def bucket(n: int) -> str:
    """Power-of-two bucket of one extent: 0, 1, 2-3, 4-7, 8-15, ..."""
    if n <= 1:
        return str(max(n, 0))
    low = 1 << (int(n).bit_length() - 1)
    return f"{low}-{2 * low - 1}"


def shape_bucket(shape: list[int] | tuple[int, ...]) -> str:
    return "x".join(bucket(int(s)) for s in shape)


def axis_names(op: str) -> tuple[str, str]:
    """Names of the scatter axes for an op: (rows, second shape entry) from the catalogue."""
    try:
        from ..catalogue import OPS

        doc = OPS[op].shape_doc
    except Exception:
        doc = ""
    match = re.match(r"\s*(?:form \w+: )?\(([^)]*)\)", doc)
    names = [n.strip() for n in match.group(1).split(",")] if match else []
    second = names[1] if len(names) > 1 else "shape[1]"
    return "rows in the call (batch rows, or M)", second


CASE_SHAPE = re.compile(r"shape=\(([\d,\s]*)\)")
CASE_DTYPE = re.compile(r"dtype='(\w+)'")
CASE_COMPANION_ROWS = re.compile(r"Companion\(seed=\d+, rows=(\d+)(?:, queries=\d+)?\)")


def case_point(case: str | None) -> tuple[str | None, int, int] | None:
    """(dtype, x, y) of a case repr for the shape-space plot: x = rows in the call."""
    if not case:
        return None
    shape_m = CASE_SHAPE.search(case)
    if not shape_m:
        return None
    shape = [int(s) for s in shape_m.group(1).split(",") if s.strip()]
    if not shape:
        return None
    dtype_m = CASE_DTYPE.search(case)
    rows = shape[0] + sum(int(r) for r in CASE_COMPANION_ROWS.findall(case))
    second = shape[1] if len(shape) > 1 else shape[0]
    return (dtype_m.group(1) if dtype_m else None), rows, second


@dataclass
class CoverageRow:
    target: str
    op: str
    property: str
    switch: str
    dtype: str
    layout: str
    bucket: str
    outcomes: Counter = field(default_factory=Counter)

    @property
    def total(self) -> int:
        return sum(self.outcomes.values())


@dataclass
class ReportData:
    out: Path
    report: dict[str, Any]
    statuses: list[FindingStatus]
    coverage: dict[tuple, CoverageRow]
    points: dict[str, list[tuple[str, int, int, str]]]
    ulps: list[tuple[str, int]]
    cells: list[dict[str, Any]]
    lines: int = 0
    outcomes: Counter = field(default_factory=Counter)

    @property
    def targets(self) -> list[str]:
        return self.report.get("targets") or [self.report.get("target", "?")]

    def cell_findings(self, target: str, op: str, prop: str, switch: str) -> list[FindingStatus]:
        return [
            s
            for s in self.statuses
            if (s.finding.get("op"), s.finding.get("property"), s.finding.get("switch"))
            == (op, prop, switch)
            and s.finding.get("target", target) == target
        ]

    def not_covered(self, target: str, op: str) -> str | None:
        for entry in self.report.get("not_covered", []):
            if entry.get("op") == op and entry.get("target", target) == target:
                return entry.get("reason", "")
        return None

    def unobservable(self, target: str, op: str, prop: str, switch: str) -> str | None:
        """Why a routing cell's routing could not be observed (never reported as passed)."""
        if prop != "routing":
            return None
        for entry in self.report.get("routing_not_observable", []) or []:
            if (entry.get("op"), entry.get("switch")) == (op, switch) and entry.get(
                "target", target
            ) == target:
                return entry.get("reason", "")
        return None

    def cell_status(self, cell: dict[str, Any]) -> tuple[str, list[FindingStatus]]:
        """A cell's status for the Cells section of every report (md and html) and its
        findings: the findings' statuses, else "passed" / "not run", and "routing not
        observable" for a passed cell whose routing could not be seen."""
        key = (cell["target"], cell["op"], cell["property"], cell["switch"])
        found = self.cell_findings(*key)
        wider = {id(s) for s in widenings(self.report, found) if not fails_run(s, self.report)}
        status = ", ".join(
            sorted({ACCEPTS_MORE if id(s) in wider else s.status for s in found})
        ) or ("passed" if cell.get("examples") else "not run")
        if status == "passed" and self.unobservable(*key):
            status = "routing not observable"
        return status, found

    def unclaimed(self, target: str, op: str) -> dict[str, Any] | None:
        """What the enabled state showed for an op the target does not claim."""
        for entry in self.report.get("unclaimed", []) or []:
            if entry.get("op") == op and entry.get("target", target) == target:
                return entry
        return None


def unclaimed_text(entry: dict[str, Any]) -> str:
    """ "not claimed, batch-variant with the switch on: yes/no, smallest case"."""
    answer = "yes" if entry.get("batch_variant") else "no"
    text = (
        f"not claimed, batch-variant with the switch on: {answer} "
        f"({entry.get('property')}, {entry.get('examples', 0)} examples)"
    )
    return text + (f"; smallest case seen: {entry['case']}" if entry.get("case") else "")


def load(out: Path, name: str = "report.json") -> ReportData:
    """Read DIR/report.json (``name``: the pytest plugin's ``--bi-report`` file) and stream
    DIR/examples.jsonl."""
    out = Path(out)
    report = json.loads((out / name).read_text())
    statuses = finding_statuses(report)
    default_target = (report.get("targets") or [report.get("target", "?")])[0]
    coverage: dict[tuple, CoverageRow] = {}
    failures: dict[str, list] = defaultdict(list)
    passing: dict[str, list] = defaultdict(list)
    seen_ok: Counter = Counter()
    rng = random.Random(0)
    ulps: list[tuple[str, int]] = []
    outcomes: Counter = Counter()
    lines = 0
    path = out / "examples.jsonl"
    if path.exists():
        with path.open() as f:
            for raw in f:
                try:
                    line = json.loads(raw)
                except json.JSONDecodeError:
                    continue  # a torn last line
                lines += 1
                target = line.get("target") or default_target
                op, prop, switch = line.get("op"), line.get("property"), line.get("switch")
                shape = line.get("shape") or []
                outcome = line.get("outcome", "?")
                outcomes[outcome] += 1
                layout = "/".join(line.get("layouts") or []) or "-"
                key = (target, op, prop, switch, line.get("dtype"), layout, shape_bucket(shape))
                if key not in coverage:
                    coverage[key] = CoverageRow(*key)
                coverage[key].outcomes[outcome] += 1
                if line.get("max_ulp") is not None:
                    ulps.append((f"{prop} [{switch}]", int(line["max_ulp"])))
                if shape:
                    rows = line.get("batch_rows") or shape[0]
                    second = shape[1] if len(shape) > 1 else shape[0]
                    point = (line.get("dtype"), int(rows), int(second), outcome)
                    _keep_point(failures, passing, seen_ok, op, point, rng)
    if not ulps:
        for status in statuses:  # no per-example ULPs recorded: use the findings' messages
            value = max_ulp(status.finding.get("message"))
            if value is not None:
                f = status.finding
                ulps.append((f"{f.get('property')} [{f.get('switch')}] (finding)", value))
    for control in report.get("controls", []):
        value = max_ulp(control.get("message"))
        if value is not None:
            ulps.append((f"{control.get('property')} [disabled] (negative control)", value))
    points = {op: passing[op] + failures[op] for op in {*passing, *failures}}
    cells = list(report.get("cells") or []) or _cells_from(coverage, statuses, default_target)
    return ReportData(out, report, statuses, coverage, points, ulps, cells, lines, outcomes)


def _keep_point(
    failures: dict[str, list], passing: dict[str, list], seen: Counter, op: str, point: tuple, rng
) -> None:
    """Failures always; passing points by reservoir sampling (deterministic: a fixed seed)."""
    if point[3] != "ok":
        failures[op].append(point)
        return
    seen[op] += 1
    if len(passing[op]) < MAX_POINTS_PER_OP:
        passing[op].append(point)
        return
    j = rng.randrange(seen[op])
    if j < MAX_POINTS_PER_OP:
        passing[op][j] = point


def _cells_from(coverage: dict, statuses: list[FindingStatus], target: str) -> list[dict]:
    """Cells of an older report (no ``cells`` key): those seen in coverage and in findings."""
    cells: dict[tuple, dict[str, Any]] = {}
    for row in coverage.values():
        key = (row.target, row.op, row.property, row.switch)
        cell = cells.setdefault(
            key,
            {"target": key[0], "op": key[1], "property": key[2], "switch": key[3], "examples": 0},
        )
        cell["examples"] += row.total
    for status in statuses:
        f = status.finding
        key = (f.get("target", target), f.get("op"), f.get("property"), f.get("switch"))
        cells.setdefault(
            key,
            {"target": key[0], "op": key[1], "property": key[2], "switch": key[3], "examples": 0},
        )
    return list(cells.values())
