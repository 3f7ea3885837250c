"""The Triton lane's shared fixtures. Collected only when the lane passes its files explicitly
(scripts/ci_triton_lane.sh); the main run's testpaths never reach lane_*.py files."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

LANE = Path(__file__).resolve().parent
REPO = LANE.parents[1]
PLANTED = REPO / "tests" / "planted"
STRATEGIES = REPO / "strategies" / "triton.toml"
sys.path.insert(0, str(REPO / "tests" / "vllm_lane"))  # lane_suite: run the suite, read JUnit


@pytest.fixture(scope="session", autouse=True)
def triton_interpreter() -> None:
    """The lane needs triton and TRITON_INTERPRET=1: without them it FAILS, never skips."""
    if importlib.util.find_spec("triton") is None:
        pytest.fail(
            f"the Triton lane needs triton in this interpreter ({sys.executable}); run "
            f"scripts/ci_triton_lane.sh (pip install 'bi_props[triton]')",
            pytrace=False,
        )
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.fail(
            "the Triton lane runs with TRITON_INTERPRET=1 in the environment", pytrace=False
        )
