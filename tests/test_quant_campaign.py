"""A per-tensor activation scale, end to end (`bi-props fuzz`, the campaign lane): quant_linear's
planted kernel keeps each token's scale against an amax over the whole call's input
(tests/planted/planted_per_tensor_scale.py); at default settings the search finds it as
quant_linear batch_invariance [enabled] within 120 s (--max-findings 1: it ends there), once the
batch's amax passes the planted floor (a companion's outliers, or a wide-valued needle).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PLANTED = Path(__file__).parent / "planted"
pytestmark = pytest.mark.campaign
BUDGET = 120


def test_a_per_tensor_activation_scale_is_found_beside_an_outlier(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(PLANTED),
               os.environ.get("PYTHONPATH")])))  # fmt: skip
    out = tmp_path / "out"
    command = [sys.executable, "-m", "bi_props.cli", "fuzz", "--target",
               "planted_per_tensor_scale", "--ops", "quant_linear", "--budget", str(BUDGET),
               "--max-findings", "1", "--seed", "1", "--out", str(out)]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=BUDGET * 4)
    assert done.returncode == 1, done.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    found = [
        f
        for f in report["findings"]
        if (f["op"], f["property"], f["switch"]) == ("quant_linear", "batch_invariance", "enabled")
    ]
    assert found, [(f["op"], f["property"], f["kind"]) for f in report["findings"]]
    # the batch's amax past the planted floor: a companion's outliers or huge values, or the
    # needle's own wide values beside any companion (the other way in)
    case = found[0]["case"]
    assert any(f"content='{c}'" in case for c in ("outlier", "huge")) or "values='wide'" in case
