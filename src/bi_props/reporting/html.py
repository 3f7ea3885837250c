"""``DIR/report.html``: one self-contained page (inline CSS, plots as base64 PNGs, no scripts,
nothing fetched), so a CI artifact opens anywhere."""

from __future__ import annotations

import base64
from html import escape

from .data import (
    BLIND_CONTROL,
    ReportData,
    blind_controls,
    cell_name,
    control_seen_cell,
    fails_run,
    fresh_process,
    round_counts,
)
from .markdown import first_line
from .verdict import verdict_line

CSS = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
th { background: #f2f2f2; }
pre { background: #f7f7f7; padding: 0.6em; overflow-x: auto; font-size: 0.85em; }
.status { font-weight: bold; padding: 0 0.4em; border-radius: 3px; color: white;
  background: #455a64; }
.complete { background: #2e7d32; }
.incomplete, .interrupted { background: #ef6c00; }
.new, .regression, .still-failing { background: #c62828; }
.not-seen-this-run { background: #ef6c00; }
.known { background: #6d4c41; }
.fixed, .passed { background: #2e7d32; }
.not-run, .skipped { background: #757575; }
img { max-width: 100%; border: 1px solid #ddd; margin: 0.5em 0; }
.scroll { max-height: 480px; overflow-y: auto; }
"""


def _badge(status: str) -> str:
    return f'<span class="status {escape(status.replace(" ", "-"))}">{escape(status)}</span>'


def _img(png: bytes | None, alt: str) -> str:
    if not png:
        return f"<p><em>{escape(alt)}: nothing to plot (no example recorded for it).</em></p>"
    encoded = base64.b64encode(png).decode("ascii")
    return f'<img alt="{escape(alt)}" src="data:image/png;base64,{encoded}">'


def _table(headers: list[str], rows: list[list[str]], raw: bool = False) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f"<td>{c if raw else escape(str(c))}</td>" for c in row) + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def render(data: ReportData, plots: bool = True) -> str:
    r = data.report
    campaign = r.get("campaign") or {}
    parts: list[str] = []
    failing = [s for s in data.statuses if fails_run(s, r)]
    title = f"bi_props campaign: {', '.join(data.targets)}"
    parts.append(f"<h1>{escape(title)}</h1>")
    parts.append(f'<p class="verdict"><b>Verdict.</b> {escape(verdict_line(data))}</p>')
    summary = [
        ["status", _badge(str(r.get("status", "not recorded")))],
        ["targets", escape(", ".join(data.targets))],
        ["profile", escape(f"{r.get('profile')} ({r.get('strategies')})")],
        ["open findings", _badge(str(len(failing))) if failing else "none"],
        [
            "examples",
            escape(
                f"{r.get('examples_this_run', r.get('examples', 0))} this run, "
                f"{r.get('examples', 0)} in the campaign"
            ),
        ],
        ["elapsed", escape(f"{r.get('elapsed_s', 0):.0f} s")],
    ]
    if "seed" in r:
        summary.append(["campaign seed", f"<code>{escape(str(r['seed']))}</code>"])
    rounds = r.get("rounds") or []
    if rounds:
        this_run, total = round_counts(rounds, campaign.get("run"))
        summary.append(["rounds", escape(f"{this_run} this run, {total} in the campaign")])
    rate = (campaign.get("throughput") or {}).get("examples_per_s")
    if rate:
        summary.append(["throughput (cells)", escape(f"{rate:.1f} examples/s")])
    if campaign.get("interrupted"):
        summary.append(["interrupted", "yes: the report holds everything found until then"])
    run_table = ["<h2>Run</h2>", _table(["", ""], summary, raw=True)]

    parts.append("<h2>Findings</h2>")
    if not data.statuses:
        parts.append(
            f"<p>None: no property failed in {escape(str(r.get('examples', 0)))} examples.</p>"
        )
    for i, s in enumerate(data.statuses, 1):
        f = s.finding
        parts.append(
            f"<h3>{i}. {escape(cell_name(f.get('op'), f.get('property'), f.get('switch')))} on "
            f"{escape(str(f.get('target')))}: {escape(str(f.get('kind')))} {_badge(s.status)}</h3>"
            f"<p>{escape(s.note)}; fresh process: {escape(fresh_process(f))}</p>"
            + (
                f"<p>Shrinking {escape(str(f['shrink']))}.</p>"
                if f.get("shrink", "complete") != "complete"
                else ""
            )
            + f"<pre>{escape(str(f.get('case', '')))}</pre>"
            f"<pre>{escape(str(f.get('message', '')))}</pre>"
        )

    plot_parts: list[str] = []  # shown after the findings and the controls
    if plots:
        try:
            import matplotlib  # noqa: F401  (the `report` extra)

            from . import plots as p
        except ImportError:  # pragma: no cover - matplotlib is the `report` extra
            p = None
            plot_parts.append(
                "<p><em>Plots need matplotlib: <code>pip install 'bi_props[report]'</code>, "
                "then <code>bi-props report DIR</code>.</em></p>"
            )
        if p is not None:
            plot_parts.append("<h2>Shape space: where each op failed or stayed invariant</h2>")
            ops = sorted(data.points) or sorted({s.finding.get("op") for s in data.statuses})
            if not ops:
                plot_parts.append(
                    "<p><em>Empty: no example ran and nothing failed, so there is no shape to "
                    "place.</em></p>"
                )
            for op in ops:
                plot_parts.append(_img(p.shape_space(data, op), f"shape space of {op}"))
            plot_parts.append("<h2>ULP distances</h2>")
            plot_parts.append(_img(p.ulp_histogram(data), "ULP distances"))
            plot_parts.append("<h2>Examples per cell</h2>")
            plot_parts.append(_img(p.coverage_chart(data), "examples per cell"))

    parts.append("<h2>Negative controls (switch off)</h2>")
    controls = r.get("controls") or []
    if blind_controls(r):
        strict = " (--strict-controls: the run fails)" if r.get("strict_controls") else ""
        parts.append(
            f"<p><strong>{len(blind_controls(r))} blind control(s){escape(strict)}.</strong> "
            f"{escape(BLIND_CONTROL)}.</p>"
        )
    parts.append(
        _table(
            ["target", "op", "property", "variance seen", "smallest case", "what it saw"],
            [
                [
                    c.get("target", r.get("target")),
                    c.get("op"),
                    c.get("property"),
                    control_seen_cell(c),
                    c.get("case") or "",
                    first_line(c.get("message")),
                ]
                for c in controls
            ],
        )
        if controls
        else "<p>None ran: the campaign reached no switch-off batch-invariance cell.</p>"
    )
    parts.extend(run_table)
    parts.extend(plot_parts)

    if r.get("not_covered"):
        parts.append("<h2>Not covered by the target</h2>")
        parts.append(
            _table(
                ["target", "op", "reason"],
                [
                    [n.get("target", r.get("target")), n.get("op"), n.get("reason")]
                    for n in r["not_covered"]
                ],
            )
        )

    if r.get("routing_notes"):
        parts.append("<h2>Routing warnings</h2>")
        parts.append(_table(["warning"], [[note] for note in r["routing_notes"]]))
    if r.get("routing_not_observable"):
        parts.append("<h2>Routing not observable (not a pass)</h2>")
        parts.append(
            _table(
                ["target", "op", "switch", "reason"],
                [
                    [
                        n.get("target", r.get("target")),
                        n.get("op"),
                        n.get("switch"),
                        n.get("reason"),
                    ]
                    for n in r["routing_not_observable"]
                ],
            )
        )
    if r.get("unclaimed"):
        parts.append("<h2>Ops the target does not claim, with the switch on</h2>")
        parts.append(
            _table(
                [
                    "target",
                    "op",
                    "batch-variant with the switch on",
                    "property",
                    "examples",
                    "smallest case seen",
                ],
                [
                    [
                        n.get("target", r.get("target")),
                        n.get("op"),
                        "yes" if n.get("batch_variant") else "no",
                        n.get("property"),
                        n.get("examples"),
                        n.get("case") or "",
                    ]
                    for n in r["unclaimed"]
                ],
            )
        )

    parts.append("<h2>Cells</h2>")
    cell_rows = []
    for c in data.cells:
        status, _ = data.cell_status(c)
        cell_rows.append(
            [
                escape(str(c["target"])),
                escape(cell_name(c["op"], c["property"], c["switch"])),
                escape(str(c.get("examples", 0))),
                escape(str(c.get("examples_this_run", ""))),
                _badge(status),
            ]
        )
    parts.append(_table(["target", "cell", "examples", "this run", "status"], cell_rows, raw=True))

    parts.append(f"<h2>Coverage ({data.lines} examples in examples.jsonl)</h2>")
    rows = sorted(data.coverage.values(), key=lambda row: -row.total)
    parts.append(
        '<div class="scroll">'
        + _table(
            [
                "target",
                "op",
                "property",
                "switch",
                "dtype",
                "layouts",
                "shape bucket",
                "examples",
                "outcomes",
            ],
            [
                [
                    row.target,
                    row.op,
                    row.property,
                    row.switch,
                    row.dtype,
                    row.layout,
                    row.bucket,
                    row.total,
                    ", ".join(f"{k} {v}" for k, v in sorted(row.outcomes.items())),
                ]
                for row in rows
            ],
        )
        + "</div>"
        if rows
        else "<p>No coverage lines: no example was recorded (no cell ran, or examples.jsonl "
        "is missing).</p>"
    )
    if rounds:
        parts.append("<h2>Rounds</h2>")
        parts.append(
            "<p>Round <i>r</i> of a target uses the seed <code>round_seed(seed, target, r)</code> "
            "(<code>bi_props.campaigns.campaign</code>); <code>--seed SEED</code> replays a run."
            "</p>"
        )
        parts.append(
            _table(
                ["run", "target", "rounds", "seed"],
                [
                    [
                        x.get("run"),
                        x.get("target"),
                        f"{x.get('first')}-{x.get('last')}",
                        x.get("seed"),
                    ]
                    for x in rounds
                ],
            )
        )
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{escape(title)}</title><style>{CSS}</style></head><body>\n"
        + "\n".join(parts)
        + "\n</body></html>\n"
    )
