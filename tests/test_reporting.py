"""The campaign reports: report.md, junit.xml (valid JUnit structure), report.html (self-contained,
plots as PNGs that decode), the known/fixed statuses, and ``bi-props report``."""

from __future__ import annotations

import base64
import io
import json
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import pytest

from bi_props.cli import main
from bi_props.reporting import coverage_extras, max_ulp, write_reports
from bi_props.reporting.data import bucket, case_point, finding_statuses, known_entry, load

MM_CASE = (
    "Case(op='mm', entry='torch.mm', dtype='float32', shape=(1, 3, 2), "
    "layouts=('contiguous', 'contiguous'), values='general', seed=0, "
    "batch=Batch(position=0, companions=(Companion(seed=0, rows=63),)))"
)
MISMATCH = (
    "needle rows inside the batch (actual) vs alone (desired)\n"
    "Mismatched elements: 1 / 2 (50%)\n"
    "Max ULP difference (float32): 37\n"
)


def _finding(prop: str, switch: str = "enabled", kind: str = "mismatch", **extra) -> dict:
    return {
        "target": "lib",
        "op": "mm",
        "property": prop,
        "switch": switch,
        "kind": kind,
        "case": MM_CASE,
        "message": MISMATCH,
        "reproduced_in_fresh_process": True,
        "error_type": None,
        **extra,
    }


def _sig(f: dict) -> list:
    return [f[k] for k in ("target", "op", "property", "switch", "kind", "error_type")]


@pytest.fixture
def campaign_dir(tmp_path: Path) -> Path:
    """A campaign directory as `bi-props fuzz` leaves it: four findings of four statuses."""
    new = _finding("batch_invariance")
    still = _finding("reference", shrink="stopped at the end of the budget after 9 s of this cell")
    known = _finding("determinism")
    regressed = _finding("parity", switch="both", kind="error", error_type="TypeError")
    report = {
        "target": "lib",
        "targets": ["lib"],
        "profile": "dev",
        "strategies": "strategies/dev.toml",
        "environment": {},
        "examples": 900,
        "examples_this_run": 400,
        "elapsed_s": 61.0,
        "findings": [new, still, known, regressed],
        "controls": [
            {
                "op": "mm",
                "property": "batch_invariance",
                "variance_seen": True,
                "case": MM_CASE.replace("rows=63", "rows=1"),
                "message": "needle rows ...\nMax ULP difference (float32): 2\n",
                "target": "lib",
            }
        ],
        "not_covered": [{"op": "sum", "reason": "not claimed", "target": "lib"}],
        "seed": 42,
        "rounds": [{"run": 0, "target": "lib", "first": 0, "last": 4, "seed": 42}],
        "cells": [
            {
                "target": "lib",
                "op": "mm",
                "property": p,
                "switch": s,
                "examples": n,
                "examples_this_run": n,
                "seconds": 1.5,
            }
            for p, s, n in [
                ("routing", "enabled", 50),
                ("reference", "enabled", 40),
                ("batch_invariance", "enabled", 30),
                ("determinism", "enabled", 20),
                ("parity", "both", 20),
                ("routing", "disabled", 0),
            ]
        ],
        "campaign": {
            "run": 1,
            "runs": [{"run": 0}, {"run": 1}],
            "resumed": True,
            "finding_status": [
                {"signature": _sig(new), "status": "new"},
                {"signature": _sig(still), "status": "still failing"},
                {"signature": _sig(known), "status": "not seen this run"},
                {"signature": _sig(regressed), "status": "new"},
            ],
            "throughput": {"examples_per_s": 12.5},
        },
        "known": [
            {
                **{k: known[k] for k in ("target", "op", "property", "switch", "kind")},
                "error_type": None,
                "status": "known",
                "reason": "upstream #1",
            },
            {"signature": _sig(regressed), "status": "fixed"},
        ],
    }
    (tmp_path / "report.json").write_text(json.dumps(report))
    lines = []
    for i in range(60):
        dtype = ("float32", "bfloat16")[i % 2]
        lines.append(
            {
                "op": "mm",
                "property": "batch_invariance",
                "switch": "enabled",
                "dtype": dtype,
                "shape": [1 + i % 5, i % 17, 3],
                "layouts": ["contiguous", "transposed"],
                "values": "general",
                "batch_rows": 10 + i,
                "outcome": "mismatch" if i % 7 == 0 else "ok",
                "target": "lib",
                "round": i // 10,
            }
        )
    lines.append({**lines[0], "max_ulp": 9, "outcome": "mismatch"})
    text = "".join(json.dumps(line) + "\n" for line in lines)
    (tmp_path / "examples.jsonl").write_text(text + '{"op": "mm", "prop')  # a torn last line
    return tmp_path


