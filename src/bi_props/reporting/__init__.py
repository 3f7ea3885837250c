"""Reports of a fuzz campaign: ``report.md``, ``junit.xml``, ``report.html`` and the certificate
(``certificate.json``, ``certificate.md``) from ``DIR``.

``bi-props report DIR`` renders them again (and every ``bi-props fuzz`` run writes them at its end).
Markdown and JUnit need nothing beyond the standard library; the HTML plots need matplotlib (the
``report`` extra) and degrade to a note without it.
"""

from __future__ import annotations

from pathlib import Path

from .ulp import coverage_extras, max_ulp

__all__ = ["coverage_extras", "max_ulp", "write_reports"]


def _write(path: Path, text: str) -> Path:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return path


def write_reports(out: str | Path, *, plots: bool = True) -> dict[str, Path]:
    """Render DIR/report.md, DIR/junit.xml, DIR/report.html and the certificate
    (certificate.json, certificate.md); return their paths by kind."""
    from . import certificate, html, junit, markdown
    from . import data as data_module

    out = Path(out)
    data = data_module.load(out)
    return {
        "markdown": _write(out / "report.md", markdown.render(data)),
        "junit": _write(out / "junit.xml", junit.render(data)),
        "html": _write(out / "report.html", html.render(data, plots=plots)),
        **certificate.write(data),
    }
