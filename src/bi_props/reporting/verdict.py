"""The one-line verdict both reports open with: what ran, what failed, what could not be judged
and why. A reader decides from this line whether to read on, so it never hides a gap: cells not
run, unobservable routing, blind controls and unclaimed ops are counted in it."""

from __future__ import annotations

from .data import (
    ACCEPTS_MORE,
    ReportData,
    blind_controls,
    cell_name,
    exit_status,
    fails_run,
    inapplicable_controls,
    no_routing_verdict,
    strict_contract,
    thin_evidence,
    widenings,
)

MAX_NAMED = 3


def first_line(text: object) -> str:
    lines = [line for line in str(text or "").splitlines() if line.strip()]
    return lines[0] if lines else ""


def verdict_line(data: ReportData) -> str:
    r = data.report
    campaign = r.get("campaign") or {}
    total = campaign.get("cells_total") or len(data.cells)
    this_run = "examples_this_run" if any("examples_this_run" in c for c in data.cells) else None
    ran = sum(1 for c in data.cells if c.get(this_run or "examples"))
    observed = r.get("examples_this_run", r.get("examples", 0))
    if this_run:  # the cells' own examples (each one line of examples.jsonl)
        examples = sum(int(c.get(this_run) or 0) for c in data.cells)
        counted = f"{examples:,} cell examples; {observed:,} worker observations in all"
    else:
        counted = f"{observed:,} examples"
    parts = [f"Ran {ran} of {total} cells ({counted}) on {', '.join(data.targets)}"]
    failing = [s for s in data.statuses if fails_run(s, r)]
    if failing:
        names = [
            cell_name(s.finding.get("op"), s.finding.get("property"), s.finding.get("switch"))
            for s in failing[:MAX_NAMED]
        ]
        more = ", ..." if len(failing) > MAX_NAMED else ""
        parts.append(f"FAILED: {len(failing)} open finding(s) ({', '.join(names)}{more})")
    else:
        parts.append("no open findings")
    wider = widenings(r, data.statuses)
    if wider:
        names = [
            cell_name(s.finding.get("op"), s.finding.get("property"), s.finding.get("switch"))
            for s in wider[:MAX_NAMED]
        ]
        more = ", ..." if len(wider) > MAX_NAMED else ""
        how = "failing under --strict-contract" if strict_contract(r) else "not failures"
        parts.append(
            f"{ACCEPTS_MORE}: {len(wider)} contract widening(s), {how} ({', '.join(names)}{more})"
        )
    unjudged = []
    if ran == 0 and not data.statuses:
        unjudged.append("nothing ran, so nothing was judged")
    if total and ran < total:
        unjudged.append(f"{total - ran} cell(s) not run (budget spent or target not started)")
    if r.get("routing_not_observable"):
        unjudged.append(
            f"{len(r['routing_not_observable'])} routing cell(s) not observable on this target"
        )
    blind = blind_controls(r)
    if blind:
        unjudged.append(f"{len(blind)} negative control(s) blind (saw no batch variance)")
    inapplicable = inapplicable_controls(r)
    if inapplicable:
        unjudged.append(
            f"{len(inapplicable)} negative control(s) not applicable (stock invariant here)"
        )
    line = degenerate_line(r)
    if line:
        unjudged.append(line)
    if r.get("not_covered"):
        unjudged.append(f"{len(r['not_covered'])} op(s) not claimed by the target")
    parts.append("not judged: " + "; ".join(unjudged) if unjudged else "nothing left unjudged")
    switching = r.get("switching") or {}
    if switching.get("ok") is not None or "not applicable" in str(switching.get("message")):
        said = {True: "holds", False: "FAILS"}.get(switching.get("ok"))
        parts.append(f"Switching: {said or first_line(switching.get('message'))}")
    evidence = r.get("evidence") or {}
    if evidence.get("judged") is not None:
        parts.append(evidence_sentence(evidence))
    line = ". ".join(parts) + "."
    thin = thin_evidence(r)
    if thin:
        shown = thin_text(thin, MAX_NAMED)
        line = (
            f"THIN EVIDENCE{thin_exit(r)}: {len(thin)} op(s) below the floor of "
            f"{evidence.get('min_judged')} judged examples or a model-level cell not run: "
            f"{shown}. " + line
        )
    if r.get("status") == "incomplete":
        line = "INCOMPLETE, no verdict (no enabled-state cell ran). " + line
    missing = no_routing_verdict(r)
    if missing:
        shown = ", ".join(missing[:MAX_NAMED]) + (", ..." if len(missing) > MAX_NAMED else "")
        line = (
            f"NO ROUTING VERDICT (routing never observed with the switch on for {len(missing)} "
            f"claimed op(s): {shown}; exit 3). " + line
        )
    return line


