"""Judged row comparisons per second: README command 1's op mix, the needle alone against the
needle plus its batch's nested windows (``bi_props.model.windows``), measured in the same run.

Batch invariance used to judge one needle per example (its few rows alone against the same rows
in the batch). Each example now also runs nested windows of its batch (B/2, B/4, ..., 1) and
compares every row of each with the whole batch's, so one kernel call judges many rows at several
batch sizes. Both modes are real ``bi-props fuzz --target cpu`` campaigns (a subprocess each, the
same seed and budget); the baseline sets ``BI_PROPS_BATCH_WINDOWS=0`` in its workers (the needle
only). The numbers are the report's rows judged by the batch-invariance cells, per second of
those cells' turns. These machines are noisy, so the ratio, measured in one run, is what to
compare.

    python benchmarks/rows_judged.py [--budget 60] [--repeats 1] [--seed 1]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def run(budget: float, seed: int, windows: bool) -> dict:
    env = dict(os.environ, BI_PROPS_BATCH_WINDOWS="1" if windows else "0")
    with tempfile.TemporaryDirectory(prefix="bi_props-rows-") as tmp:
        out = Path(tmp) / "out"
        command = [
            sys.executable, "-m", "bi_props.cli", "fuzz", "--target", "cpu",
            "--budget", str(budget), "--out", str(out), "--seed", str(seed),
        ]  # fmt: skip
        subprocess.run(command, env=env, capture_output=True, text=True, timeout=budget + 600)
        report = json.loads((out / "report.json").read_text())
    seconds = sum(c["seconds"] for c in report["cells"] if c["property"] == "batch_invariance")
    ops = report["evidence"]["ops"]
    rows = sum((o.get("rows") or {}).get("batch_invariance", 0) for o in ops)
    judged = sum((o.get("judged") or {}).get("batch_invariance", 0) for o in ops)
    return {"rows": rows, "judged": judged, "seconds": seconds, "rows_per_s": rows / seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=60.0)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    results: dict[str, list[dict]] = {"needle only (before)": [], "windows (after)": []}
    for repeat in range(args.repeats):
        for mode, windows in (("needle only (before)", False), ("windows (after)", True)):
            results[mode].append(run(args.budget, args.seed + repeat, windows))
    print(f"README command 1's op mix, --budget {args.budget:g}, {args.repeats} repeat(s)")
    print(f"{'mode':24s} {'examples':>9s} {'rows':>9s} {'cell s':>7s} {'rows/s':>9s} {'ratio':>6s}")
    floor = statistics.median(r["rows_per_s"] for r in results["needle only (before)"])
    for mode, runs in results.items():
        rate = statistics.median(r["rows_per_s"] for r in runs)
        judged = statistics.median(r["judged"] for r in runs)
        rows = statistics.median(r["rows"] for r in runs)
        seconds = statistics.median(r["seconds"] for r in runs)
        print(
            f"{mode:24s} {judged:9.0f} {rows:9.0f} {seconds:7.1f} {rate:9.1f} {rate / floor:5.1f}x"
        )


if __name__ == "__main__":
    main()
