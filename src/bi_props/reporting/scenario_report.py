"""The report of an engine-scenario campaign (``bi-props scenarios``): report.json, report.md,
report.html (the timelines drawn as inline SVG: no plotting library, nothing fetched) and one
reproducer per finding in ``repro/``.

A reproducer is a Python file that puts a fresh process in the finding's state, rebuilds the
engine (bi_props' tiny model and driver for ``vllm-engine``), replays the shrunk scenario and its
twin, prints the timeline and the first diverging token, and exits 1 when the finding reproduces,
0 when it does not, 2 when something else failed (bi_props' own driver, an import).
"""

from __future__ import annotations

import importlib.util
import json
from html import escape
from pathlib import Path
from typing import Any

from ..model.scenario_judge import PROPERTIES
from .html import CSS, _table

PHASE_COLOURS = {"prefill": "#4c72b0", "decode": "#55a868", "recompute": "#c44e52"}


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def repro_name(index: int, finding: dict[str, Any]) -> str:
    prop = "".join(c if c.isalnum() else "_" for c in finding["prop"]).strip("_")
    return f"repro/scenario_{index}_{finding['state']}_{prop}.py"


def _verdict_cell(row: dict[str, Any]) -> str:
    counts = f"judged {row['judged']}, n/a {row['not_applicable']}"
    if row["skipped"]:
        counts += f", not replayed (budget) {row['skipped']}"
    if row["verdict"] == "FAILED":
        return f"**FAILED** ({', '.join(row['findings'])}; {counts})"
    if row["verdict"] in ("state broken", "worker failed"):
        return row["verdict"]
    return f"{row['verdict']} ({counts})"


def state_names(report: dict[str, Any]) -> list[str]:
    return [s["state"] for s in report["states"]]


