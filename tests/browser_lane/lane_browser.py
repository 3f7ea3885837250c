"""report.html as a reader sees it: opened in headless Chromium, with no console error and every
plot rendered; the screenshot is kept ($BI_PROPS_BROWSER_OUT/report.png, default
build/browser/report.png) and is the README's docs/report.png. The check itself is shown to fail
when an image of the report is removed or corrupted."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest
from browser import problems, screenshot

from bi_props.reporting import write_reports

OUT = Path(os.environ.get("BI_PROPS_BROWSER_OUT", "build/browser"))
CASE = (
    "Case(op='mm', entry='torch.mm', dtype='float32', shape=(1, 3, 2), "
    "layouts=('contiguous', 'contiguous'), values='general', seed=0, "
    "batch=Batch(position=0, companions=(Companion(seed=0, rows=63),)))"
)
MESSAGE = (
    "needle rows inside the batch (actual) vs alone (desired)\n"
    "Mismatched elements: 1 / 2 (50%)\n"
    "Max ULP difference (float32): 37\n"
)


def _finding(prop: str, switch: str = "enabled", kind: str = "mismatch", **extra) -> dict:
    return {
        "target": "my_kernels",
        "op": "mm",
        "property": prop,
        "switch": switch,
        "kind": kind,
        "case": CASE,
        "message": MESSAGE,
        "reproduced_in_fresh_process": True,
        "error_type": None,
        **extra,
    }


@pytest.fixture
def report_html(tmp_path: Path) -> Path:
    """report.html of a campaign with findings, a control, coverage and plots."""
    report = {
        "target": "my_kernels",
        "targets": ["my_kernels"],
        "profile": "cpu",
        "strategies": "strategies/cpu.toml",
        "status": "complete",
        "environment": {},
        "examples": 61,
        "elapsed_s": 61.0,
        "seed": 7,
        "findings": [
            _finding("batch_invariance"),
            _finding("parity", switch="both", kind="error", error_type="TypeError"),
        ],
        "controls": [
            {
                "op": "mm",
                "property": "batch_invariance",
                "variance_seen": True,
                "case": CASE.replace("rows=63", "rows=1"),
                "message": "needle rows ...\nMax ULP difference (float32): 2\n",
                "target": "my_kernels",
            }
        ],
        "not_covered": [],
    }
    (tmp_path / "report.json").write_text(json.dumps(report))
    lines = [
        {
            "op": "mm",
            "property": "batch_invariance",
            "switch": "enabled",
            "dtype": ("float32", "bfloat16")[i % 2],
            "shape": [1 + i % 5, i % 17, 3],
            "layouts": ["contiguous", "transposed"],
            "values": "general",
            "batch_rows": 10 + i,
            "outcome": "mismatch" if i % 7 == 0 else "ok",
            "target": "my_kernels",
            "max_ulp": 1 + i % 9 if i % 7 == 0 else None,
        }
        for i in range(60)
    ]
    (tmp_path / "examples.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    write_reports(tmp_path)
    return tmp_path / "report.html"


def test_the_report_renders_in_chromium_and_its_screenshot_is_kept(report_html: Path) -> None:
    images, found = problems(report_html)
    assert found == [], "report.html in Chromium:\n" + "\n".join(found)
    assert images >= 3, f"expected the shape-space, ULP and coverage plots, found {images} images"
    png = OUT / "report.png"
    screenshot(report_html, png)
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000, f"{png}: {len(data)} bytes"
    shutil.copy(report_html, OUT / "report.html")


@pytest.mark.parametrize("damage", ["removed", "corrupted"])
def test_the_check_fails_when_an_image_of_the_report_is_broken(
    report_html: Path, damage: str
) -> None:
    text = report_html.read_text()
    first = re.search(r'src="data:image/png;base64,([^"]+)"', text)
    assert first, "the report has no embedded image to break"
    broken = "missing-plot.png" if damage == "removed" else "data:image/png;base64,AAAA"
    report_html.write_text(text.replace(first.group(0), f'src="{broken}"', 1))
    images, found = problems(report_html)
    assert images >= 3
    assert any("did not render" in p for p in found), f"{damage} image not caught: {found}"
