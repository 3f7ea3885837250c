"""Compiled mode's cost: compile time per op, and examples per second compiled vs eager,
measured in one run on the same cases.

Each op's cases are drawn once (a fixed seed, the ``cpu`` profile's space: every dtype, layout
and extent a campaign draws) and each is run twice through one worker pool of ``--target`` in
``--switch``'s state: eagerly, then compiled (``Case.mode``: ``torch.compile``, Inductor,
``dynamic=True``, ``fullgraph=True``; execution/compiled.py). Per op: eager examples/s,
compiled examples/s with the compile (what a campaign sees), the same without it (the compiled
kernels' own speed), the seconds of compile the workers reported apart (never kernel time) and
the graphs compiled (one per (op, entry, dtype, layouts) and each shape Dynamo specialises, e.g.
a size of 1). Inductor's caches are fresh for the run (a new ``TORCHINDUCTOR_CACHE_DIR``), as on
a fresh machine; ``--warm-cache DIR`` reuses one.

    python benchmarks/compile_modes.py [--ops mm,sum,...] [--examples 6] [--prop batch_invariance]
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from dataclasses import replace

DEFAULT_OPS = "mm,linear,sum,softmax,rms_norm,silu,attention"


def draw_cases(op: str, prop: str, examples: int, seed: int) -> list:
    """``examples`` cases of (op, prop) from the cpu profile's space, the same for a seed."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as seeded
    from hypothesis import strategies as st

    from bi_props.catalogue.strategies import cases
    from bi_props.model.space import load_profile

    space = replace(load_profile("cpu"), ops=(op,))
    drawn: list = []

    @seeded(seed)
    @settings(
        max_examples=examples,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(data=st.data())
    def collect(data):
        drawn.append(data.draw(cases(space, op, prop)))

    collect()
    return drawn[:examples]


def measure(runner, cases: list, prop: str, switch: str, mode: str) -> dict:
    start = time.perf_counter()
    compile_s, graphs, kernel_s, failed = 0.0, 0, 0.0, 0
    for case in cases:
        try:
            observation = runner.observe(prop, replace(case, mode=mode), switch)
        except Exception:  # a crash or hang is the op's business, not this benchmark's
            failed += 1
            continue
        spent = observation.evidence.get("compile") or {}
        compile_s += float(spent.get("seconds", 0.0))
        graphs += int(spent.get("graphs", 0))
        kernel_s += observation.seconds
    wall = time.perf_counter() - start
    return {
        "wall_s": wall,
        "compile_s": compile_s,
        "graphs": graphs,
        "kernel_s": kernel_s,
        "failed": failed,
        "per_s": len(cases) / wall if wall else 0.0,
        "per_s_no_compile": len(cases) / max(wall - compile_s, 1e-9),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", default=DEFAULT_OPS)
    parser.add_argument("--examples", type=int, default=6, help="cases per op")
    parser.add_argument("--prop", default="batch_invariance")
    parser.add_argument("--target", default="cpu")
    parser.add_argument("--switch", default="disabled", choices=("disabled", "enabled"))
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--warm-cache", default=None, metavar="DIR")
    args = parser.parse_args()
    cache = args.warm_cache or tempfile.mkdtemp(prefix="bi_props_compile_bench_")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache  # the workers inherit it

    from bi_props.runner.controller import Runner

    runner = Runner(
        args.target,
        modes=("eager", "compiled"),
        example_timeout_s=600,
        start_timeout_s=600,
    )
    rows = []
    try:
        runner.hello(args.switch)  # the worker's start is nobody's example
        for op in [o.strip() for o in args.ops.split(",") if o.strip()]:
            cases = draw_cases(op, args.prop, args.examples, args.seed)
            eager = measure(runner, cases, args.prop, args.switch, "eager")
            compiled = measure(runner, cases, args.prop, args.switch, "compiled")
            rows.append((op, len(cases), eager, compiled))
    finally:
        runner.close()
    print(
        f"target {args.target} [{args.switch}], property {args.prop}, {args.examples} cases per "
        f"op (cpu profile, seed {args.seed}), Inductor cache "
        f"{'warm: ' + cache if args.warm_cache else 'fresh'}; {platform.processor() or '?'}, "
        f"{os.cpu_count()} cores"
    )
    print(
        "| op | cases | eager ex/s | compiled ex/s | compiled ex/s without compile | compile s "
        "| graphs | compile s per graph |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    total_e = total_c = total_cs = 0.0
    total_n = 0
    for op, n, eager, compiled in rows:
        per_graph = compiled["compile_s"] / compiled["graphs"] if compiled["graphs"] else 0.0
        failed = f" ({compiled['failed']} failed)" if compiled["failed"] else ""
        print(
            f"| {op} | {n}{failed} | {eager['per_s']:.1f} | {compiled['per_s']:.2f} | "
            f"{compiled['per_s_no_compile']:.1f} | {compiled['compile_s']:.1f} | "
            f"{compiled['graphs']} | {per_graph:.2f} |"
        )
        total_e += eager["wall_s"]
        total_c += compiled["wall_s"]
        total_cs += compiled["compile_s"]
        total_n += n
    if total_n:
        print(
            f"| all | {total_n} | {total_n / total_e:.1f} | {total_n / total_c:.2f} | "
            f"{total_n / max(total_c - total_cs, 1e-9):.1f} | {total_cs:.1f} | | |"
        )


if __name__ == "__main__":
    main()