def verdict_table(report: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    """(headers, rows): property down, state across."""
    names = state_names(report)
    by = {(r["state"], r["prop"]): r for r in report["verdicts"]}
    rows = [
        [prop, *(_verdict_cell(by[(s, prop)]) for s in names if (s, prop) in by)]
        for prop in PROPERTIES
    ]
    return ["property", *names], rows


def headline(report: dict[str, Any]) -> str:
    n = len(report["findings"])
    states = ", ".join(
        f"{s['state']}: "
        + ("broken" if s.get("broken") else "worker failed" if s.get("failed") else "ran")
        for s in report["states"]
    )
    return (
        f"{n} finding(s) on {report['target']} in {report['seconds']:.0f} s "
        f"(budget {report['budget_s']:.0f} s; up to {report['examples']} scenarios per search; "
        f"states {states})"
    )


def _state_rows(report: dict[str, Any]) -> list[list[str]]:
    rows = []
    for s in report["states"]:
        first = (
            f"raised: {s['broken']}"
            if s.get("broken")
            else (f"worker failed: {s['failed']}" if s.get("failed") else "ran")
        )
        calls = s.get("kernel_calls") or {}
        kernels = ", ".join(f"{k.split('::')[-1]} {v}" for k, v in calls.items()) or "none"
        facts = ", ".join(f"{k}={v}" for k, v in (s.get("facts") or {}).items())
        rows.append(
            [
                s["state"],
                s.get("description", ""),
                facts,
                kernels,
                first.split("\n")[0][:300],
                f"{s.get('seconds', 0):.0f}",
            ]
        )
    return rows


STATE_HEADERS = [
    "state",
    "what it is",
    "read back in the worker",
    "bi_props kernel calls (canary replay)",
    "first forward",
    "seconds",
]


def train_rollout_lines(report: dict[str, Any]) -> list[str]:
    """Per state: how many needles the trainer's view matched bitwise, the largest |delta
    logprob|, the first diverging token, and a row per measured scenario."""
    lines = [
        "## Train/rollout agreement",
        "",
        "The trainer's view: the same model through a plain transformers forward (batch of one, "
        "float32, in the state's process and so with its kernels), the logprob of each token the "
        "engine generated for the needle, against the engine's own.",
        "",
    ]
    for s in report["states"]:
        tr = s.get("train_rollout")
        if not tr:
            lines.append(f"- {s['state']}: not measured (the state did not run)")
            continue
        if not tr.get("measured"):
            lines.append(f"- {s['state']}: not measured ({tr.get('why')})")
            continue
        rows = tr["rows"]
        ok = [r for r in rows if "error" not in r]
        equal = sum(r["bitwise"] for r in ok)
        worst = max((r["max_abs_delta"] for r in ok), default=0.0)
        first = next((r for r in ok if not r["bitwise"]), None)
        text = (
            f"- {s['state']}: {equal} of {len(ok)} needles bitwise equal; max |delta logprob| "
            f"{worst:.3g}"
        )
        if first:
            d = first["first_diverging"]
            text += (
                f"; first diverging: token {d['index']} ({d['token']}), engine {d['engine']!r} "
                f"vs trainer {d['trainer']!r} in `{first['scenario']}`"
            )
        errors = len(rows) - len(ok)
        if errors:
            text += f"; {errors} not measured (the trainer raised: {rows[0].get('error', '')})"
        lines.append(text)
    return [*lines, ""]


def render_markdown(report: dict[str, Any]) -> str:
    lines = [
        f"# bi_props engine scenarios: {report['target']}",
        "",
        f"**Verdict.** {headline(report)}.",
        "",
        "## States (each in its own process)",
        "",
        "| " + " | ".join(STATE_HEADERS) + " |",
        "|" + "---|" * len(STATE_HEADERS),
    ]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in _state_rows(report)]
    headers, rows = verdict_table(report)
    lines += [
        "",
        "## Verdicts: property x state",
        "",
        "Counts are scenarios judged (generation and shrinking), not applicable (the property "
        "says nothing about them), and drawn after the budget ran out (never counted as passes).",
        "",
        "| " + " | ".join(headers) + " |",
        "|" + "---|" * len(headers),
    ]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    lines += ["", *train_rollout_lines(report), "## Findings", ""]
    if not report["findings"]:
        lines.append("None.")
    for i, f in enumerate(report["findings"]):
        lines += [f"### {i}. {f['state']} / {f['prop']}: {f['kind']}", "", f"{f['message']}", ""]
        if f["kind"] == "state broken":
            lines += ["The state's first forward (a canary replay) raised; nothing ran in it.", ""]
            continue
        lines += [
            f"- features on: {', '.join(f['features']) or '(none)'}",
            f"- search: {f['pass']} space (also failed in: "
            f"{', '.join(f.get('also_failed_in') or []) or 'no other'}); reproduced on a fresh "
            f"replay: {f.get('reproduced')}",
            f"- reproducer: `{f.get('repro', '')}` (`python {f.get('repro', '')}`)",
            "",
            "```python",
            f["scenario"],
            "```",
            "",
            f"compared with `{f['twin']}`",
            "",
        ]
        if f.get("timeline"):
            lines += ["Timeline (the scenario):", "", "```", f["timeline"], "```", ""]
        if f.get("twin_timeline"):
            lines += ["Timeline (its twin):", "", "```", f["twin_timeline"], "```", ""]
    lines += [
        "## Searches",
        "",
        "| state | space | property | judged | n/a | skipped | replays | seconds | finding |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for s in report["states"]:
        for r in s.get("searches", []):
            f = r["finding"]
            lines.append(
                f"| {s['state']} | {r['pass']} | {r['prop']} | {r['examples']} | "
                f"{r['not_applicable']} | {r['skipped']} | {r['replays']} | {r['seconds']} | "
                f"{_cell(f['kind'] + ': ' + f['message'][:160]) if f else 'none'} |"
            )
    observed = [f"{s['state']}: {s.get('observed') or {}}" for s in report["states"]]
    lines += ["", "What the engine did in each state's replays: " + "; ".join(observed), ""]
    return "\n".join(lines)


def timeline_svg(data: dict[str, Any], title: str = "") -> str:
    """A timeline as an SVG grid: a column per engine step, a row per request; each cell the
    request's phase in that step (prefill blue, decode green, recompute red) and its tokens, so
    chunk boundaries show as consecutive prefill cells. Rows name prefix-cache hits and
    preemptions."""
    steps = data.get("steps") or []
    requests = sorted({e[0] for step in steps for e in step})
    cached, preempted = data.get("cached") or {}, data.get("preempted") or {}
    label_w, cell_w, cell_h, top = 190, 44, 22, 34
    width = label_w + cell_w * max(1, len(steps)) + 10
    height = top + cell_h * max(1, len(requests)) + 10
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" class="timeline" width="{width}" '
        f'height="{height}" font-family="sans-serif" font-size="11">',
        f'<text x="4" y="14" font-weight="bold">{escape(title)}</text>',
    ]
    for j in range(len(steps)):
        x = label_w + j * cell_w + cell_w / 2
        parts.append(f'<text x="{x}" y="{top - 6}" text-anchor="middle">step {j}</text>')
    row = {r: k for k, r in enumerate(requests)}
    for r, k in row.items():
        notes = []
        if str(r) in cached:
            notes.append(f"cache hit {cached[str(r)]}")
        if str(r) in preempted:
            notes.append(f"preempted {preempted[str(r)]}x")
        label = f"r{r}" + (f" ({', '.join(notes)})" if notes else "")
        y = top + k * cell_h + cell_h * 0.7
        parts.append(f'<text x="4" y="{y}">{escape(label)}</text>')
    for j, step in enumerate(steps):
        for r, phase, tokens in step:
            x, y = label_w + j * cell_w, top + row[r] * cell_h
            colour = PHASE_COLOURS.get(phase, "#888888")
            parts.append(
                f'<rect class="{escape(phase)}" x="{x + 1}" y="{y + 1}" width="{cell_w - 2}" '
                f'height="{cell_h - 2}" fill="{colour}"><title>step {j}: r{r} {escape(phase)} '
                f"{tokens}</title></rect>"
            )
            short = {"prefill": "P", "decode": "D", "recompute": "R"}.get(phase, "?")
            parts.append(
                f'<text x="{x + cell_w / 2}" y="{y + cell_h * 0.7}" text-anchor="middle" '
                f'fill="white">{short}{tokens}</text>'
            )
    parts.append("</svg>")
    return "".join(parts)


