"""Hypothesis profiles from the bundled search spaces, registered when the plugin is imported.

Hypothesis loads ``--hypothesis-profile`` in its own pytest_configure, so the profiles must exist
before that. Reading six small TOML files with tomllib costs well under a millisecond each, and this
module imports nothing else of bi_props (no numpy, no torch).
"""

from __future__ import annotations

import sys
from importlib import resources
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

PROFILES = ("cpu", "ci", "dev", "ascend", "cuda", "nightly")
DEFAULT_TARGETS = {"cpu": "cpu", "ci": "cpu", "dev": "cpu", "ascend": "ascend", "cuda": "vllm"}


def bundled_dir() -> Path:
    packaged = resources.files("bi_props") / "_strategies"
    if packaged.is_dir():
        return Path(str(packaged))
    return Path(__file__).resolve().parents[2] / "strategies"


def register_profiles() -> None:
    """Register one Hypothesis profile per bundled space. ``deadline`` is always None: a first call
    may compile kernels or start an engine, and timing belongs to benchmarks, not to tests."""
    from hypothesis import HealthCheck, Phase, settings

    for name in PROFILES:
        path = bundled_dir() / f"{name}.toml"
        if not path.exists():
            continue
        with path.open("rb") as f:
            table = tomllib.load(f).get("hypothesis", {})
        kwargs = {
            "deadline": None,
            # No explain phase: it replays failing examples many times, and here a replay of a
            # crash or a hang costs a worker restart (and the timeout).
            "phases": [p for p in Phase if p != Phase.explain],
            "suppress_health_check": [HealthCheck.too_slow, HealthCheck.data_too_large],
            "max_examples": int(table.get("max_examples", 50)),
            "derandomize": bool(table.get("derandomize", False)),
            "print_blob": bool(table.get("print_blob", True)),
        }
        if table.get("database", "directory") == "none":
            kwargs["database"] = None
        settings.register_profile(name, **kwargs)
