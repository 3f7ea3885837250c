"""What PyTorch's own switch does here: ``torch._inductor.config.batch_invariant`` (the
``inductor`` target), the same compiled cases with the flag off and on, per op.

Each op's cases are drawn once (a fixed seed, the ``cpu`` profile's space) for the batch
invariance property and run compiled (``Case.mode``) in both switch states' workers: batch
invariance (the needle alone vs inside its batch, and the batch's nested windows), determinism
(the same call twice), the float64 reference (the needle alone) and whether the flag changed any
output bit (the needle alone, off vs on). Counts, not findings: a campaign
(``bi-props fuzz --target inductor``) shrinks and confirms.

    python benchmarks/inductor_switch.py [--ops mm,sum,...] [--examples 6] [--seed 1]
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

DEFAULT_OPS = "mm,linear,sum,mean,softmax,log_softmax,rms_norm,layer_norm,silu"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", default=DEFAULT_OPS)
    parser.add_argument("--examples", type=int, default=6, help="cases per op")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    from compile_modes import draw_cases

    from bi_props.model.properties import same_outputs
    from bi_props.model.property_spec import get
    from bi_props.runner.controller import Runner

    runner = Runner("inductor", example_timeout_s=600, start_timeout_s=600)
    started = time.perf_counter()
    rows = []
    try:
        runner.start_all()
        for op in [o.strip() for o in args.ops.split(",") if o.strip()]:
            counts = {"cases": 0, "changed": 0, "raised": 0}
            for state in ("disabled", "enabled"):
                for what in ("variant", "nondeterministic", "outside reference"):
                    counts[f"{what} {state}"] = 0
            for case in draw_cases(op, "batch_invariance", args.examples, args.seed):
                case = replace(case, mode="compiled")
                counts["cases"] += 1
                alone = {}
                for state in ("disabled", "enabled"):
                    variant = get("batch_invariance").judge(
                        runner.observe("batch_invariance", case, state)
                    )
                    twice = get("determinism").judge(runner.observe("determinism", case, state))
                    reference = runner.observe("reference", case, state)
                    verdict = get("reference").judge(reference)
                    alone[state] = reference.calls["op"]
                    counts["raised"] += alone[state].raised
                    counts[f"variant {state}"] += not variant.ok and variant.kind == "mismatch"
                    counts[f"nondeterministic {state}"] += not twice.ok
                    counts[f"outside reference {state}"] += (
                        not verdict.ok and verdict.kind == "mismatch"
                    )
                changed = same_outputs(alone["enabled"], alone["disabled"], "on vs off")
                counts["changed"] += not changed.ok
            rows.append((op, counts))
    finally:
        runner.close()
    stats = runner.compile_stats.to_json()
    print(
        f"inductor target, both states, {args.examples} compiled cases per op (cpu profile, "
        f"seed {args.seed}); {time.perf_counter() - started:.0f} s, of which compile "
        f"{stats['seconds']:.0f} s ({stats['graphs']} graphs)"
    )
    print(
        "| op | cases | flag changed bits | batch-variant off / on | nondeterministic off / on "
        "| outside the reference bound off / on |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for op, c in rows:
        print(
            f"| {op} | {c['cases']} | {c['changed']} | {c['variant disabled']} / "
            f"{c['variant enabled']} | {c['nondeterministic disabled']} / "
            f"{c['nondeterministic enabled']} | {c['outside reference disabled']} / "
            f"{c['outside reference enabled']} |"
        )


if __name__ == "__main__":
    main()