class _Images(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.images: list[str] = []
        self.scripts = 0
        self.external: list[str] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "img":
            self.images.append(attrs["src"])
        if tag == "script":
            self.scripts += 1
        for key in ("src", "href"):
            if attrs.get(key, "").startswith(("http:", "https:", "//")):
                self.external.append(attrs[key])


def test_statuses_follow_the_campaign_and_the_known_list(campaign_dir: Path) -> None:
    report = json.loads((campaign_dir / "report.json").read_text())
    statuses = {s.finding["property"]: s for s in finding_statuses(report)}
    assert statuses["batch_invariance"].status == "new"
    assert statuses["reference"].status == "still failing"
    assert statuses["determinism"].status == "known"  # a known entry with error_type null
    assert statuses["parity"].status == "regression"  # marked fixed, failed again
    assert [p for p, s in statuses.items() if s.failing] == [
        "batch_invariance",
        "reference",
        "parity",
    ]
    # Marked fixed and not seen in this run: fixed, not failing.
    report["campaign"]["finding_status"][3]["status"] = "not seen this run"
    parity = next(s for s in finding_statuses(report) if s.finding["property"] == "parity")
    assert parity.status == "fixed" and not parity.failing
    # A finding the session itself marked known (known-failures file) counts as known.
    assert finding_statuses({"findings": [_finding("routing", status="known")]})[0].status == (
        "known"
    )


def test_known_entries_match_by_fields_or_signature_with_wildcards() -> None:
    f = _finding("reference", error_type="ValueError")
    assert known_entry(f, [{"op": "mm", "property": "reference"}]) is not None
    assert known_entry(f, [{"op": "mm", "property": "parity"}]) is None
    assert (
        known_entry(f, [{"target": "*", "op": "mm", "property": "reference", "error_type": None}])
        is not None
    )
    assert known_entry(f, [{"signature": _sig(f)}]) is not None
    assert known_entry(f, [{"signature": [*_sig(f)[:-1], "TypeError"]}]) is None


def test_ulp_parsing_and_the_coverage_helper() -> None:
    assert max_ulp(MISMATCH) == 37
    assert max_ulp("a\nMax ULP difference (bfloat16): 3\nMax ULP difference (float32): 12") == 12
    assert max_ulp("no numbers here") is None and max_ulp(None) is None

    class Verdict:
        ok = False
        message = MISMATCH

    assert coverage_extras(Verdict()) == {"max_ulp": 37}
    assert coverage_extras(type("V", (), {"message": "", "ok": True})()) == {}
    assert coverage_extras(type("V", (), {"max_ulp": 4, "message": ""})()) == {"max_ulp": 4}


def test_buckets_and_case_points() -> None:
    assert [bucket(n) for n in (0, 1, 2, 3, 4, 63, 64)] == [
        "0",
        "1",
        "2-3",
        "2-3",
        "4-7",
        "32-63",
        "64-127",
    ]
    assert case_point(MM_CASE) == ("float32", 64, 3)  # needle 1 row + 63 companion rows; K = 3
    assert case_point("Case(op='sum', dtype='bfloat16', shape=(5,), seed=0)") == ("bfloat16", 5, 5)
    assert case_point(None) is None


def test_junit_is_valid_and_carries_the_findings(campaign_dir: Path) -> None:
    write_reports(campaign_dir)
    root = ET.parse(campaign_dir / "junit.xml").getroot()
    assert root.tag == "testsuites"
    (suite,) = root.findall("testsuite")
    cases = suite.findall("testcase")
    assert {"name", "tests", "failures", "errors", "skipped", "time", "timestamp"} <= set(
        suite.attrib
    )
    assert int(suite.get("tests")) == len(cases) == 6 + 1  # six cells and one negative control
    failures = {c.get("name"): c.find("failure") for c in cases if c.find("failure") is not None}
    skipped = {c.get("name"): c.find("skipped") for c in cases if c.find("skipped") is not None}
    assert int(suite.get("failures")) == len(failures) == int(root.get("failures"))
    assert int(suite.get("skipped")) == len(skipped)
    assert set(failures) == {
        "mm batch_invariance [enabled]",
        "mm reference [enabled]",
        "mm parity [both]",
    }
    assert failures["mm batch_invariance [enabled]"].get("message").startswith("new: mismatch")
    assert "Max ULP difference (float32): 37" in failures["mm reference [enabled]"].text
    assert "shrink: stopped at the end of the budget" in failures["mm reference [enabled]"].text
    assert "shrink: complete" in failures["mm batch_invariance [enabled]"].text
    assert failures["mm parity [both]"].get("type") == "TypeError"
    assert "regression" in failures["mm parity [both]"].get("message")
    assert skipped["mm determinism [enabled]"].get("message").startswith("known failure")
    assert "not run" in skipped["mm routing [disabled]"].get("message")
    for case in cases:
        assert case.get("classname").startswith("bi_props.lib.")
        float(case.get("time"))


def test_html_is_self_contained_and_its_plots_are_pngs(campaign_dir: Path) -> None:
    from PIL import Image

    written = write_reports(campaign_dir)
    assert set(written) == {"markdown", "junit", "html", "certificate", "certificate_md"}
    parser = _Images()
    parser.feed((campaign_dir / "report.html").read_text())
    assert parser.scripts == 0 and parser.external == []
    assert len(parser.images) == 3  # shape space of mm, ULP histogram, examples per cell
    for src in parser.images:
        prefix = "data:image/png;base64,"
        assert src.startswith(prefix)
        png = base64.b64decode(src[len(prefix) :], validate=True)
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
        image = Image.open(io.BytesIO(png))
        image.load()
        assert image.width >= 400 and image.height >= 200
    html = (campaign_dir / "report.html").read_text()
    for text in ("regression", "still failing", "upstream #1", "Negative controls", "Shrinking"):
        assert text in html
    assert "<td>bfloat16</td>" in html and "<td>float32</td>" in html  # the coverage table


def test_report_data_aggregates_coverage(campaign_dir: Path) -> None:
    data = load(campaign_dir)
    assert data.lines == 61  # the torn line is skipped
    assert sum(row.total for row in data.coverage.values()) == 61
    assert {row.dtype for row in data.coverage.values()} == {"float32", "bfloat16"}
    assert data.outcomes["mismatch"] == sum(1 for i in range(60) if i % 7 == 0) + 1
    # Per-example ULPs were recorded, so the histogram uses them (plus the control's).
    assert ("batch_invariance [enabled]", 9) in data.ulps
    assert ("batch_invariance [disabled] (negative control)", 2) in data.ulps


def test_markdown_summarises(campaign_dir: Path) -> None:
    write_reports(campaign_dir, plots=False)
    text = (campaign_dir / "report.md").read_text()
    assert text.startswith("# bi_props campaign: lib (3 open finding(s))")
    assert "| campaign seed | `42` (replay: `--seed 42`) |" in text
    assert "| rounds | 0 this run, 5 in the campaign |" in text
    for status in ("**new**", "**still failing**", "**known**", "**regression**"):
        assert status in text
    assert MM_CASE in text
    # Only the finding whose shrink was cut says so.
    assert text.count("Shrinking stopped at the end of the budget after 9 s of this cell.") == 1
    assert "| lib | mm | batch_invariance | done | yes |" in text  # no state recorded: done
    assert "## Coverage (61 examples recorded in examples.jsonl)" in text


def test_an_older_report_without_campaign_keys_renders(tmp_path: Path) -> None:
    report = {
        "target": "cpu",
        "profile": "cpu",
        "examples": 3,
        "findings": [_finding("routing", target="cpu")],
        "controls": [],
        "not_covered": [],
    }
    (tmp_path / "report.json").write_text(json.dumps(report))
    write_reports(tmp_path)
    root = ET.parse(tmp_path / "junit.xml").getroot()
    names = [c.get("name") for c in root.iter("testcase")]
    assert names == ["mm routing [enabled]"]  # the cells come from the findings
    assert root.find("testsuite").get("name") == "bi_props.cpu"


def test_the_report_command(campaign_dir: Path, tmp_path: Path, capsys) -> None:
    for name in ("report.md", "junit.xml", "report.html"):
        (campaign_dir / name).unlink(missing_ok=True)
    assert main(["report", str(campaign_dir)]) == 0
    printed = capsys.readouterr().out.split()
    assert sorted(Path(p).name for p in printed) == [
        "certificate.json",
        "certificate.md",
        "junit.xml",
        "report.html",
        "report.md",
    ]
    assert all((campaign_dir / n).exists() for n in ("report.md", "junit.xml", "report.html"))
    assert main(["report", str(tmp_path / "nothing-here")]) == 2


def test_without_matplotlib_the_html_says_how_to_get_plots(campaign_dir: Path, monkeypatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` now fails
    write_reports(campaign_dir)
    html = (campaign_dir / "report.html").read_text()
    assert "<img" not in html and "pip install 'bi_props[report]'" in html
    assert "mm reference [enabled]" in html  # the tables are still there
    ET.parse(campaign_dir / "junit.xml")


@pytest.mark.parametrize("strict", [False, True])
def test_a_blind_control_is_flagged_in_every_report(tmp_path: Path, strict: bool) -> None:
    report = {
        "target": "cpu",
        "status": "complete",
        "strict_controls": strict,
        "examples": 3,
        "findings": [_finding("reference", target="cpu", kind="internal")],
        "controls": [
            {
                "op": "mm",
                "property": "batch_invariance",
                "variance_seen": False,
                "case": None,
                "message": "no batch_invariance violation seen in 200 examples",
            },
        ],
        "not_covered": [],
    }
    (tmp_path / "report.json").write_text(json.dumps(report))
    write_reports(tmp_path, plots=False)
    markdown = (tmp_path / "report.md").read_text()
    assert "| status | **complete** |" in markdown
    assert "**1 blind control(s)" in markdown and "**NO (blind)**" in markdown
    assert "NO VARIANCE SEEN" in (tmp_path / "report.html").read_text()
    root = ET.parse(tmp_path / "junit.xml").getroot()
    [control] = [c for c in root.iter("testcase") if "negative control" in c.get("name")]
    flag = control.find("failure" if strict else "skipped")
    assert flag is not None and flag.get("message").startswith("NO VARIANCE SEEN")
    # A finding of kind internal (a bug of bi_props) is a JUnit error, not a failure.
    assert root.get("errors") == "1"


def test_both_reports_open_with_a_verdict_then_findings_then_controls(campaign_dir: Path) -> None:
    write_reports(campaign_dir, plots=False)
    expected = (
        "Ran 5 of 6 cells (160 cell examples; 400 worker observations in all) on lib. "
        "FAILED: 3 open finding(s) (mm batch_invariance [enabled], mm reference [enabled], "
        "mm parity [both]). "
        "not judged: 1 cell(s) not run (budget spent or target not started); "
        "1 op(s) not claimed by the target."
    )
    md = (campaign_dir / "report.md").read_text()
    html = (campaign_dir / "report.html").read_text()
    assert md.splitlines()[2] == f"**Verdict.** {expected}", md[:600]
    assert f"<b>Verdict.</b> {expected}</p>" in html
    for text, order in (
        (md, ("**Verdict.**", "## Findings", "## Negative controls", "## Run", "## Cells")),
        (html, ("Verdict.", "<h2>Findings", "<h2>Negative controls", "<h2>Run", "<h2>Cells")),
    ):
        positions = [text.index(heading) for heading in order]
        assert positions == sorted(positions), f"sections out of order: {order} at {positions}"


def test_empty_sections_say_why(tmp_path: Path) -> None:
    report = {"target": "cpu", "profile": "cpu", "examples": 0, "findings": [], "controls": []}
    (tmp_path / "report.json").write_text(json.dumps(report))
    write_reports(tmp_path)
    md = (tmp_path / "report.md").read_text()
    html = (tmp_path / "report.html").read_text()
    assert "None: no property failed in 0 examples." in md and "None: no property failed" in html
    assert "None ran: the campaign reached no switch-off" in md
    assert "None ran: the campaign reached no switch-off" in html
    assert "No coverage lines: no example was recorded" in md
    assert "No coverage lines: no example was recorded" in html
    assert "Empty: no example ran and nothing failed" in html  # the shape-space section
    assert (
        "Ran 0 of 0 cells (0 examples) on cpu. no open findings. not judged: nothing ran, so "
        "nothing was judged." in md
    )
