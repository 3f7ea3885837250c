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


LARGE_CASES = LANE  # large_cases_*.toml: the few large examples each run starts with


def largest_shapes(out: Path) -> dict[str, dict[str, int]]:
    """op -> {axis: largest value reached} over a run's examples.jsonl (the GPU check's
    summarize.largest_shapes: M, K, N for the matmuls, B, M, K, N for bmm, d0.. otherwise), also
    written to ``out/largest_shapes.json`` beside the run's report.json and printed."""
    import json

    sys.path.insert(0, str(REPO / "scripts" / "gpu_check_parts"))
    from summarize import largest_shapes as read

    shapes = read(out / "examples.jsonl")
    (out / "largest_shapes.json").write_text(json.dumps(shapes, indent=2, sort_keys=True))
    print(f"largest shapes reached ({out.name}): {json.dumps(shapes, sort_keys=True)}")
    return shapes


def longest_row(out: Path, op: str) -> int:
    """The longest last dimension of ``op``'s 2-D examples (the reduced one for batch-invariant
    softmax, log_softmax, rms_norm: one program per row, 1024-wide chunks)."""
    import json

    longest = 0
    for line in (out / "examples.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row.get("op") == op and len(row.get("shape", [])) == 2:
            longest = max(longest, int(row["shape"][-1]))
    return longest