def render_html(report: dict[str, Any]) -> str:
    headers, rows = verdict_table(report)
    body = [
        f"<h1>bi_props engine scenarios: {escape(report['target'])}</h1>",
        f"<p><strong>Verdict.</strong> {escape(headline(report))}.</p>",
        "<h2>States (each in its own process)</h2>",
        _table(STATE_HEADERS, _state_rows(report)),
        "<h2>Verdicts: property x state</h2>",
        _table(headers, [[c.replace("**", "") for c in row] for row in rows]),
    ]
    tr = train_rollout_lines(report)
    body.append(f"<h2>{escape(tr[0][3:])}</h2><p>{escape(tr[2])}</p><ul>")
    body += [f"<li>{escape(line[2:])}</li>" for line in tr[4:] if line]
    body += ["</ul>", "<h2>Findings</h2>"]
    if not report["findings"]:
        body.append("<p>None.</p>")
    legend = ", ".join(f'<span style="color:{c}">{p}</span>' for p, c in PHASE_COLOURS.items())
    for i, f in enumerate(report["findings"]):
        body.append(
            f"<h3>{i}. {escape(f['state'])} / {escape(f['prop'])}: {escape(f['kind'])}</h3>"
        )
        body.append(f"<pre>{escape(f['message'])}</pre>")
        if f["kind"] == "state broken":
            continue
        body += [
            f"<p>features on: {escape(', '.join(f['features']) or '(none)')}; reproduced on a "
            f"fresh replay: {escape(str(f.get('reproduced')))}; reproducer "
            f"<code>{escape(f.get('repro', ''))}</code></p>",
            f"<pre>{escape(f['scenario'])}</pre>",
            f"<p>compared with <code>{escape(f['twin'])}</code></p>",
            f"<p>Timelines ({legend}; P16 = 16 prompt tokens in that step):</p>",
        ]
        if f.get("steps"):
            body.append(timeline_svg(f["steps"], "the scenario"))
        if f.get("twin_steps"):
            body.append(timeline_svg(f["twin_steps"], "its twin"))
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'>"
        f"<title>bi_props engine scenarios: {escape(report['target'])}</title>"
        f"<style>{CSS}</style></head><body>{''.join(body)}</body></html>\n"
    )


