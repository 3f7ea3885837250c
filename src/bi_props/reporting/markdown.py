"""``DIR/report.md``: the campaign in Markdown (a CI job summary, a PR comment, an issue)."""

from __future__ import annotations

from ..model.batch_reach import merge_reach
from .data import (
    ACCEPTS_MORE,
    BLIND_CONTROL,
    ReportData,
    blind_controls,
    cell_name,
    control_seen_cell,
    fails_run,
    fresh_process,
    no_routing_verdict,
    round_counts,
    strict_contract,
    thin_evidence,
    unclaimed_text,
    widenings,
)
from .verdict import size_entries, small_only, verdict_line

MAX_COVERAGE_ROWS = 200


def _cell(text: object) -> str:
    """Text safe inside a Markdown table cell."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def first_line(message: str | None) -> str:
    lines = [line for line in (message or "").splitlines() if line.strip()]
    return lines[0] if lines else ""


def turn_rates(turns: list[dict]) -> str:
    """Examples/s per turn, summarised per kind: count, median and range (the list is in
    report.json's campaign.turns)."""
    parts = []
    for kind in ("cell", "control"):
        rates = sorted(t["examples_per_s"] for t in turns if t.get("kind") == kind and
                       t.get("examples_per_s") is not None)  # fmt: skip
        if rates:
            median = rates[len(rates) // 2]
            parts.append(
                f"{len(rates)} {kind} turns: median {median:.1f} examples/s "
                f"({rates[0]:.1f}-{rates[-1]:.1f})"
            )
    return "; ".join(parts)


def _power(entry: dict) -> str:
    if entry.get("power") is not None:
        return f"{entry['power']:.2f} (p = {entry['p_hits']}/{entry['p_judged']})"
    return {"invariant": "- (stock invariant here)"}.get(entry.get("stock", ""), "-")


def evidence_table(r: dict) -> list[str]:
    """Per claimed op: judged examples of each enabled cell, rows compared, known stock-variant
    cases run, and the detection power of its batch-invariance cell; thin ops marked."""
    evidence = r.get("evidence") or {}
    ops = [o for o in evidence.get("ops", []) if o.get("claimed") or o.get("thin")]
    if not ops:
        return []
    floor = evidence.get("min_judged")
    out = [
        f"## Evidence per claimed op (floor: {floor} judged examples of reference and batch "
        "invariance)\n",
        "| op | reference | batch invariance | rows compared | known stock-variant cases "
        "| detection power | row permutation | determinism | parity | thin |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for o in ops:
        judged = o.get("judged") or {}
        several = len({e.get("target") for e in ops}) > 1
        name = o["op"] + (f" ({o['target']})" if several and o.get("target") else "")
        cells = [
            judged.get(p, "-")
            for p in ("reference", "batch_invariance")
        ]  # fmt: skip
        out.append(
            f"| {_cell(name)} | {cells[0]} | {cells[1]} | "
            f"{(o.get('rows') or {}).get('batch_invariance', '-')} | "
            f"{o.get('known_variant_judged', 0)} | {_power(o)} | "
            f"{judged.get('row_permutation', '-')} | {judged.get('determinism', '-')} | "
            f"{judged.get('parity', '-')} | {_cell('; '.join(o.get('thin') or [])) or ''} |"
        )
    out.append("")
    return out


def render(data: ReportData) -> str:
    r = data.report
    campaign = r.get("campaign") or {}
    throughput = campaign.get("throughput") or {}
    failing = [s for s in data.statuses if fails_run(s, r)]
    out: list[str] = []
    verdict = f"{len(failing)} open finding(s)" if failing else "no open findings"
    wider = widenings(r, data.statuses)
    if wider:
        verdict += f"; {ACCEPTS_MORE}: {len(wider)}"
    if r.get("status") == "incomplete":
        verdict = "INCOMPLETE: no enabled-state cell ran, no verdict; " + verdict
    missing = no_routing_verdict(r)
    if missing:
        verdict = f"NO ROUTING VERDICT for {', '.join(missing)}; " + verdict
    if thin_evidence(r):
        verdict = f"THIN EVIDENCE: {len(thin_evidence(r))} op(s) below the floor; " + verdict
    if campaign.get("stopped_early"):
        verdict += f"; stopped early {campaign['stopped_early']}"
    not_run = campaign.get("cells_not_run")
    if not_run:
        verdict += f"; {not_run} of {campaign.get('cells_total', '?')} cells not run"
    small = small_only(r)
    if small:
        verdict += f"; {len(small)} cell(s) never left the small sizes"
    degenerate = r.get("degenerate") or {}
    if degenerate.get("examples"):
        verdict += f"; degenerate: {degenerate['examples']:,} of {degenerate.get('of', 0):,}"
    out.append(f"# bi_props campaign: {', '.join(data.targets)} ({verdict})\n")
    out.append(f"**Verdict.** {verdict_line(data)}\n")
    out += evidence_table(r)
    run: list[str] = []  # the run's facts: after the findings and the controls
    run.append("## Run\n")
    run.append("| | |\n| --- | --- |")
    if r.get("status"):
        run.append(f"| status | **{_cell(r['status'])}** |")
    run.append(f"| targets | {_cell(', '.join(data.targets))} |")
    run.append(f"| profile | {_cell(r.get('profile'))} (`{_cell(r.get('strategies'))}`) |")
    if "seed" in r:
        run.append(f"| campaign seed | `{r['seed']}` (replay: `--seed {r['seed']}`) |")
    rounds = r.get("rounds") or []
    if rounds:
        this_run, total = round_counts(rounds, campaign.get("run"))
        run.append(f"| rounds | {this_run} this run, {total} in the campaign |")
    runs = campaign.get("runs") or []
    if runs:
        run.append(f"| runs | {len(runs)} (resumed: {campaign.get('resumed', False)}) |")
    run.append(
        f"| examples | {r.get('examples_this_run', r.get('examples', 0))} this run, "
        f"{r.get('examples', 0)} in the campaign |"
    )
    run.append(f"| elapsed | {r.get('elapsed_s', 0):.0f} s |")
    if throughput.get("examples_per_s"):
        run.append(f"| throughput (cells) | {throughput['examples_per_s']:.1f} examples/s |")
    if campaign.get("overrun_s"):
        run.append(f"| past the budget | {campaign['overrun_s']:.1f} s |")
    time_split = campaign.get("time") or {}
    if time_split.get("shares"):
        shares = ", ".join(
            f"{k} {100 * (v or 0):.0f}% ({time_split['seconds'][k]:.1f} s)"
            for k, v in time_split["shares"].items()
        )
        run.append(f"| time | {_cell(shares)} |")
    turns = campaign.get("turns") or []
    if turns:
        run.append(f"| turns | {_cell(turn_rates(turns))} |")
    if campaign.get("interrupted"):
        run.append("| interrupted | yes (the report holds everything found until then) |")
    if campaign.get("stopped_early"):
        run.append(f"| stopped early | {_cell(campaign['stopped_early'])} |")
    run.append("")

    out.append("## Findings\n")
    if not data.statuses:
        out.append(f"None: no property failed in {r.get('examples', 0)} examples.\n")
    else:
        out.append("| status | target | cell | kind | fresh process | summary |")
        out.append("| --- | --- | --- | --- | --- | --- |")
        for s in data.statuses:
            f = s.finding
            kind = f.get("kind", "") + (f" ({f['error_type']})" if f.get("error_type") else "")
            out.append(
                f"| **{s.status}** | {_cell(f.get('target'))} | "
                f"{_cell(cell_name(f.get('op'), f.get('property'), f.get('switch')))} | "
                f"{_cell(kind)} | {_cell(fresh_process(f))} | "
                f"{_cell(first_line(f.get('message')))} |"
            )
        out.append("")
        for i, s in enumerate(data.statuses, 1):
            f = s.finding
            out.append(
                f"### {i}. {cell_name(f.get('op'), f.get('property'), f.get('switch'))} "
                f"on {f.get('target')}: {f.get('kind')} ({s.status})\n"
            )
            out.append(f"_{s.note}_\n")
            if f.get("shrink", "complete") != "complete":
                out.append(f"Shrinking {f['shrink']}.\n")
            out.append("```python\n" + str(f.get("case", "")) + "\n```\n")
            out.append("```\n" + str(f.get("message", "")).rstrip() + "\n```\n")

    out.extend(_accepts_more(r, wider))

    out.append("## Negative controls (switch off)\n")
    controls = r.get("controls") or []
    blind = blind_controls(r)
    if blind:
        strict = " (--strict-controls: the run fails)" if r.get("strict_controls") else ""
        out.append(f"**{len(blind)} blind control(s){strict}.** {BLIND_CONTROL}.\n")
    if not controls:
        out.append("None ran: the campaign reached no switch-off batch-invariance cell.\n")
    else:
        out.append(
            "| target | op | property | state | variance seen | smallest case / note | shrink |"
        )
        out.append("| --- | --- | --- | --- | --- | --- | --- |")
        for c in controls:
            what = c.get("case") or first_line(c.get("message"))
            out.append(
                f"| {_cell(c.get('target', r.get('target')))} | {_cell(c.get('op'))} | "
                f"{_cell(c.get('property'))} | {_cell(c.get('state', 'done'))} | "
                f"{_seen(c)} | "
                f"`{_cell(what)}` | {_cell(c.get('shrink', 'complete'))} |"
            )
        out.append("")

    switching = r.get("switching")
    if switching:
        verdict = {True: "holds", False: "**fails**", None: ""}[switching.get("ok")]
        text = verdict or first_line(switching.get("message"))
        out.append(f"Switching (the switch as state, `switching`): {_cell(text)}\n")

    out.extend(run)

    if r.get("not_covered"):
        out.append("## Not covered by the target\n")
        for n in r["not_covered"]:
            out.append(f"- {n.get('target', r.get('target'))} `{n.get('op')}`: {n.get('reason')}")
        out.append("")

    own = [p for p in r.get("properties", []) or [] if not p.get("builtin", True)]
    if own:  # users' properties (PropertySpec): what each checks, beside the built-in ones
        out.append("## Properties declared outside bi_props\n")
        for p in own:
            control = " (switch off: a negative control)" if p.get("control") else ""
            out.append(f"- `{p.get('name')}`: {p.get('description') or 'no description'}{control}")
        out.append("")

    from ..model.modes import mode_lines

    modes = mode_lines(r)  # compiled mode: modes drawn, compile time, modes not applicable
    if modes:
        out.append("## Execution modes (eager, compiled)\n")
        out.extend(f"- {line}" for line in modes)
        out.append("")

    if r.get("routing_notes"):
        out.append("## Routing warnings\n")
        out.extend(f"- {note}" for note in r["routing_notes"])
        out.append("")

    if r.get("routing_not_observable"):
        out.append("## Routing not observable (not a pass)\n")
        for n in r["routing_not_observable"]:
            declared = " (declared by the target)" if n.get("declared") else ""
            out.append(
                f"- {n.get('target', r.get('target'))} `{n.get('op')}` [{n.get('switch')}]"
                f"{declared}: {n.get('reason')}"
            )
        out.append("")

    if r.get("unclaimed"):
        out.append("## Ops the target does not claim, with the switch on\n")
        for n in r["unclaimed"]:
            out.append(f"- {n.get('target', r.get('target'))} `{n.get('op')}`: {unclaimed_text(n)}")
        out.append("")

    out.append("## Cells\n")
    out.append("| target | cell | examples (campaign) | this run | examples/s | status |")
    out.append("| --- | --- | --- | --- | --- | --- |")
    for c in data.cells:
        status, found = data.cell_status(c)
        seconds = c.get("seconds") or 0
        rate = f"{c.get('examples', 0) / seconds:.1f}" if seconds else ""
        if not found and c.get("examples") and c.get("examples_this_run") == 0:
            status += " (not run this run)"
        out.append(
            f"| {_cell(c['target'])} | {_cell(cell_name(c['op'], c['property'], c['switch']))} "
            f"| {c.get('examples', 0)} | {c.get('examples_this_run', '')} | {rate} | {status} |"
        )
    out.append("")

    out.extend(_batch_reach(r))
    out.extend(_size_reach(r))
    out.extend(_sweeps(r))

    out.append(f"## Coverage ({data.lines} examples recorded in examples.jsonl)\n")
    rows = sorted(data.coverage.values(), key=lambda row: -row.total)
    if not rows:
        out.append(
            "No coverage lines: no example was recorded (no cell ran, or examples.jsonl is "
            "missing).\n"
        )
    else:
        out.append(
            "| target | op | property | switch | dtype | layouts | shape bucket | examples "
            "| outcomes |"
        )
        out.append("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for row in rows[:MAX_COVERAGE_ROWS]:
            outcomes = ", ".join(f"{k} {v}" for k, v in sorted(row.outcomes.items()))
            out.append(
                f"| {_cell(row.target)} | {_cell(row.op)} | {_cell(row.property)} | "
                f"{_cell(row.switch)} | {_cell(row.dtype)} | {_cell(row.layout)} | "
                f"{_cell(row.bucket)} | {row.total} | {_cell(outcomes)} |"
            )
        if len(rows) > MAX_COVERAGE_ROWS:
            out.append(f"\n{len(rows) - MAX_COVERAGE_ROWS} more rows in report.html.")
        out.append("")
    return "\n".join(out) + "\n"


def _accepts_more(r: dict, wider: list) -> list[str]:
    """The contract widenings (parity's kind ``widening``: the switch-on kernel returns where
    stock raises), apart from the failures: each with its case. They fail the run only under
    ``--strict-contract``."""
    if not wider:
        return []
    how = (
        "**--strict-contract: these fail the run (exit 1).**"
        if strict_contract(r)
        else "Not failures (exit 0 on their own); `--strict-contract` fails on them."
    )
    out = [
        f"## {ACCEPTS_MORE[0].upper()}{ACCEPTS_MORE[1:]} (contract widening)\n",
        "With the switch on the op returns a result where stock PyTorch raises: the kernels "
        f"accept more than the op's contract. {how}\n",
    ]
    for s in wider:
        f = s.finding
        stock = f" (stock raised {f['error_type']})" if f.get("error_type") else ""
        out.append(
            f"- {_cell(f.get('target', r.get('target')))} "
            f"{cell_name(f.get('op'), f.get('property'), f.get('switch'))}{stock}, "
            f"{fresh_process(f)}: `{f.get('case')}`"
        )
    out.append("")
    return out


def _crossed(counts: dict) -> str:
    shown = [f"{t}: {n}" for t, n in counts.items() if n]
    return ", ".join(shown) if shown else "none"


def _batch_reach(r: dict) -> list[str]:
    """Per batched cell: the largest batch-wide quantities its batches reached, and how often
    each named threshold lay between the needle alone and its batch (a kernel switching there
    could show). A threshold never crossed is one the cell says nothing about."""
    entries = merge_reach(
        [{"target": r.get("target"), **e} for e in r.get("batch_reach", []) or []]
    )
    if not entries:
        return []
    out = [
        "## Batches reached (this run)\n",
        "Largest batch-wide quantities per batched cell, and per named threshold how many "
        "examples crossed it (the needle alone below it, its batch at or above it); then how "
        "many examples held a companion of each content other than plain, and for ops with "
        "per-request parameters the mixes reached (a batch-mate asking for what the needle "
        "does not).\n",
        "| target | cell | examples | largest total rows / sequences / longest / padded "
        "| total rows crossed | sequences crossed | longest crossed | padded crossed "
        "| companion contents |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for e in entries:
        largest = e["largest"]
        out.append(
            f"| {_cell(e['target'])} | {_cell(cell_name(e['op'], e['property'], e['switch']))} "
            f"| {e['examples']} | {largest['total_rows']} / {largest['sequences']} / "
            f"{largest['longest']} / {largest['padded']} | "
            f"{_crossed(e['crossed']['total_rows'])} | {_crossed(e['crossed']['sequences'])} | "
            f"{_crossed(e['crossed']['longest'])} | {_crossed(e['crossed']['padded'])} | "
            f"{_contents(e.get('contents') or {})}{_mixes(e.get('mixes') or {})} |"
        )
    out.append("")
    return out


def _size_reach(r: dict) -> list[str]:
    """Per cell of an op with a deployment axis: how many examples were drawn past the space's
    small sizes, the largest size reached and how many reached each named size."""
    entries = size_entries(r)
    if not entries:
        return []
    out = [
        "## Deployment sizes reached (this run)\n",
        "Per cell, along its op's axis (tokens: a batch's total rows; vocab: the last dimension; "
        "context: the longest sequence; positions: a rotary cache's): examples drawn past the "
        "space's small sizes, the largest reached, and how many examples reached each named "
        "size. A cell with none says nothing about a kernel switching at those sizes.\n",
        "| target | cell | axis | examples | past the small sizes | largest "
        "| named sizes reached |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for e in entries:
        deployed = e.get("deployed", 0)
        largest = str(e.get("largest", 0))
        if "needle_beside_longer" in e:
            largest += f" (needle beside a longer one: {e['needle_beside_longer']})"
        out.append(
            f"| {_cell(e['target'])} | {_cell(cell_name(e['op'], e['property'], e['switch']))} "
            f"| {e.get('axis')} | {e.get('examples', 0)} | {deployed if deployed else '**none**'} "
            f"| {largest} | {_crossed(e.get('reached') or {})} |"
        )
    out.append("")
    return out


def _contents(contents: dict) -> str:
    """ "outlier 12, ties 0, ...": a content never reached is listed with 0."""
    shown = [f"{c} {n}" for c, n in contents.items() if c != "plain"]
    return ", ".join(shown) or "-"


def _mixes(mixes: dict) -> str:
    """ "; parameter mixes: top_k 3, greedy 2": empty where the op has no request parameters."""
    shown = [f"{m} {n}" for m, n in mixes.items()]
    return f"; parameter mixes: {', '.join(shown)}" if shown else ""


def _sweeps(r: dict) -> list[str]:
    """The exhaustive 16-bit sweeps (campaigns/sweep.py): every bit pattern of a 16-bit dtype
    through an elementwise op, once per switch state; a failing one names its pattern."""
    entries = r.get("sweeps") or []
    if not entries:
        return []
    out = [
        "## Exhaustive 16-bit sweeps (this run)\n",
        "Every bit pattern of the dtype (NaN payloads, infinities and subnormals included) "
        "against the reference, with the op's stated bound.\n",
        "| target | op | switch | dtype | options | patterns | result | ULPs nearest the bound "
        "(observed / allowed) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for e in entries:
        if e.get("ok"):
            result = "all within the bound"
        else:
            result = f"**FAILS** at pattern {e.get('failing_pattern') or e.get('failing_case')}"
        observed, allowed = e.get("ulps_observed"), e.get("ulps_allowed")
        ulps = "-" if observed is None else f"{observed} / {allowed:.4g}"
        options = ", ".join(f"{k}={v}" for k, v in (e.get("options") or {}).items()) or "-"
        out.append(
            f"| {_cell(e.get('target') or r.get('target'))} | {_cell(e['op'])} | {e['switch']} | "
            f"{e['dtype']} | "
            f"{_cell(options)} | {e['patterns']} | {result} | {ulps} |"
        )
    out.append("")
    return out


def _seen(control: dict) -> str:
    text = control_seen_cell(control)
    return f"**{text}**" if text.startswith("NO") else text
