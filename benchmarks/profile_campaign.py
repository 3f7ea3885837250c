"""Where a campaign's time goes, per example, against a floor measured in the same run.

Runs a real local campaign (``bi_props.campaigns.campaign.Campaign``, the code `bi-props fuzz`
runs) in this process against the built-in ``cpu`` target with README command 1's op mix (the
``cpu`` profile's ops, both switch states), with timers wrapped around the controller's parts:

- Hypothesis drawing the cases (every ``data.draw`` of a cell's or a control's case strategy);
- Hypothesis' engine around the examples, and each turn's set-up (a turn is one ``@given`` run of
  up to 10 examples with the campaign's example database); the set-up alone is measured apart as a
  turn of the same settings drawing nothing;
- the round trip to the worker (``Runner.observe``): pickling, the pipe, and the worker's work;
- judging (``Session.judge`` less the round trips in it) and the coverage bookkeeping of an
  example (``Session.check`` less ``judge``);
- progress, ledger, coverage and report writes (``Ledger`` and ``CampaignSession`` methods);
- the scheduler and the rest of the cells phase (the residual).

Inside the campaign's own workers (a sitecustomize.py on their PYTHONPATH, active only in worker
processes) exclusive timers split the worker's part into materialising tensors, the kernel
call(s), the float64 reference (inputs to float64 and ``references()``), the rest of the observer,
and pickling; the controller's pickling is timed too. The pipe's share is the round trips less all
of that. Every (property, case, switch) the workers observed is recorded and replayed afterwards,
cold, in one fresh process per switch state (loaded as a worker loads it) as the **floor**: a
direct in-process loop over exactly the same cases (observe, then judge), no Hypothesis, no
process boundary. The floor runs after the campaign, not interleaved with it: on a machine whose
load changes, its ratio is the noisiest number here (the shares are from one process tree).

    python benchmarks/profile_campaign.py [--budget 40] [--ops mm,sum] [--seed 1]

Only ratios and shares mean anything on a shared machine; state its load with the table.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

T: dict[str, float] = defaultdict(float)  # exclusive seconds per part (controller side)
N: dict[str, int] = defaultdict(int)
RECORDED: list[tuple[str, object, str]] = []  # (prop, case, switch) of every round trip
_stack: list[list] = []  # [part, start, seconds in timed children]


@contextmanager
def timed(part: str):
    """Time a part *exclusively*: a timed part inside it (a round trip inside judging, a write
    inside a turn) counts for itself only, so the parts add up to the cells phase. Outside the
    cells phase (start-up, the final report) nothing is counted."""
    if part != "cells_phase" and (not _stack or _stack[0][0] != "cells_phase"):
        yield
        return
    frame = [part, time.perf_counter(), 0.0]
    _stack.append(frame)
    try:
        yield
    finally:
        _stack.pop()
        elapsed = time.perf_counter() - frame[1]
        T[part] += elapsed - frame[2]
        N[part] += 1
        if _stack:
            _stack[-1][2] += elapsed
        else:
            T["wall"] += elapsed


def wrap(owner, name: str, part: str) -> None:
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):
        with timed(part):
            return original(*args, **kwargs)

    setattr(owner, name, wrapper)


def instrument() -> None:
    from hypothesis import strategies as st

    from bi_props.campaigns import campaign, fuzz, session
    from bi_props.runner import controller

    strategy = session.Session.strategy

    def timed_strategy(self, op, prop):
        inner = strategy(self, op, prop)

        @st.composite
        def drawn(draw):
            with timed("draw"):
                return draw(inner)

        key = ("timed", op, prop)
        if key not in self._strategies:
            self._strategies[key] = drawn()
        return self._strategies[key]

    session.Session.strategy = timed_strategy

    observe = controller.Runner.observe

    def timed_observe(self, prop, case, switch):
        RECORDED.append((prop, case, switch))
        with timed("observe"):
            return observe(self, prop, case, switch)

    controller.Runner.observe = timed_observe
    wrap(session.Session, "judge", "judge")
    wrap(session.Session, "check", "check")
    for name in ("progress", "turn", "turn_done", "save_state", "write_report", "record"):
        wrap(campaign.Ledger, name, "ledger")
    wrap(campaign.CampaignSession, "flush_examples", "ledger")
    wrap(session.Session, "control", "control_turn")
    run_slice = fuzz.run_slice

    def timed_slice(*args, **kwargs):
        with timed("cell_turn"):
            return run_slice(*args, **kwargs)

    campaign.run_slice = timed_slice
    wrap(campaign.Campaign, "_turns", "cells_phase")


def turn_setup_s(turns: int = 200) -> float:
    """Seconds per turn of a ``@given`` with run_slice's settings and the example database that
    draws nothing and runs one example: what each turn pays before its first case."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed
    from hypothesis import strategies as st
    from hypothesis.database import DirectoryBasedExampleDatabase

    with tempfile.TemporaryDirectory() as tmp:
        database = DirectoryBasedExampleDatabase(tmp)
        phases = [p for p in Phase if p not in (Phase.explain, Phase.reuse)]
        start = time.perf_counter()
        for i in range(turns):

            @settings(max_examples=1, database=database, deadline=None, derandomize=False,
                      print_blob=False, suppress_health_check=list(HealthCheck),
                      phases=phases)  # fmt: skip
            @given(data=st.data())
            def nothing(data):
                pass

            key = f"bi_props:profile:{i}".encode()
            nothing.hypothesis.inner_test._hypothesis_internal_add_digest = key
            nothing._hypothesis_internal_database_key = key
            nothing = hypothesis_seed(i)(nothing)
            nothing._hypothesis_internal_use_settings = settings(
                nothing._hypothesis_internal_use_settings, database=database
            )
            nothing()
        return (time.perf_counter() - start) / turns


