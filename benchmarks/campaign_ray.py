"""Campaign throughput: the plain (local) campaign as the floor, then Ray with 1 and 2 actors.

Each mode is a real ``bi-props fuzz`` run (a subprocess, fresh output directory, the same seed)
against the built-in CPU target; the number is the report's cells-phase throughput (examples/s
from the first cell turn to the end: start-up, Ray's own start and the negative controls are
excluded). These machines are noisy, so ratios measured in the same run are what to compare.

Every mode runs with the same OMP_NUM_THREADS (``--threads``, default 1; 0 leaves it unset, i.e.
torch's default of one thread per core). The actors give their workers the driver's setting, so
the modes differ only in how cells are spread, not in how each kernel is threaded. (With torch's
default on a small, busy machine, OpenMP threads spin against the controller; expect a plain
campaign several times slower than with one thread.)

    python benchmarks/campaign_ray.py [--budget 40] [--ops mm,sum,softmax] [--repeats 1]
                                      [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODES = {
    "plain": [],
    "ray, 1 actor": ["--ray", "--ray-actors", "1"],
    "ray, 2 actors": ["--ray", "--ray-actors", "2"],
}


def run(mode: list[str], budget: float, ops: str, profile: str, seed: int, threads: int) -> dict:
    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    with tempfile.TemporaryDirectory(prefix="bi_props-bench-") as tmp:
        out = Path(tmp) / "out"
        command = [
            sys.executable,
            "-m",
            "bi_props.cli",
            "fuzz",
            "--target",
            "cpu",
            "--budget",
            str(budget),
            "--out",
            str(out),
            "--ops",
            ops,
            "--profile",
            profile,
            "--seed",
            str(seed),
            *mode,
        ]
        started = time.perf_counter()
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=budget + 300, env=env
        )
        wall = time.perf_counter() - started
        if done.returncode not in (0, 1):
            raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr}")
        report = json.loads((out / "report.json").read_text())
    throughput = report["campaign"]["throughput"]
    return {
        "rate": throughput["examples_per_s"],
        "examples": throughput["cells_examples"],
        "seconds": throughput["cells_seconds"],
        "findings": len(report["findings"]),
        "wall": wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=40.0)
    parser.add_argument("--ops", default="mm,sum,softmax")
    parser.add_argument("--profile", default="dev")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1, help="OMP_NUM_THREADS (0: unset)")
    args = parser.parse_args()

    rates: dict[str, list[float]] = {name: [] for name in MODES}
    threads = args.threads or "torch's default"
    print(
        f"target cpu, ops {args.ops}, profile {args.profile}, budget {args.budget:g} s per run, "
        f"OMP_NUM_THREADS {threads}, {os.cpu_count()} CPUs"
    )
    names = list(MODES)
    for repeat in range(args.repeats):
        order = names[repeat % len(names) :] + names[: repeat % len(names)]  # spread the drift
        for name in order:
            r = run(
                MODES[name], args.budget, args.ops, args.profile, args.seed + repeat, args.threads
            )
            rates[name].append(r["rate"])
            print(
                f"  [{repeat}] {name:14s} {r['rate']:8.1f} examples/s  ({r['examples']} examples "
                f"in {r['seconds']:.1f} s of cells; {r['findings']} findings; {r['wall']:.0f} s "
                f"wall)",
                flush=True,
            )

    # Ratios within a repeat (modes measured minutes apart, not hours), then their median.
    def ratio(a: str, b: str) -> float:
        return statistics.median(x / y for x, y in zip(rates[a], rates[b], strict=True))

    print("\nmedian examples/s; median of the per-repeat ratios:")
    for name in names:
        print(f"  {name:14s} {statistics.median(rates[name]):8.1f}")
    print(f"  ray, 1 actor  / plain:       x{ratio('ray, 1 actor', 'plain'):.2f}")
    print(f"  ray, 2 actors / plain:       x{ratio('ray, 2 actors', 'plain'):.2f}")
    print(f"  ray, 2 actors / ray, 1 actor: x{ratio('ray, 2 actors', 'ray, 1 actor'):.2f}")


if __name__ == "__main__":
    main()