def evidence_sentence(evidence: dict) -> str:
    """ "Judged: 4,210 examples (12,874 rows); order-blind apart: 40; batch invariance of the
    claimed ops: power >= 0.97 against a kernel as variant as stock (least: mm)"."""
    text = f"Judged: {evidence.get('judged', 0):,} examples"
    if evidence.get("rows_judged"):
        text += f" ({evidence['rows_judged']:,} batch rows compared)"
    if evidence.get("order_blind"):
        text += f"; order-blind, counted apart: {evidence['order_blind']:,}"
    claimed = [o for o in evidence.get("ops", []) if o.get("claimed")]
    powers = [(o["power"], o["op"]) for o in claimed if o.get("power") is not None]
    if powers:
        least, op = min(powers)
        text += (
            f"; claimed ops' batch invariance: detection power >= {least:.2f} against a kernel "
            f"as batch-variant as stock (least: {op})"
        )
    return text


def evidence_lines(report: dict) -> list[str]:
    """The console's lines on the evidence: the judged examples and the least detection power,
    and, when the run is thin, which ops and why (exit 3)."""
    evidence = report.get("evidence") or {}
    if evidence.get("judged") is None:
        return []
    lines = [evidence_sentence(evidence)]
    deployment = deployment_line(report)
    if deployment:
        lines.append(deployment)
    thin = thin_evidence(report)
    if thin:
        lines.append(
            f"THIN EVIDENCE{thin_exit(report)}: {len(thin)} op(s) below the floor of "
            f"{evidence.get('min_judged')} judged examples, or a model-level cell not run: "
            f"{thin_text(thin, 8)} (a larger --budget, or fewer --ops)"
        )
    return lines


def thin_exit(report: dict) -> str:
    """ " (exit 3)" when thin evidence decides the exit status; a failing finding decides it
    first (exit 1), and the line says so rather than name a status the run does not give."""
    status = exit_status(report)
    return " (exit 3)" if status == 3 else f" (the run exits {status}: its findings decide)"


def thin_text(thin: list[str], most: int) -> str:
    """The thin ops, the first ``most`` with their reasons, then how many more."""
    shown = "; ".join(thin[:most])
    return shown + (f"; and {len(thin) - most} more" if len(thin) > most else "")


def degenerate_line(report: dict) -> str:
    """ "degenerate: 812 of 5,300 examples (...)": the cells' examples that compared nothing that
    could depend on the property (N = 0, K = 0, or both calls raising the same error), counted
    apart and never as passes; "" when there were none."""
    d = report.get("degenerate") or {}
    if not d.get("examples"):
        return ""
    return (
        f"degenerate: {d['examples']:,} of {d.get('of', 0):,} examples (compared no element "
        "that could differ, or both calls raised the same error: not counted as passes)"
    )


AXIS_WORDS = {
    "vocab": "logits in a row",
    "context": "keys in a sequence",
    "positions": "rotary positions",
    "tokens": "rows in a batch",
}


def size_entries(r: dict) -> list[dict]:
    """report.json's per-cell deployment-size reach, one entry per cell (sessions merged)."""
    from ..model.deployment import merge_sizes

    return merge_sizes([{"target": r.get("target"), **e} for e in r.get("size_reach", []) or []])


def small_only(r: dict) -> list[str]:
    """The enabled cells of ops with a deployment axis that ran and never drew an example past
    the space's small sizes: they say nothing about the sizes models run at."""
    return [
        cell_name(e["op"], e["property"], e["switch"])
        for e in size_entries(r)
        if e.get("switch") == "enabled" and e.get("examples") and not e.get("deployed")
    ]


def deployment_line(report: dict) -> str:
    """ "Deployment sizes reached: 151,936 logits in a row (log_softmax), ...; 90 of 200 cells
    never left the small sizes": the largest size per axis over the run's cells, the longest
    needle drawn beside a longer sequence, and how many cells stayed small; "" without any."""
    entries = size_entries(report)
    if not entries:
        return ""
    best: dict[str, tuple[int, str]] = {}
    for e in entries:
        axis, largest = e.get("axis"), int(e.get("largest", 0))
        if axis in AXIS_WORDS and largest > best.get(axis, (0, ""))[0]:
            best[axis] = (largest, e["op"])
    parts = [f"{n:,} {AXIS_WORDS[axis]} ({op})" for axis, (n, op) in best.items()]
    needles = [(int(e.get("needle_beside_longer", 0)), e["op"]) for e in entries]
    needle, op = max(needles, default=(0, ""))
    if needle:
        parts.append(f"a needle of {needle:,} keys beside a longer sequence ({op})")
    enabled = sum(1 for e in entries if e.get("switch") == "enabled" and e.get("examples"))
    return (
        f"Deployment sizes reached: {'; '.join(parts)}; {len(small_only(report))} of {enabled} "
        "enabled cells with a deployment axis never left the small sizes"
    )
