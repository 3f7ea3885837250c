"""Time to bug: how soon `bi-props fuzz` (default profile) reports each planted bug class.

Each planted library in tests/planted/ carries one bug class in its ``mm`` kernel or in the
kernel ``KERNEL`` names (the batch-wide switch classes: ``rms_norm``, ``fused_moe`` or
``mixed_attention``, run on that op alone). Here each is
wrapped so that its kernel is about ``--slowdown`` times slower: the wrapper times each call of the
library's own kernel and then sleeps (slowdown - 1) times that long (a sleep, not a slow path: the
results are the library's, bit for bit). The kernels are already elementwise Python loops, slower
than stock ``torch.mm``, so this is at least ``--slowdown`` x stock. Every library runs for a fixed
``--budget`` with each ``--seeds`` seed (stopped once its planted class is recorded, unless
``--full-budget``), at most ``--parallel`` campaigns at once, and the table
gives per library: how many seeds found the planted class within the budget, the median seconds to
the first finding of that class (the campaign's progress line that records it: the end of the
turn, shrink and fresh-process confirmation included), and the median examples run until then.
The correct library must give no finding at all.

    python benchmarks/time_to_bug.py --seeds 1,2 --budget 120 --parallel 2

Goal: every class found in all seeds within 120 s, median under 60 s, 0 false findings.
Timings depend on the machine's load: state it with the table.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLANTED = ROOT / "tests" / "planted"

# library -> (op, property, switch) of the planted class ("*": any property)
EXPECTED = {
    "planted_batch_variant": ("mm", "batch_invariance", "enabled"),
    "planted_wrong_result": ("mm", "reference", "enabled"),
    "planted_nondeterministic": ("mm", "determinism", "enabled"),
    "planted_contract": ("mm", "parity", "both"),
    "planted_switch_leak": ("mm", "routing", "disabled"),
    "planted_crash": ("mm", "*", "enabled"),
    "planted_hang": ("mm", "*", "enabled"),
    # a batch-wide switch (rows, arrival order, padding) in another op's kernel
    "planted_reduction_switch": ("rms_norm", "batch_invariance", "enabled"),
    "planted_arrival_order": ("fused_moe", "*", "enabled"),
    "planted_padded_length": ("rms_norm", "batch_invariance", "enabled"),
    # mixed batches (their kernel is mixed_attention, KERNEL below)
    "planted_query_tiling": ("mixed_attention", "batch_invariance", "enabled"),
    "planted_split_by_longest": ("mixed_attention", "batch_invariance", "enabled"),
    # keyed on deployment sizes, reached only by the space's [scale] draws
    "planted_softmax_chunked": ("log_softmax", "batch_invariance", "enabled"),
    "planted_long_split_attention": ("attention", "batch_invariance", "enabled"),
    "planted_paged_v1_v2": ("paged_decode_attention", "batch_invariance", "enabled"),
    "planted_rope_rescaled": ("rotary_embedding", "batch_invariance", "enabled"),
    # what the batch-mates hold and ask for
    "planted_per_tensor_scale": ("quant_linear", "batch_invariance", "enabled"),
    "planted_any_top_k": ("sample", "*", "enabled"),
    "planted_top_k_ties_at_8": ("sample", "*", "enabled"),
}
CORRECT = "planted_correct"
KERNEL = {
    "planted_reduction_switch": "rms_norm",
    "planted_arrival_order": "fused_moe",
    "planted_padded_length": "rms_norm",
    "planted_query_tiling": "mixed_attention",
    "planted_split_by_longest": "mixed_attention",
    "planted_softmax_chunked": "log_softmax",
    "planted_long_split_attention": "varlen_attention",
    "planted_paged_v1_v2": "paged_decode_attention",
    "planted_rope_rescaled": "rotary_embedding",
    "planted_per_tensor_scale": "quant_linear",
    "planted_any_top_k": "sample",
    "planted_top_k_ties_at_8": "sample",
}
"""The library's kernel the wrapper slows down, where it is not ``mm`` (the library's own
``enable`` installs it, looked up when it runs); such a library's campaign runs on its op alone
(``--ops``), as its campaign test does."""

WRAPPER = '''"""{lib}, its kernel made about {slowdown}x slower (time.sleep after each call)."""
import time

import {lib} as _base
from {lib} import *  # noqa: F401,F403  the module-target interface (NAMESPACE, OPS, ROUTES, ...)

SLOWDOWN = {slowdown}
_kernel = _base.{kernel}


def _slow(*args, **kwargs):
    started = time.perf_counter()
    out = _kernel(*args, **kwargs)
    time.sleep((SLOWDOWN - 1) * (time.perf_counter() - started))
    return out


def enable(enabled):
    _base.{kernel} = _slow  # installed by the library's own enable, wherever it installs it
    _base.enable(enabled)
'''

PROGRESS = re.compile(
    r"^\[\s*([\d.]+)s/[\d.]+s\]\s+(\d+) examples .*\| (\S+) \| (.+?): .*-> FINDING"
)


def first_finding(log: str, expected: tuple[str, str, str]) -> tuple[float, int] | None:
    """(seconds, examples) at the progress line recording the first finding of the class."""
    op, prop, switch = expected
    for line in log.splitlines():
        m = PROGRESS.match(line)
        if not m:
            continue
        cell = m.group(4).split()  # "mm batch_invariance [enabled]"
        if len(cell) != 3:
            continue
        if cell[0] == op and prop in ("*", cell[1]) and cell[2] == f"[{switch}]":
            return float(m.group(1)), int(m.group(2))
    return None


def run_all(args: argparse.Namespace) -> dict[str, list[dict]]:
    work = Path(tempfile.mkdtemp(prefix="bi_props-ttb-"))
    for lib in [*args.libraries, CORRECT]:
        kernel = KERNEL.get(lib, "mm")
        wrapper = WRAPPER.format(lib=lib, slowdown=args.slowdown, kernel=kernel)
        (work / f"slow_{lib}.py").write_text(wrapper)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(work), str(PLANTED), env.get("PYTHONPATH")])
    )
    env.pop("CI", None)
    jobs = [(lib, seed) for seed in args.seeds for lib in [*args.libraries, CORRECT]]
    running: list[tuple[subprocess.Popen, str, int, Path, float]] = []
    results: dict[str, list[dict]] = {}
    stopped: set[int] = set()
    while jobs or running:
        while jobs and len(running) < args.parallel:
            lib, seed = jobs.pop(0)
            out = work / f"{lib}-{seed}"
            command = [sys.executable, "-m", "bi_props.cli", "fuzz", "--target", f"slow_{lib}",
                       "--profile", args.profile, "--budget", str(args.budget),
                       "--out", str(out), "--seed", str(seed)]  # fmt: skip
            if args.ops or lib in KERNEL:
                command += ["--ops", args.ops or EXPECTED[lib][0]]
            log = (work / f"{lib}-{seed}.log").open("w")
            process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
            running.append((process, lib, seed, out, time.monotonic()))
        for entry in list(running):
            process, lib, seed, out, started = entry
            if process.poll() is None:
                # Found: the rest of its budget decides nothing here; SIGTERM ends the campaign
                # cleanly (it writes its report). The seconds come from its own progress line.
                if args.stop_when_found and lib in EXPECTED and process.pid not in stopped:
                    log = (work / f"{lib}-{seed}.log").read_text()
                    if first_finding(log, EXPECTED[lib]) is not None:
                        process.send_signal(signal.SIGTERM)
                        stopped.add(process.pid)
                continue
            running.remove(entry)
            log = (work / f"{lib}-{seed}.log").read_text()
            report = (
                json.loads((out / "report.json").read_text())
                if (out / "report.json").exists()
                else {}
            )
            hit = first_finding(log, EXPECTED[lib]) if lib in EXPECTED else None
            results.setdefault(lib, []).append(
                {
                    "seed": seed,
                    "exit": process.returncode,
                    "wall_s": round(time.monotonic() - started, 1),
                    "found": hit is not None and hit[0] <= args.budget,
                    "seconds": hit[0] if hit else None,
                    "examples": hit[1] if hit else None,
                    "findings": len(report.get("findings", [])),
                    "cells_not_run": (report.get("campaign") or {}).get("cells_not_run"),
                }
            )
            print(
                f"  {lib} seed {seed}: exit {process.returncode}, first finding {hit}", flush=True
            )
        time.sleep(0.5)
    print(f"(logs and reports in {work})")
    return results


def table(results: dict[str, list[dict]], budget: float) -> str:
    rows = ["| library | found in seeds (within budget) | median s to first | median examples "
            "to first | goal |", "| --- | --- | --- | --- | --- |"]  # fmt: skip
    for lib, runs in results.items():
        if lib == CORRECT:
            false = sum(r["findings"] for r in runs)
            rows.append(
                f"| {lib} (no finding allowed) | {len(runs)} seeds, {false} finding(s) | - | - "
                f"| {'met' if false == 0 else 'NOT met'} |"
            )
            continue
        found = [r for r in runs if r["found"]]
        seconds = statistics.median(r["seconds"] for r in found) if found else None
        examples = statistics.median(r["examples"] for r in found) if found else None
        met = (
            len(found) == len(runs)
            and seconds is not None
            and seconds < 60
            and all(r["seconds"] <= 120 for r in found)
        )
        rows.append(
            f"| {lib} | {len(found)}/{len(runs)} | "
            f"{'-' if seconds is None else f'{seconds:.0f}'} | "
            f"{'-' if examples is None else f'{examples:.0f}'} | {'met' if met else 'NOT met'} |"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="1,2", help="comma-separated campaign seeds")
    parser.add_argument("--budget", type=float, default=120.0)
    parser.add_argument("--parallel", type=int, default=2, help="campaigns at once")
    parser.add_argument("--slowdown", type=float, default=10.0)
    parser.add_argument("--profile", default="cpu", help="the fuzz profile (default: cpu)")
    parser.add_argument("--ops", default=None, help="restrict the catalogue (default: all ops)")
    parser.add_argument(
        "--libraries", default=",".join(EXPECTED), help="comma-separated planted libraries"
    )
    parser.add_argument(
        "--full-budget",
        dest="stop_when_found",
        action="store_false",
        help="let every campaign spend its whole budget (default: a campaign is stopped once "
        "its planted class is recorded; the correct library always spends its budget)",
    )
    args = parser.parse_args(argv)
    try:
        args.seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        parser.error("--seeds: expected integers like 1,2,3")
    args.libraries = [lib.strip() for lib in args.libraries.split(",") if lib.strip()]
    unknown = [lib for lib in args.libraries if lib not in EXPECTED]
    if unknown:
        parser.error(f"--libraries: unknown {unknown}; choose from {list(EXPECTED)}")
    if args.parallel < 1 or args.budget <= 0 or args.slowdown < 1:
        parser.error("--parallel >= 1, --budget > 0 and --slowdown >= 1 are required")
    results = run_all(args)
    print(table(results, args.budget))
    return 0


if __name__ == "__main__":
    sys.exit(main())
