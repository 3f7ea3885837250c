"""Runner throughput, as ratios against a floor measured in the same run (these machines are noisy).

  (a) floor: a direct in-process loop, no isolation, no Hypothesis: materialise, call, judge;
  (b) the Hypothesis test through the isolated runner (one long-lived worker), as the suite runs it;
  (c) spawn-per-example: a fresh worker process for every example (the seed test's isolation).

Goal: (b) within 1.5x of (a) and at least 50x faster than (c). (d): what replacing a dead
worker costs, forked (the default on CPU targets) vs spawned. Also the cold start of a
`pytest --hypothesis-profile=cpu` session running one property test (the cpu profile's 25 examples:
an explicit --hypothesis-profile wins over the strategies file's max_examples), against the
floor `python -c "import torch"`.

    python benchmarks/runner_throughput.py [--examples 300] [--spawn-examples 10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from bi_props.catalogue.strategies import cases
from bi_props.model import properties
from bi_props.model.space import load_profile
from bi_props.runner.controller import Runner, Worker

OP, PROP = "mm", "determinism"


def draw_cases(n: int) -> list:
    """The same small cases for every mode (drawn once, outside the timings)."""
    space = load_profile("dev")
    drawn: list = []
    strategy = cases(space, OP, PROP)

    @settings(
        max_examples=n,
        database=None,
        derandomize=True,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def collect(case):
        drawn.append(case)

    collect()
    return drawn[:n]


def direct(cases_: list) -> float:
    from bi_props.execution.execute import observe
    from bi_props.targets.cpu import CpuTarget

    target = CpuTarget()  # disabled: stock kernels, like the workers below
    start = time.perf_counter()
    for case in cases_:
        assert properties.determinism(observe(PROP, case, target, "disabled")).ok
    return len(cases_) / (time.perf_counter() - start)


def hypothesis_loop(observe_case, n: int, round_seed: int, drawn: list) -> float:
    """Examples/s of the suite's shape: a Hypothesis test drawing cases (appended to ``drawn``)
    and judging each with ``observe_case(case) -> Observation``."""
    strategy = cases(load_profile("dev"), OP, PROP)

    @seed(round_seed)
    @settings(max_examples=n, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(st.data())
    def test(data):
        case = data.draw(strategy)
        drawn.append(case)
        assert properties.determinism(observe_case(case)).ok

    start = time.perf_counter()
    test()
    return len(drawn) / (time.perf_counter() - start)


def in_process_hypothesis(n: int, round_seed: int) -> float:
    """(a'): the same Hypothesis test judged in this process: Hypothesis' own cost."""
    from bi_props.execution.execute import observe
    from bi_props.targets.cpu import CpuTarget

    target = CpuTarget()
    return hypothesis_loop(lambda case: observe(PROP, case, target, "disabled"), n, round_seed, [])


def isolated_hypothesis(runner: Runner, n: int, round_seed: int, drawn: list) -> float:
    """(b): judged through a long-lived worker (started before the timing: a session pays it
    once, not per example)."""
    return hypothesis_loop(
        lambda case: runner.observe(PROP, case, "disabled"), n, round_seed, drawn
    )


def spawn_per_example(cases_: list) -> float:
    start = time.perf_counter()
    for case in cases_:
        worker = Worker("cpu", "disabled")
        worker.start()
        obs = worker.request(("observe", PROP, case), 60, "benchmark")
        assert properties.determinism(obs).ok
        worker.close()
    return len(cases_) / (time.perf_counter() - start)


def replacement_cost(fork: bool, n: int, case) -> float:
    """Seconds per (kill the serving worker, run one example on its replacement): what each
    failing replay of a crash costs while Hypothesis shrinks it."""
    runner = Runner("cpu", fork=fork)
    try:
        runner.observe(PROP, case, "disabled")
        start = time.perf_counter()
        for _ in range(n):
            runner._workers["disabled"].kill()
            runner.observe(PROP, case, "disabled")
        return (time.perf_counter() - start) / n
    finally:
        runner.close()


def cold_start() -> tuple[float, float]:
    floor_start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch"], check=True)
    floor = time.perf_counter() - floor_start
    with tempfile.TemporaryDirectory() as tmp:
        test = Path(tmp) / "test_one.py"
        test.write_text("from bi_props.suite.test_properties import test_property\n")
        space = Path(tmp) / "one.toml"
        space.write_text('[hypothesis]\nmax_examples = 1\n[ops]\ninclude = ["mm"]\n')
        start = time.perf_counter()
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                str(test),
                "-q",
                "-p",
                "no:cacheprovider",
                "--hypothesis-profile=cpu",
                f"--bi-strategies={space}",
                "-k",
                "mm-reference-enabled",
            ],
            check=True,
            capture_output=True,
            cwd=tmp,
            env={**os.environ},
        )
        session = time.perf_counter() - start
    return session, floor


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=300)
    parser.add_argument("--spawn-examples", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=10, help="interleaved rounds of (a), (b)")
    parser.add_argument("--replacements", type=int, default=10, help="worker replacements timed")
    args = parser.parse_args()
    cases_ = draw_cases(args.examples)
    direct(cases_[:20])  # warm up the in-process kernels once
    runner = Runner("cpu")
    runner.hello("disabled")
    chunk = max(1, args.examples // args.rounds)
    ratios, rates_a, rates_b, rates_h = [], [], [], []
    for r in range(args.rounds):  # interleaved rounds: machine noise hits both modes alike
        drawn: list = []
        rates_b.append(isolated_hypothesis(runner, chunk, r, drawn))
        rates_a.append(direct(drawn))  # the floor runs exactly the cases (b) ran
        rates_h.append(in_process_hypothesis(chunk, r))
        ratios.append(rates_a[-1] / rates_b[-1])
    runner.close()
    a, b = statistics.median(rates_a), statistics.median(rates_b)
    c = spawn_per_example(cases_[: args.spawn_examples])
    forked = replacement_cost(True, args.replacements, cases_[0])
    spawned = replacement_cost(False, args.replacements, cases_[0])
    session, floor = cold_start()
    h = statistics.median(rates_h)
    ratio = statistics.median(ratios)
    print(f"op={OP} property={PROP}, {args.rounds} interleaved rounds, stock CPU kernels")
    print(f"(a) direct in-process loop (floor): {a:8.1f} examples/s")
    print(f"(b) Hypothesis + isolated runner:   {b:8.1f} examples/s   (a)/(b) = {ratio:5.2f}x "
          f"(median per round; goal <= 1.5x)")  # fmt: skip
    print(f"    split: Hypothesis in-process {h:8.1f} examples/s, (a)/that = {a / h:4.2f}x; "
          f"the isolation itself: that/(b) = {h / b:4.2f}x")  # fmt: skip
    print(f"(c) spawn per example:              {c:8.2f} examples/s   (b)/(c) = {b / c:5.1f}x "
          f"(goal >= 50x)")  # fmt: skip
    print(
        f"(d) replacing a dead worker: spawned {spawned * 1000:7.1f} ms, forked "
        f"{forked * 1000:6.1f} ms: {spawned / forked:5.1f}x (a crash shrink pays it per replay)"
    )
    print(
        f"cold start: one-test (25-example) pytest session {session:.2f} s vs `import torch` "
        f"{floor:.2f} s: {session / floor:.1f}x"
    )


if __name__ == "__main__":
    main()