REPRO = '''#!/usr/bin/env python3
"""bi_props engine-scenario reproducer: {prop} in state {state!r} on {target}.

Found: {message}
Features on: {features}
Run: python {name}   (exit 1: reproduces; 0: does not; 2: something else failed)
It puts this fresh process in the state, rebuilds the engine (bi_props' tiny random model and its
add_request / step driver for vllm-engine: needs bi_props and vLLM installed), replays the
scenario and its twin, and prints the timeline and where the two first differ.
"""

import sys

TARGET = {target!r}
STATE = {state!r}
PROPERTY = {prop!r}
SCENARIO = {scenario!r}
EXTRA_PATH = {extra_path!r}  # where a module target lives (none for vllm-engine)


def main():
    sys.path[:0] = EXTRA_PATH
    from bi_props.targets.engine_states import apply_state, replay_for

    apply_state(STATE)  # before vLLM is imported: the switch and the kernels are process-wide
    from bi_props.model.scenario import parse_scenario
    from bi_props.model.scenario_judge import judge

    replay = replay_for(TARGET, STATE)
    scenario = parse_scenario(SCENARIO)
    print("state:", STATE, "| property:", PROPERTY)
    print("scenario:", scenario)
    print("features on:", ", ".join(scenario.features()) or "(none)")
    try:
        verdict = judge(PROPERTY, scenario, replay)
    except Exception as exc:
        if type(exc).__name__ == "DriverError":
            raise
        print(f"REPRODUCES: the engine raised {{type(exc).__name__}}: {{exc}}")
        return 1
    if verdict is None:
        print("the property does not apply to this scenario")
        return 2
    print("compared with:", verdict.twin)
    print("timeline:")
    print(verdict.actual.render_timeline(scenario.config))
    if verdict.held:
        print("does not reproduce: the needle came out bitwise equal")
        return 0
    print("REPRODUCES:", verdict.message)
    return 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as exc:  # not the finding: the reproducer itself could not run
        print(f"could not run: {{type(exc).__name__}}: {{exc}}")
        sys.exit(2)
'''


def _extra_path(target: str) -> list[str]:
    module = target.partition(":")[0]
    if ":" not in target:
        return []
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        return []
    if spec is None or not spec.origin:
        return []
    return [str(Path(spec.origin).resolve().parent)]


def repro_script(finding: dict[str, Any], name: str) -> str:
    return REPRO.format(
        prop=finding["prop"],
        state=finding["state"],
        target=finding["target"],
        message=finding["message"].replace('"""', "'''").replace("\\", "/"),
        features=", ".join(finding["features"]) or "(none)",
        name=name,
        scenario=finding["scenario"],
        extra_path=_extra_path(finding["target"]),
    )


def write_all(report: dict[str, Any], out: Path) -> dict[str, Path]:
    """report.json, report.md, report.html and repro/*.py (paths noted in each finding)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "repro").mkdir(exist_ok=True)
    for i, f in enumerate(report["findings"]):
        if f["kind"] == "state broken":
            continue
        name = repro_name(i, f)
        (out / name).write_text(repro_script(f, name))
        f["repro"] = name
    paths = {
        "json": out / "report.json",
        "markdown": out / "report.md",
        "html": out / "report.html",
    }
    paths["json"].write_text(json.dumps(report, indent=1, default=str))
    paths["markdown"].write_text(render_markdown(report))
    paths["html"].write_text(render_html(report))
    return paths
