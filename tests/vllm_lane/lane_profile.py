"""pytest plugin for the vLLM lane (``-p lane_profile``): registers the Hypothesis profile
``vllm_lane`` from the [hypothesis] table of the lane's strategies.toml, as bi_props.profiles does
for the bundled spaces (deadline off, slow-data health checks off, no example database)."""

from __future__ import annotations

import sys
from pathlib import Path

from hypothesis import HealthCheck, settings

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

STRATEGIES = Path(__file__).with_name("strategies.toml")
PROFILE = "vllm_lane"

with STRATEGIES.open("rb") as _f:
    _table = tomllib.load(_f).get("hypothesis", {})

settings.register_profile(
    PROFILE,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    max_examples=int(_table.get("max_examples", 8)),
    derandomize=bool(_table.get("derandomize", True)),
    print_blob=True,
    database=None,
)