# -- the worker side: timers inside the campaign's own workers ---------------------------------

# Written as sitecustomize.py into a directory on the workers' PYTHONPATH: in a worker process
# (BI_PROPS_TARGET set) it wraps the worker's parts with exclusive timers and rewrites its totals
# to PROFILE_DIR/<pid>.json after every example (forked workers end with os._exit: no atexit).
WORKER_HOOK = """
import os
if os.environ.get("BI_PROPS_TARGET") and os.environ.get("BI_PROPS_PROFILE_DIR"):
    import json, pickle, time
    from collections import defaultdict
    from bi_props.execution import execute
    from bi_props.model import catalogue
    from bi_props.runner import protocol

    T = defaultdict(float)
    STACK = []
    DIR = os.environ["BI_PROPS_PROFILE_DIR"]

    def timed(part, function):
        def wrapper(*args, **kwargs):
            frame = [time.perf_counter(), 0.0]
            STACK.append(frame)
            try:
                return function(*args, **kwargs)
            finally:
                STACK.pop()
                elapsed = time.perf_counter() - frame[0]
                T[part] += elapsed - frame[1]
                if STACK:
                    STACK[-1][1] += elapsed
        return wrapper

    class Pickle:
        HIGHEST_PROTOCOL = pickle.HIGHEST_PROTOCOL
        dumps = staticmethod(timed("pickling", pickle.dumps))
        loads = staticmethod(timed("pickling", pickle.loads))

    protocol.pickle = Pickle
    execute.operands = timed("materialise", execute.operands)
    execute._invoke = timed("kernel", execute._invoke)
    execute.to_float64 = timed("reference", execute.to_float64)
    for kind in {type(spec) for spec in catalogue.OPS.values()}:
        kind.references = timed("reference", kind.references)
    observe = timed("observer", execute.observe)

    def observe_and_save(*args, **kwargs):
        try:
            return observe(*args, **kwargs)
        finally:
            T["examples"] += 1
            path = os.path.join(DIR, f"{os.getpid()}.json")
            with open(path + ".tmp", "w") as f:
                json.dump(T, f)
            os.replace(path + ".tmp", path)

    execute.observe = observe_and_save
"""


def worker_totals(directory: Path) -> dict[str, float]:
    total: dict[str, float] = defaultdict(float)
    for path in directory.glob("*.json"):
        for key, value in json.loads(path.read_text()).items():
            total[key] += value
    return total


class _TimedPickle:
    """The controller's side of the protocol's pickling (protocol.pickle replaced by this)."""

    HIGHEST_PROTOCOL = pickle.HIGHEST_PROTOCOL

    @staticmethod
    def dumps(*args, **kwargs):
        with timed("pickling"):
            return pickle.dumps(*args, **kwargs)

    @staticmethod
    def loads(*args, **kwargs):
        with timed("pickling"):
            return pickle.loads(*args, **kwargs)


# -- the floor: the same cases replayed in a fresh process per switch state ---------------------


def replay(path: str, switch: str) -> None:
    """In a process whose environment holds the switch: the floor, a direct loop over the
    recorded cases of ``switch`` (observe, then judge); print a pickled dict on stdout."""
    from bi_props.execution import execute
    from bi_props.model import property_spec
    from bi_props.runner.worker import _load

    with open(path, "rb") as f:
        recorded = [(p, c) for p, c, s in pickle.load(f) if s == switch]
    hello, target = _load("cpu", switch)
    assert target is not None, hello.message

    def judge(prop, case, observation):
        spec = property_spec.get(prop)
        if spec.both_states:
            return spec.judge(observation, observation)
        if spec.needs_hello:
            return spec.judge(observation, hello, case.op)
        return spec.judge(observation)

    # No warm-up: the campaign's workers start cold too (first calls load kernels lazily).
    start = time.perf_counter()
    for prop, case in recorded:
        judge(prop, case, execute.observe(prop, case, target, switch))
    floor = time.perf_counter() - start
    sys.stdout.buffer.write(pickle.dumps({"examples": len(recorded), "floor": floor}))


