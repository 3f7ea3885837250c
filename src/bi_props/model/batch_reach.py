"""How far a cell's batches reached: the batch-wide quantities kernels switch on.

Batch-variance bugs are mostly keyed on metadata of the whole batch, not on a sample's own shape:
the total rows (an rms_norm path at 256 rows), the number of sequences (a sampler that changes at
45 co-resident sequences, split-KV counts from batch x heads), the longest sequence (attention
tiling chosen from the longest). A batch invariance example can only show such a bug when the
needle alone and its batch sit on two sides of the kernel's threshold: that is what "crossed"
counts, per quantity and named threshold. A cell whose batches never crossed 256 rows says
nothing about a switch at 256, and the report must say so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .case import COMPANION_CONTENTS, Case

QUANTITIES = ("total_rows", "sequences", "longest", "padded")
"""Batch-wide quantities, each for the needle alone and for its whole batch. Rows are the
extent along the batch axis (``Case.shape[0]``: rows, tokens, a sequence's context);
``padded`` the length a padded case pads every sample to (the needle alone is laid out at its own
length; 0 for a packed case)."""


PARAMETER_MIXES: dict[str, Callable[[Case], frozenset[str]]] = {}
"""Per op, the request parameters some companion holds and the needle does not (a companion with
top-k beside a needle without, greedy beside sampled): the mixes that move a sampler's path.
Filled by the op's family (``catalogue/sampling.py``: decoded from the materialised request
codes); counted per cell as ``mixes``."""


def batch_quantities(case: Case) -> tuple[dict[str, int], dict[str, int]] | None:
    """(needle alone, whole batch) of each quantity; None for a case without a batch."""
    if case.batch is None:
        return None
    needle = int(case.shape[0]) if case.shape else 0
    rows = [c.rows for c in case.batch.companions]
    longest = max([needle, *rows])
    alone = {"total_rows": needle, "sequences": 1, "longest": needle}
    alone["padded"] = needle if case.padded else 0
    batch = {
        "total_rows": needle + sum(rows),
        "sequences": 1 + len(rows),
        "longest": longest,
        "padded": max(case.padded, longest) if case.padded else 0,
    }
    return alone, batch


@dataclass
class BatchReach:
    """One cell's batches: the largest of each quantity and, per named threshold, how many
    examples crossed it (the needle alone below it, its batch at or above it)."""

    thresholds: tuple[int, ...]
    examples: int = 0
    largest: dict[str, int] = field(default_factory=lambda: dict.fromkeys(QUANTITIES, 0))
    crossed: dict[str, dict[int, int]] = field(default_factory=lambda: {q: {} for q in QUANTITIES})
    # examples whose batch held a companion of each content (``Companion.content``)
    contents: dict[str, int] = field(default_factory=dict)
    # examples whose batch mixed in a request parameter the needle lacks (PARAMETER_MIXES)
    mixes: dict[str, int] = field(default_factory=dict)

    def add(self, case: Case) -> None:
        quantities = batch_quantities(case)
        if quantities is None:
            return
        alone, batch = quantities
        self.examples += 1
        assert case.batch is not None
        for content in {c.content for c in case.batch.companions}:
            self.contents[content] = self.contents.get(content, 0) + 1
        mix = PARAMETER_MIXES.get(case.op)
        for feature in mix(case) if mix is not None else ():
            self.mixes[feature] = self.mixes.get(feature, 0) + 1
        for q in QUANTITIES:
            self.largest[q] = max(self.largest[q], batch[q])
            for t in self.thresholds:
                if alone[q] < t <= batch[q]:
                    self.crossed[q][t] = self.crossed[q].get(t, 0) + 1

    def to_json(self) -> dict[str, Any]:
        """Thresholds never crossed are listed with 0: an absent key would read as unknown."""
        return {
            "examples": self.examples,
            "largest": dict(self.largest),
            "crossed": {
                q: {str(t): self.crossed[q].get(t, 0) for t in self.thresholds} for q in QUANTITIES
            },
            "contents": {c: self.contents.get(c, 0) for c in COMPANION_CONTENTS},
            **({"mixes": dict(sorted(self.mixes.items()))} if self.mixes else {}),
        }


def merge_reach(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """report.json's ``batch_reach`` entries of one cell together (a Ray run has one per shard):
    examples and crossings summed, the largest of each quantity kept; first-seen order."""
    merged: dict[tuple, dict[str, Any]] = {}
    for entry in entries:
        key = tuple(entry.get(k) for k in ("target", "op", "property", "switch"))
        if key not in merged:
            merged[key] = {
                **{k: entry.get(k) for k in ("target", "op", "property", "switch")},
                "examples": 0,
                "largest": dict.fromkeys(QUANTITIES, 0),
                "crossed": {q: {} for q in QUANTITIES},
                "contents": dict.fromkeys(COMPANION_CONTENTS, 0),
            }
        into = merged[key]
        into["examples"] += int(entry.get("examples", 0))
        for content, n in (entry.get("contents") or {}).items():
            into["contents"][content] = into["contents"].get(content, 0) + int(n)
        for feature, n in (entry.get("mixes") or {}).items():
            mixes = into.setdefault("mixes", {})
            mixes[feature] = mixes.get(feature, 0) + int(n)
        for q in QUANTITIES:
            into["largest"][q] = max(
                into["largest"][q], int((entry.get("largest") or {}).get(q, 0))
            )
            for t, n in ((entry.get("crossed") or {}).get(q) or {}).items():
                into["crossed"][q][t] = into["crossed"][q].get(t, 0) + int(n)
    return list(merged.values())
