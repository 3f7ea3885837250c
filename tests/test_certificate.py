"""The certificate of a run (reporting/certificate.py): verdict, scope, evidence, provenance, the
rule of three per switch-on cell and what was not measured; written beside every report and
printed by ``bi-props certify DIR``, whose exit status is the verdict's."""

from __future__ import annotations

import json
from pathlib import Path

from bi_props.cli import main
from bi_props.reporting import certificate, write_reports
from bi_props.reporting.data import load
from test_reporting import campaign_dir  # noqa: F401  (a fixture: four findings)


def _passing_dir(tmp_path: Path, judged: int = 40) -> Path:
    """A clean run of one claimed op: routing not observable, one blind control."""
    report = {
        "target": "lib",
        "targets": ["lib"],
        "profile": "cpu",
        "environment": {"python": "3.11", "torch": "2.13.0+cpu", "device": "cpu"},
        "command": "bi-props fuzz --target lib --budget 60",
        "bi_props": "0.1.0 (commit abc)",
        "examples": judged * 2,
        "elapsed_s": 61.0,
        "findings": [],
        "controls": [
            {"op": "mm", "property": "batch_invariance", "variance_seen": True, "target": "lib"},
            {"op": "sum", "property": "batch_invariance", "variance_seen": False},
        ],
        "routing_not_observable": [{"op": "mm", "switch": "enabled", "reason": "no profiler"}],
        "evidence": {
            "min_judged": 10,
            "thin": [],
            "judged": judged,
            "rows_judged": 900,
            "ops": [
                {
                    "op": "mm",
                    "claimed": True,
                    "judged": {"reference": judged, "batch_invariance": 2},
                    "p": 0.1,
                    "power": 0.93,
                    "p_hits": 3,
                    "p_judged": 30,
                    "stock": "variant",
                }
            ],
        },
        "size_reach": [
            {
                "target": "lib",
                "op": "mm",
                "property": "batch_invariance",
                "switch": "enabled",
                "axis": "tokens",
                "examples": 2,
                "largest": 2408,
                "reached": {"512": 1, "4096": 0},
            }
        ],
        "cells": [
            {"target": "lib", "op": "mm", "property": p, "switch": s, "examples": n}
            for p, s, n in [
                ("reference", "enabled", judged),
                ("batch_invariance", "enabled", 2),
                ("determinism", "enabled", 0),
            ]
        ],
        "campaign": {"runs": [{"run": 0, "seed": 7, "finished": "2026-12-07T19:00:00+00:00"}]},
    }
    (tmp_path / "report.json").write_text(json.dumps(report))
    lines = [
        {"op": "mm", "property": "reference", "switch": "enabled", "dtype": "float32",
         "shape": [2, 3, 4], "outcome": "ok"}
        for _ in range(judged)
    ]  # fmt: skip
    lines += [
        {"op": "mm", "property": "batch_invariance", "switch": "enabled", "dtype": "bfloat16",
         "shape": [1, 3, 4], "outcome": outcome}
        for outcome in ("ok", "ok", "degenerate")
    ]  # fmt: skip
    (tmp_path / "examples.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return tmp_path


def test_a_clean_run_passes_with_its_scope_evidence_and_gaps(tmp_path: Path) -> None:
    cert = certificate.build(load(_passing_dir(tmp_path)))
    assert cert["verdict"] == "PASS" and cert["exit_status"] == 0
    scope = cert["scope"]
    assert scope["device"] == "cpu" and scope["claimed_ops"] == ["mm"]
    assert scope["versions"]["torch"] == "2.13.0+cpu"
    assert scope["dtypes"] == ["bfloat16", "float32"]
    assert scope["sizes_reached"]["largest_by_axis"] == {"tokens": 2408}
    assert scope["sizes_reached"]["named_sizes_reached"] == {"tokens": [512]}
    prov = cert["provenance"]
    assert prov["command"].startswith("bi-props fuzz") and prov["seed"] == 7
    assert prov["bi_props"] == "0.1.0 (commit abc)"
    cells = {(c["property"], c["switch"]): c for c in cert["cells"]}
    assert cells["reference", "enabled"]["statement"] == (
        "no failure in 40 judged examples: failure rate < 0.075 (95%)"
    )
    # a degenerate example is not judged; two are too few for a bound; none is not measured
    assert cells["batch_invariance", "enabled"]["judged"] == 2
    assert "too few for a bound" in cells["batch_invariance", "enabled"]["statement"]
    assert cells["determinism", "enabled"]["statement"].startswith("not measured")
    gaps = "\n".join(cert["not_measured"])
    assert "mm determinism [enabled]: no judged example" in gaps
    assert "mm routing [enabled]: not observable (no profiler)" in gaps
    assert "negative control sum batch_invariance: blind" in gaps


def test_a_run_with_open_findings_fails(campaign_dir: Path) -> None:  # noqa: F811
    cert = certificate.build(load(campaign_dir))
    assert cert["verdict"] == "FAIL" and cert["exit_status"] == 1
    failing = [c for c in cert["cells"] if c["open_findings"]]
    assert failing and all(c["statement"].startswith("FAILED") for c in failing)
    assert "**FAIL**" in certificate.render(cert)


def test_thin_evidence_is_not_measured(tmp_path: Path) -> None:
    out = _passing_dir(tmp_path)
    report = json.loads((out / "report.json").read_text())
    report["evidence"]["thin"] = ["mm (batch_invariance: 2 judged < 10)"]
    (out / "report.json").write_text(json.dumps(report))
    cert = certificate.build(load(out))
    assert cert["verdict"] == "NOT MEASURED" and cert["exit_status"] == 3
    assert any(g.startswith("thin evidence: mm") for g in cert["not_measured"])


def test_reports_write_it_and_certify_prints_it_with_the_verdicts_status(
    tmp_path: Path, capsys
) -> None:
    out = _passing_dir(tmp_path)
    written = write_reports(out, plots=False)
    assert json.loads(written["certificate"].read_text())["verdict"] == "PASS"
    text = written["certificate_md"].read_text()
    assert text.startswith("# bi_props certificate: PASS")
    assert "| mm | 40 (< 0.075) | 2 | 0 |" in text  # reference, batch invariance, determinism
    assert main(["certify", str(out)]) == 0
    assert capsys.readouterr().out == text
    assert main(["certify", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["scope"]["claimed_ops"] == ["mm"]
    assert main(["certify", str(tmp_path / "nothing")]) == 2
