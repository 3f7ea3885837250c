"""Bug classes keyed on deployment sizes, each found and shrunk by `bi-props fuzz` on the bundled
cpu profile (its defaults but a doubled deployment share, CPU_SPACE; the campaign on the
library's ops, as a user checking one kernel runs it), within 120 s. None can show below the
sizes models run at: the profile's small draws stop at last dims of 160, 32-token attention,
512-token paged contexts and 4,096 positions, so each is found only through a deployment-size
example (``[scale]``).

- tests/planted/planted_softmax_chunked.py: softmax and log_softmax chunk rows past 1,024
  logits in calls of more than 64 rows;
- tests/planted/planted_long_split_attention.py: attention splits the keys in 256-token chunks
  once the batch's longest sequence passes 512;
- tests/planted/planted_paged_v1_v2.py: paged decode takes v2 (512-token partitions) once the
  batch's longest context passes 512, v1 below;
- tests/planted/planted_rope_rescaled.py: rotary rescales from the batch's largest position
  once it passes 4,096.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from bi_props.model.case import Case, parse_case
from bi_props.model.space import bundled_dir
from planted_fuzz import fuzz_planted

CPU_SPACE = (bundled_dir() / "cpu.toml").read_text().replace("\nevery = 32", "\nevery = 16", 1)
"""The bundled cpu profile with its deployment share doubled (one in 8 of a batch-comparing
cell's examples, as at `[scale] every = 16`): README command 1's one in 16 keeps its reference
cells above their floor across every op, and a campaign on one op can afford more."""


def _lengths(case: Case) -> list[int]:
    """Every sample's rows, longest first (a window may judge any of them, not only the
    needle's)."""
    return sorted([case.shape[0], *(c.rows for c in case.batch.companions)], reverse=True)


CLASSES: dict[str, tuple[str, Callable[[Case], bool]]] = {
    "planted_softmax_chunked": (
        "softmax,log_softmax",
        lambda case: case.shape[-1] > 1024 and sum(_lengths(case)) > 64,
    ),
    # a sequence past one chunk beside a longer one past 512 keys
    "planted_long_split_attention": (
        "attention",
        lambda case: _lengths(case)[0] > 512 and _lengths(case)[1] > 256,
    ),
    # a sequence of 2 to 512 keys beside one past 512
    "planted_paged_v1_v2": (
        "paged_decode_attention",
        lambda case: _lengths(case)[0] > 512 and any(2 <= n <= 512 for n in _lengths(case)[1:]),
    ),
    "planted_rope_rescaled": ("rotary_embedding", lambda case: case.shape[-1] > 4096),
}


@pytest.mark.campaign
@pytest.mark.slow
@pytest.mark.parametrize("library", list(CLASSES))
def test_fuzz_finds_a_bug_keyed_on_a_deployment_size(library: str, tmp_path: Path) -> None:
    ops, needs = CLASSES[library]
    budget = 120
    code, log, report, _ = fuzz_planted(
        library, ops, CPU_SPACE, tmp_path, budget, "--max-findings", "1"
    )
    assert code == 1, log[-3000:]
    found = [
        f
        for f in report["findings"]
        if f["property"] == "batch_invariance" and f["switch"] == "enabled"
    ]
    assert found, [(f["op"], f["property"], f["switch"], f["kind"]) for f in report["findings"]]
    case = parse_case(found[0]["case"])
    assert needs(case), case  # the class itself: below these sizes the kernel is invariant
