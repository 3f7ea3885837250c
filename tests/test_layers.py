"""The layers held by a tool: pyproject.toml's import-linter contracts (docs/development.md).

The contracts pass on this tree, and they fail, naming the import, on a temporary copy of the
package with an upward import (model -> catalogue) and a Hypothesis import on the worker's side
(execution -> hypothesis) added."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import importlinter  # noqa: F401  (the dev extra's import-linter: a missing one fails here)

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "bi_props"


def _lint(cwd: Path, pythonpath: Path) -> subprocess.CompletedProcess:
    """``lint-imports`` (import-linter's CLI) on ``cwd``'s pyproject.toml, with ``pythonpath``
    first on the path (so that its ``bi_props`` is the one analysed)."""
    env = dict(os.environ, PYTHONPATH=str(pythonpath))
    code = "import sys; from importlinter.cli import lint_imports_command; lint_imports_command()"
    return subprocess.run(
        [sys.executable, "-c", code, "--no-cache"],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_contracts_hold() -> None:
    result = _lint(ROOT, ROOT / "src")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_an_added_upward_import_breaks_the_contracts(tmp_path: Path) -> None:
    copy = tmp_path / "bi_props"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    space = copy / "model" / "space.py"
    space.write_text(space.read_text() + "\n\nfrom ..catalogue import OPS as _UPWARD  # noqa\n")
    materialize = copy / "execution" / "materialize.py"
    materialize.write_text(materialize.read_text() + "\n\nimport hypothesis  # noqa\n")
    result = _lint(tmp_path, tmp_path)
    out = result.stdout + result.stderr
    assert str(copy) in _where(tmp_path), "the copy, not the checkout, must be analysed"
    assert result.returncode != 0, out
    assert "bi_props layers: every import runs down BROKEN" in out, out
    assert "bi_props.model.space -> bi_props.catalogue" in out, out
    assert "imports no Hypothesis and no pytest BROKEN" in out, out
    assert "bi_props.execution.materialize -> hypothesis" in out, out


def _where(pythonpath: Path) -> str:
    """Where ``import bi_props`` finds the package with ``pythonpath`` first on the path."""
    env = dict(os.environ, PYTHONPATH=str(pythonpath))
    code = "import importlib.util; print(importlib.util.find_spec('bi_props').origin)"
    found = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return found.stdout