def replay_all(path: Path) -> dict[str, float]:
    total: dict[str, float] = defaultdict(float)
    for switch in ("enabled", "disabled"):
        env = dict(os.environ, VLLM_BATCH_INVARIANT="1" if switch == "enabled" else "0",
                   BI_PROPS_TARGET="cpu", BI_PROPS_SWITCH=switch)  # fmt: skip
        done = subprocess.run(
            [sys.executable, __file__, "--replay", str(path), "--switch", switch],
            env=env,
            capture_output=True,
            check=False,
        )
        if done.returncode != 0:
            raise SystemExit(done.stderr.decode(errors="replace")[-3000:])
        for key, value in pickle.loads(done.stdout).items():
            total[key] += value
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=40.0, help="the campaign's budget (s)")
    parser.add_argument("--ops", default="", help="comma-separated ops (default: the profile's)")
    parser.add_argument("--profile", default="cpu")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--replay", help=argparse.SUPPRESS)
    parser.add_argument("--switch", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.replay:
        replay(args.replay, args.switch)
        return

    from dataclasses import replace

    from bi_props.campaigns.campaign import Campaign
    from bi_props.model.space import load_profile

    space = load_profile(args.profile)
    if args.ops:
        space = replace(space, ops=tuple(args.ops.split(",")))
    instrument()
    from bi_props.runner import protocol

    protocol.pickle = _TimedPickle
    log = io.StringIO()
    with tempfile.TemporaryDirectory() as tmp:
        hook, profile_dir = Path(tmp) / "hook", Path(tmp) / "profile"
        hook.mkdir()
        profile_dir.mkdir()
        (hook / "sitecustomize.py").write_text(WORKER_HOOK)
        os.environ["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(hook), os.environ.get("PYTHONPATH", "")])
        )
        os.environ["BI_PROPS_PROFILE_DIR"] = str(profile_dir)
        campaign = Campaign(["cpu"], space, Path(tmp) / "out", args.budget, seed=args.seed,
                            log=log, write_reports=False)  # fmt: skip
        status = campaign.run()
        worker = worker_totals(profile_dir)
        del os.environ["BI_PROPS_PROFILE_DIR"]
        path = Path(tmp) / "recorded.pkl"
        with path.open("wb") as f:
            pickle.dump(RECORDED, f)
        floor = replay_all(path)
    setup = turn_setup_s()
    turns = N["cell_turn"] + N["control_turn"]
    examples = N["draw"]
    phase = T["wall"]
    engine = T["cell_turn"] + T["control_turn"]  # exclusive: less draws, checks, writes
    setup_total = min(setup * turns, engine)
    worker_parts = ("observer", "materialise", "kernel", "reference", "pickling")
    in_workers = sum(worker[p] for p in worker_parts)
    pipe = T["observe"] - in_workers  # the round trips, less all the workers' timed work
    kernel, materialise, reference = worker["kernel"], worker["materialise"], worker["reference"]
    other_worker = worker["observer"]
    rows = [
        ("Hypothesis: drawing the cases", T["draw"]),
        ("Hypothesis: per-turn set-up (run, database), measured alone x turns", setup_total),
        ("Hypothesis: the rest of its engine (and the controls' judging)", engine - setup_total),
        ("pickling request and answer (both sides)", T["pickling"] + worker["pickling"]),
        ("the pipe and the process switch", pipe),
        ("materialising tensors", materialise),
        ("the kernel call(s), outputs to bits", kernel),
        ("the float64 reference (inputs to float64, references())", reference),
        ("other observer work (profiler windows, slicing, Observation)", other_worker),
        ("judging", T["judge"]),
        ("coverage bookkeeping per example", T["check"]),
        ("progress, ledger, coverage and report writes", T["ledger"]),
        ("scheduler and the rest of the cells phase", T["cells_phase"]),
    ]
    accounted = sum(s for _, s in rows)
    print(f"campaign: cpu target, {len(space.ops)} ops, budget {args.budget:g} s, seed "
          f"{args.seed}, exit {status}; {examples} examples in {turns} turns "
          f"({examples / max(turns, 1):.1f} per turn), cells phase {phase:.1f} s; "
          f"{len(RECORDED)} round trips; load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    print()
    print("| part | seconds | share | ms per example |")
    print("| --- | --- | --- | --- |")
    for name, seconds in rows:
        print(f"| {name} | {seconds:.2f} | {seconds / phase:.1%} | "
              f"{1000 * seconds / max(examples, 1):.3f} |")  # fmt: skip
    print(f"| (accounted / cells phase) | {accounted:.2f} / {phase:.2f} | "
          f"{accounted / phase:.1%} | |")  # fmt: skip
    campaign_rate = examples / phase
    floor_rate = examples / floor["floor"]
    print()
    print(f"campaign: {campaign_rate:.1f} examples/s over the cells phase")
    print(f"floor (direct in-process loop, the same {int(floor['examples'])} round trips' cases, "
          f"observe + judge): {floor_rate:.1f} examples/s")  # fmt: skip
    print(f"floor / campaign = {floor_rate / campaign_rate:.2f}x (goal: within 2x)")
    print(f"kernel calls alone: {100 * kernel / phase:.1f}% of the cells phase; per-turn "
          f"set-up alone {1000 * setup:.1f} ms per turn")  # fmt: skip


if __name__ == "__main__":
    main()
