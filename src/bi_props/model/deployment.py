"""Deployment sizes: the axis along which an op meets the sizes models run at, and how far a
cell's examples reached along it.

Kernels switch paths at sizes far above a fast search's: a softmax keeps a row in registers up to
a width and loops over chunks past it (a vocabulary of 32,000 to 151,936 logits), attention
splits the keys of contexts of thousands of tokens, rotary caches rescale past the model's
original context, serving steps hold 1,024 to 8,192 tokens. A space draws a share of examples at
those sizes (``Space.scale_every``, ``[scale]``); ``OpSpec.scale`` names the op's axis, and
``size_of`` reads an example's size along it, so the report can say which cells never left
the small sizes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .case import Case

AXES = ("tokens", "vocab", "context", "positions")
"""``tokens``: the batch's total rows (a serving step's tokens); ``vocab``: the last dimension
(logits over a vocabulary); ``context``: the longest sequence's keys in the batch;
``positions``: the largest position a rotary cache covers."""

VOCAB_SIZES = (32000, 32768, 50257, 128256, 151936)
"""Llama 2, a power of two, GPT-2, Llama 3, Qwen 2."""
SCALE_POINTS = (512, 1024, 2048, 4096, 8192, 16384, 32768)
"""Sizes where deployed kernels switch: paged attention's 512-token partitions, softmax's
persistent path up to 1,024, chunked-prefill budgets and CUDA-graph capture sizes, long-context
caches."""

DEPLOYMENT_GOALS = {"tokens": 1025, "vocab": 32000, "context": 512, "positions": 4097}
"""What a cell's one explicit deployment-size example reaches at least along its axis: a step
past 1,024 tokens, a vocabulary-wide row (Llama 2's 32,000 logits), a needle of 512 keys (paged
attention's partition) beside a longer sequence, a rotary position past a 4,096-token original
context."""


def reaches_goal(axis: str, case: Case) -> bool:
    """Whether ``case`` reaches ``DEPLOYMENT_GOALS[axis]`` (the context axis: its needle, with a
    longer companion beside it)."""
    goal = DEPLOYMENT_GOALS.get(axis)
    if goal is None or not case.shape:
        return False
    if axis == "context":
        needle = int(case.shape[0])
        companions = case.batch.companions if case.batch is not None else ()
        return needle >= goal and any(c.rows > needle for c in companions)
    return size_of(axis, case) >= goal


def size_of(axis: str, case: Case) -> int:
    """An example's size along ``axis`` (0 for an unknown axis or an empty shape)."""
    if not case.shape:
        return 0
    companions = case.batch.companions if case.batch is not None else ()
    if axis == "tokens":
        return int(case.shape[0]) + sum(c.rows for c in companions)
    if axis == "vocab":
        return int(case.shape[-1])
    if axis == "context":
        return max([int(case.shape[0]), *(c.rows for c in companions)])
    if axis == "positions":  # rotary: (tokens, heads, kv_heads, head_size, rot_dim, positions)
        return int(case.shape[-1])
    return 0


@dataclass
class SizeReach:
    """One cell's sizes along its op's axis: the largest reached, how many examples were drawn
    at deployment size, and per named size (``points``) how many examples reached it."""

    axis: str
    points: tuple[int, ...]
    small_limit: int
    """The largest size the space's small draws reach along the axis: above it is deployment."""
    examples: int = 0
    largest: int = 0
    deployed: int = 0
    reached: dict[int, int] = field(default_factory=dict)
    needle_beside_longer: int = 0
    """Context axis: the longest needle drawn beside a longer companion (what a kernel choosing
    its split from the batch's longest sequence needs to show)."""

    def add(self, case: Case) -> None:
        size = size_of(self.axis, case)
        self.examples += 1
        self.largest = max(self.largest, size)
        if size > self.small_limit:
            self.deployed += 1
        for p in self.points:
            if size >= p:
                self.reached[p] = self.reached.get(p, 0) + 1
        if self.axis == "context" and case.batch is not None and case.shape:
            needle = int(case.shape[0])
            if any(c.rows > needle for c in case.batch.companions):
                self.needle_beside_longer = max(self.needle_beside_longer, needle)

    def to_json(self) -> dict[str, Any]:
        """Sizes never reached are listed with 0: an absent key would read as unknown."""
        return {
            "axis": self.axis,
            "examples": self.examples,
            "largest": self.largest,
            "small_limit": self.small_limit,
            "deployed": self.deployed,
            "reached": {str(p): self.reached.get(p, 0) for p in self.points},
            **(
                {"needle_beside_longer": self.needle_beside_longer}
                if self.axis == "context"
                else {}
            ),
        }


def merge_sizes(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """report.json's ``size_reach`` entries of one cell together (one per shard or session):
    counts summed, the largest kept; first-seen order."""
    merged: dict[tuple, dict[str, Any]] = {}
    for entry in entries:
        key = tuple(entry.get(k) for k in ("target", "op", "property", "switch"))
        into = merged.get(key)
        if into is None:
            merged[key] = {**entry, "reached": dict(entry.get("reached") or {})}
            continue
        for k in ("examples", "deployed"):
            into[k] = int(into.get(k, 0)) + int(entry.get(k, 0))
        for k in ("largest", "needle_beside_longer"):
            if k in entry:
                into[k] = max(int(into.get(k, 0)), int(entry[k]))
        for p, n in (entry.get("reached") or {}).items():
            into["reached"][p] = int(into["reached"].get(p, 0)) + int(n)
    return list(merged.values())
