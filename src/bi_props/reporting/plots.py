"""The report's plots, as PNG bytes. matplotlib's Agg canvas only (no pyplot, no display, no
global backend switch), so rendering works headless, in threads and inside pytest."""

from __future__ import annotations

import io
import math
from collections import Counter

from .data import ReportData, axis_names, case_point, cell_name

OUTCOME_COLOURS = {
    "ok": "#2ca02c",
    "mismatch": "#d62728",
    "error": "#ff7f0e",
    "crash": "#9467bd",
    "timeout": "#8c564b",
    "not_covered": "#7f7f7f",
}
OTHER_COLOUR = "#17becf"
DPI = 100


def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def _png(figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI)
    return buffer.getvalue()


# Markers over the examples: the minimal failing case of a property, a control's smallest variant.
_STAR = {"marker": "*", "s": 260, "color": "gold", "edgecolors": "black", "linewidths": 1.0,
         "zorder": 5}  # fmt: skip
_DIAMOND = {"marker": "D", "s": 70, "facecolors": "none", "edgecolors": "black",
            "linewidths": 1.2, "zorder": 4}  # fmt: skip


def _colour(outcome: str) -> str:
    return OUTCOME_COLOURS.get(outcome, OTHER_COLOUR)


def shape_space(data: ReportData, op: str) -> bytes:
    """Where in shape space one op failed or stayed invariant: rows in the call (the batch's
    rows, or M) against the op's second shape entry, one panel per dtype, coloured by outcome;
    stars mark the minimal failing cases of findings, diamonds the negative controls' smallest
    batch-variant cases (switch off)."""
    points = data.points.get(op, [])
    stars = [
        (s.finding.get("property"), case_point(s.finding.get("case")))
        for s in data.statuses
        if s.finding.get("op") == op
    ]
    diamonds = [
        case_point(c.get("case")) for c in data.report.get("controls", []) if c.get("op") == op
    ]
    dtypes = sorted(
        {p[0] for p in points if p[0]}
        | {s[1][0] for s in stars if s[1] and s[1][0]}
        | {d[0] for d in diamonds if d and d[0]}
    ) or ["float32"]
    x_name, y_name = axis_names(op)
    figure = _figure(max(6.4, 4.2 * len(dtypes) + 0.6), 4.8)
    axes = figure.subplots(1, len(dtypes), squeeze=False)[0]
    for ax, dtype in zip(axes, dtypes, strict=True):
        mine = [p for p in points if p[0] == dtype]
        by_outcome: dict[str, list[tuple[int, int]]] = {}
        for _, x, y, outcome in mine:
            by_outcome.setdefault(outcome, []).append((x, y))
        for outcome in sorted(by_outcome, key=lambda o: (o != "ok", o)):
            xy = by_outcome[outcome]
            ok = outcome == "ok"
            ax.scatter(
                [p[0] for p in xy],
                [p[1] for p in xy],
                s=10 if ok else 28,
                alpha=0.35 if ok else 0.85,
                color=_colour(outcome),
                label=outcome,
                edgecolors="none",
            )
        marked = [(point, f"minimal failing case: {prop}", _STAR) for prop, point in stars]
        marked += [(point, "negative control: smallest variant", _DIAMOND) for point in diamonds]
        for point, label, style in marked:
            if point and point[0] == dtype:
                ax.scatter([point[1]], [point[2]], label=label, **style)
        ax.set_xscale("symlog", base=2, linthresh=1)
        ax.set_yscale("symlog", base=2, linthresh=1)
        ax.set_xlim(left=-0.3)
        ax.set_ylim(bottom=-0.3)
        failing = sum(1 for p in mine if p[3] != "ok")
        ax.set_title(f"{op}, {dtype}: {len(mine)} examples, {failing} failing", fontsize=10)
        ax.set_xlabel(x_name)
        ax.set_ylabel(y_name)
        ax.grid(True, alpha=0.3)
    legend: dict[str, object] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            legend.setdefault(label, handle)
    if legend:
        figure.legend(
            list(legend.values()),
            list(legend),
            loc="outside lower center",
            ncols=min(2 * len(dtypes), len(legend)),
            fontsize=8,
            markerscale=0.7,
            frameon=False,
        )
    return _png(figure)


def ulp_histogram(data: ReportData) -> bytes | None:
    """Distribution of max ULP distances (per property and switch), findings against what the
    negative controls saw; None when no message or coverage line states one."""
    if not data.ulps:
        return None
    groups: dict[str, list[int]] = {}
    for label, value in data.ulps:
        groups.setdefault(label, []).append(value)
    top = max(v for _, v in data.ulps)
    edges = [0.5] + [2.0**k for k in range(0, max(1, math.ceil(math.log2(top + 1))) + 1)]
    figure = _figure(7.5, 4.0)
    ax = figure.subplots()
    ax.hist(
        list(groups.values()),
        bins=edges,
        label=[f"{k} ({len(v)})" for k, v in groups.items()],
        stacked=True,
        edgecolor="white",
    )
    ax.set_xscale("log", base=2)
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.set_xlabel("max ULP distance (log2 bins)")
    ax.set_ylabel("count")
    ax.set_title("ULP distances: findings and negative controls")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    return _png(figure)


def coverage_chart(data: ReportData) -> bytes | None:
    """Examples per cell, stacked by outcome (from examples.jsonl)."""
    per_cell: dict[str, Counter] = {}
    for row in data.coverage.values():
        name = cell_name(row.op, row.property, row.switch)
        if len(data.targets) > 1:
            name = f"{row.target}: {name}"
        per_cell.setdefault(name, Counter()).update(row.outcomes)
    if not per_cell:
        return None
    names = sorted(per_cell)
    outcomes = sorted({o for c in per_cell.values() for o in c}, key=lambda o: (o != "ok", o))
    figure = _figure(8.0, max(2.6, 0.28 * len(names) + 1.4))
    ax = figure.subplots()
    left = [0] * len(names)
    for outcome in outcomes:
        counts = [per_cell[n][outcome] for n in names]
        ax.barh(names, counts, left=left, color=_colour(outcome), label=outcome)
        left = [a + b for a, b in zip(left, counts, strict=True)]
    ax.invert_yaxis()
    ax.set_xlabel("examples")
    ax.set_title("Examples per cell, by outcome")
    ax.tick_params(axis="y", labelsize=7)
    ax.legend(fontsize=8, loc="lower right")
    return _png(figure)
