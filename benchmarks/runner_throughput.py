"""Runner throughput, as ratios against a floor measured in the same run (these machines are noisy).

  (a) floor: a direct in-process loop, no isolation, no Hypothesis: materialise, call, judge;
  (b) the Hypothesis test through the isolated runner (one long-lived worker), as the suite runs it;
  (c) spawn-per-example: a fresh worker process for every example (the seed test's isolation).

Goal: (b) within 1.5x of (a) and at least 50x faster than (c). Also the cold start of a
`pytest --hypothesis-profile=cpu` session running one property test with one example, against the
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

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bi_props import properties
from bi_props.runner.controller import Runner, Worker
from bi_props.space import load_profile
from bi_props.strategies import cases

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
    from bi_props.execute import observe
    from bi_props.targets.cpu import CpuTarget

    target = CpuTarget()  # disabled: stock kernels, like the workers below
    start = time.perf_counter()
    for case in cases_:
        assert properties.determinism(observe(PROP, case, target, "disabled")).ok
    return len(cases_) / (time.perf_counter() - start)


def isolated_hypothesis(n: int) -> float:
    space = load_profile("dev")
    runner = Runner("cpu")
    runner.hello("disabled")  # worker start is paid once per session, not per example
    count = 0
    strategy = cases(space, OP, PROP)

    @settings(
        max_examples=n,
        database=None,
        deadline=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(st.data())
    def test(data):
        nonlocal count
        case = data.draw(strategy)
        assert properties.determinism(runner.observe(PROP, case, "disabled")).ok
        count += 1

    start = time.perf_counter()
    test()
    rate = count / (time.perf_counter() - start)
    runner.close()
    return rate


def spawn_per_example(cases_: list) -> float:
    start = time.perf_counter()
    for case in cases_:
        worker = Worker("cpu", "disabled")
        worker.start()
        obs = worker.request(("observe", PROP, case), 60, "benchmark")
        assert properties.determinism(obs).ok
        worker.close()
    return len(cases_) / (time.perf_counter() - start)


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
                "--bi-strategies",
                str(space),
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
    parser.add_argument("--rounds", type=int, default=3, help="alternate (a) and (b); take medians")
    args = parser.parse_args()
    cases_ = draw_cases(args.examples)
    direct(cases_[:20])  # warm up the in-process kernels once
    rates_a, rates_b = [], []
    for _ in range(args.rounds):  # interleaved, so that machine noise hits both alike
        rates_a.append(direct(cases_))
        rates_b.append(isolated_hypothesis(args.examples))
    a, b = statistics.median(rates_a), statistics.median(rates_b)
    c = spawn_per_example(cases_[: args.spawn_examples])
    session, floor = cold_start()
    print(f"op={OP} property={PROP}, {len(cases_)} small cases, stock CPU kernels")
    print(f"(a) direct in-process loop (floor): {a:8.1f} examples/s")
    print(
        f"(b) Hypothesis + isolated runner:   {b:8.1f} examples/s   (a)/(b) = {a / b:5.2f}x "
        f"(goal <= 1.5x)"
    )
    print(
        f"(c) spawn per example:              {c:8.2f} examples/s   (b)/(c) = {b / c:5.1f}x "
        f"(goal >= 50x)"
    )
    print(
        f"cold start: one-example pytest session {session:.2f} s vs `import torch` "
        f"{floor:.2f} s: {session / floor:.1f}x"
    )


if __name__ == "__main__":
    main()
