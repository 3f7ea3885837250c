"""The two planted sampler bugs, end to end (`bi-props fuzz` at the bundled cpu profile, the
campaign lane): a batch-level any(need_top_k) path (tests/planted/planted_any_top_k.py, sglang
#35697) and a top-k path at 8 or more rows that keeps exactly k (planted_top_k_ties_at_8.py,
vLLM #50979), each found as sample batch_invariance [enabled] (the second also as reference)
within 120 s."""

from __future__ import annotations

from pathlib import Path

import pytest

from bi_props.model.space import bundled_dir
from planted_fuzz import fuzz_planted

CPU_SPACE = (bundled_dir() / "cpu.toml").read_text()

EXPECTED = {
    "planted_any_top_k": {"batch_invariance"},
    "planted_top_k_ties_at_8": {"batch_invariance", "reference"},
}


@pytest.mark.campaign
@pytest.mark.slow
@pytest.mark.parametrize("library", list(EXPECTED))
def test_fuzz_finds_a_planted_sampler_bug(library: str, tmp_path: Path) -> None:
    code, log, report, _ = fuzz_planted(
        library, "sample", CPU_SPACE, tmp_path, 120, "--max-findings", "1"
    )
    assert code == 1, log[-3000:]
    found = [
        f
        for f in report["findings"]
        if f["op"] == "sample" and f["property"] in EXPECTED[library] and f["switch"] == "enabled"
    ]
    assert found, [(f["op"], f["property"], f["switch"], f["kind"]) for f in report["findings"]]
