"""Examples per second by size class: the space's small draws against its deployment-size draws
(``[scale]``: vocabulary-wide rows, long contexts, far positions, steps of thousands of tokens),
per op with a deployment axis, measured in the same run.

Both classes are drawn from the same space by the catalogue's own strategy (``scale_every`` 0:
small only; 1: every example at deployment size, within ``max_elements``) and judged in this
process by batch invariance on the stock CPU kernels (the needle, its batch and its nested
windows, as a campaign's worker runs them). The ratio says what one deployment-size example
costs in small ones: with one example in ``every`` drawn large, a cell's throughput falls by
about ``(every - 1 + ratio) / every``. These machines are noisy: compare the ratios.

    python benchmarks/size_classes.py [--profile cpu] [--examples 12] [--ops log_softmax,...]
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace

from hypothesis import HealthCheck, given, settings

from bi_props.catalogue import OPS
from bi_props.catalogue.strategies import cases
from bi_props.execution.execute import observe
from bi_props.model.case import Case
from bi_props.model.deployment import size_of
from bi_props.model.space import Space, load_profile
from bi_props.targets.base import Target


class _Stock(Target):
    """The stock kernels, nothing switched."""

    def activate(self) -> None:
        pass


def draw(space: Space, op: str, count: int, seed: int) -> list[Case]:
    drawn: list[Case] = []

    @settings(
        max_examples=count,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=True,
    )
    @given(cases(space, op, "batch_invariance"))
    def collect(case: Case) -> None:
        drawn.append(case)

    collect()
    return drawn[:count]


def rate(target: Target, drawn: list[Case]) -> tuple[float, int]:
    """(examples per second, largest size along the op's axis) over ``drawn``."""
    started = time.perf_counter()
    for case in drawn:
        observe("batch_invariance", case, target, "enabled")
    elapsed = time.perf_counter() - started
    axis = OPS[drawn[0].op].scale
    return len(drawn) / elapsed, max(size_of(axis, c) for c in drawn)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--examples", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--ops",
        default="log_softmax,greedy_argmax,attention,paged_decode_attention,rotary_embedding,"
        "mm,rms_norm",
    )
    args = parser.parse_args()
    space = load_profile(args.profile)
    target = _Stock()
    print(
        f"profile {args.profile}: max_elements {space.max_elements:,}, every {space.scale_every},"
        f" {args.examples} batch-invariance examples per class"
    )
    print(f"{'op':24s} {'axis':9s} {'small/s':>8s} {'largest':>8s} {'deploy/s':>9s} "
          f"{'largest':>8s} {'cost ratio':>10s}")  # fmt: skip
    ratios = []
    for op in [o.strip() for o in args.ops.split(",") if o.strip()]:
        small = draw(replace(space, scale_every=0), op, args.examples, args.seed)
        large = draw(replace(space, scale_every=1), op, args.examples, args.seed)
        rate(target, small[:2])  # warm-up: the op's first calls (imports, allocator) untimed
        small_rate, small_size = rate(target, small)
        large_rate, large_size = rate(target, large)
        ratio = small_rate / large_rate
        ratios.append(ratio)
        print(
            f"{op:24s} {OPS[op].scale:9s} {small_rate:8.1f} {small_size:8d} {large_rate:9.1f} "
            f"{large_size:8d} {ratio:9.1f}x"
        )
    median = statistics.median(ratios)
    every = max(space.scale_every, 1)
    print(
        f"median cost of a deployment-size example: {median:.1f} small ones; at one in {every}, "
        f"a cell runs about {every / (every - 1 + median):.2f}x the examples/s of small draws only"
    )


if __name__ == "__main__":
    main()
