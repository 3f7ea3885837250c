"""The runner directly (``bi_props.runner.controller``): long-lived workers, crashes, hangs, fresh
processes, targets that cannot load; and the plugin's rule for a target that is missing.

The targets are the planted libraries of ``tests/planted/`` (put on the workers' PYTHONPATH).
``planted_probe`` appends a JSON line per ``enable()`` and per kernel call to the file named by
``BI_PLANTED_PROBE``: its pid and whether Hypothesis or pytest is imported in its process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from bi_props.model import properties
from bi_props.model.case import Case
from bi_props.runner.controller import (
    CONFIRM_GRACE_S,
    ConfirmationCut,
    Runner,
    Worker,
    WorkerCrash,
    WorkerFailure,
    WorkerHang,
    WorkerStartFailure,
)

pytestmark = pytest.mark.slow

PLANTED = Path(__file__).resolve().parent / "planted"
MISSING = "bi_props_planted_no_such_module"


@pytest.fixture(autouse=True)
def planted_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers inherit the environment: put the planted libraries on their PYTHONPATH."""
    paths = [str(PLANTED), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, paths)))


@pytest.fixture
def probe_file(tmp_path: Path) -> Path:
    return tmp_path / "probe.jsonl"


def probe_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@contextmanager
def running(target: str, **kwargs: Any) -> Iterator[Runner]:
    """A Runner for ``target`` whose workers are closed afterwards, whatever happens."""
    runner = Runner(target, start_timeout_s=120, **kwargs)
    try:
        yield runner
    finally:
        runner.close()


@pytest.fixture
def probe_runner(probe_file: Path) -> Iterator[Runner]:
    with running("planted_probe", extra_env={"BI_PLANTED_PROBE": str(probe_file)}) as runner:
        yield runner


def mm_case(m: int = 3, k: int = 5, n: int = 4, seed: int = 0) -> Case:
    return Case(
        "mm", "torch.mm", "float32", (m, k, n), ("contiguous", "contiguous"), "general", seed
    )


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


# -- one worker, many examples ------------------------------------------------------------------


def test_worker_is_reused_across_examples(probe_runner: Runner, probe_file: Path):
    hello = probe_runner.hello("enabled")
    assert hello.status == "ready", hello.message
    assert hello.pid > 0 and hello.pid != os.getpid()
    assert hello.covered == ("mm",)
    assert hello.kernel_prefix == "planted_probe::"
    assert hello.forkable, hello.fork_note  # a CPU library whose loading starts no thread

    for i in range(20):
        case = mm_case(m=1 + i, k=i % 7, n=1 + i % 3, seed=i)
        observation = probe_runner.observe("reference", case, "enabled")
        assert properties.reference(observation).ok, properties.reference(observation).message

    assert (probe_runner.starts, probe_runner.forks) == (1, 1)
    assert probe_runner.examples == 20
    assert probe_runner.hello("enabled").pid == hello.pid
    lines = probe_lines(probe_file)
    assert [line["event"] for line in lines] == ["enable"] + ["mm"] * 20
    # One import of the target (in the fork server), 20 calls in one serving child.
    assert lines[0]["pid"] != hello.pid
    assert {line["pid"] for line in lines[1:]} == {hello.pid}
    assert [line["rows"] for line in lines[1:]] == list(range(1, 21))


def test_without_forking_one_spawned_process_loads_and_serves(probe_file: Path):
    env = {"BI_PLANTED_PROBE": str(probe_file)}
    with running("planted_probe", extra_env=env, fork=False) as runner:
        hello = runner.hello("enabled")
        for i in range(5):
            runner.observe("reference", mm_case(m=1 + i, seed=i), "enabled")
        assert (runner.starts, runner.forks) == (1, 0)
    lines = probe_lines(probe_file)
    assert [line["event"] for line in lines] == ["enable"] + ["mm"] * 5
    assert {line["pid"] for line in lines} == {hello.pid}


def test_forking_is_refused_where_the_environment_says_so(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("BI_PROPS_FORK", "0")
    with running("planted_correct") as runner:
        hello = runner.hello("enabled")
        assert not hello.forkable and "BI_PROPS_FORK=0" in hello.fork_note
        runner.observe("reference", mm_case(), "enabled")
        assert (runner.starts, runner.forks) == (1, 0)


def test_a_target_that_starts_threads_while_loading_is_not_forked():
    """A forked copy of a process with thread pools would hang in its first parallel region
    (and the hang would be reported as a finding): such targets get spawned workers."""
    with running("planted_threads") as runner:
        hello = runner.hello("enabled")
        assert hello.status == "ready", hello.message
        assert not hello.forkable
        assert "started 1 thread(s)" in hello.fork_note
        assert properties.reference(runner.observe("reference", mm_case(), "enabled")).ok
        assert (runner.starts, runner.forks) == (1, 0)


def test_worker_imports_neither_hypothesis_nor_pytest(probe_runner: Runner, probe_file: Path):
    for switch in ("disabled", "enabled"):
        observation = probe_runner.observe("routing", mm_case(), switch)
        assert properties.routing(observation, probe_runner.hello(switch), "mm").ok
    lines = probe_lines(probe_file)
    # Both workers loaded the target, and the enabled one ran the kernel: after
    # bi_props.execution.execute and torch were imported and an example was served.
    assert [line["event"] for line in lines].count("enable") == 2
    assert any(line["event"] == "mm" for line in lines)
    for line in lines:
        assert line["hypothesis"] is False, line
        assert line["pytest"] is False, line


# -- crashes and hangs (forked serving processes, and spawned ones) ----------------------------


@pytest.fixture(params=[True, False], ids=["forked", "spawned"])
def fork(request: pytest.FixtureRequest) -> bool:
    return request.param


def replacements(runner: Runner) -> int:
    """Serving processes started: forks where forking, else interpreter starts."""
    return runner.forks if runner.fork else runner.starts


@pytest.fixture
def crash_runner(fork: bool) -> Iterator[Runner]:
    with running("planted_crash", example_timeout_s=60, fork=fork) as runner:
        yield runner


def test_crash_raises_worker_crash_and_the_next_example_gets_a_new_worker(crash_runner: Runner):
    assert properties.reference(crash_runner.observe("reference", mm_case(m=100), "enabled")).ok
    first = crash_runner._workers["enabled"]
    first_pid = crash_runner.hello("enabled").pid

    with pytest.raises(WorkerCrash, match="SIGSEGV") as crash:
        crash_runner.observe("reference", mm_case(m=101), "enabled")
    assert crash.value.kind == "crash"
    assert isinstance(crash.value, WorkerFailure)
    assert "planted_crash" in str(crash.value)
    assert first._exit_code() == -signal.SIGSEGV
    assert not pid_alive(first_pid)  # reaped, not a zombie

    observation = crash_runner.observe("reference", mm_case(m=4), "enabled")
    assert properties.reference(observation).ok
    assert replacements(crash_runner) == 2
    assert crash_runner.starts == 1 if crash_runner.fork else 2  # forking: one target import
    assert crash_runner.hello("enabled").pid != first_pid
    assert crash_runner.examples == 3


def test_a_crashed_workers_log_is_removed(crash_runner: Runner):
    crash_runner.observe("reference", mm_case(m=4), "enabled")
    log = crash_runner._workers["enabled"].log_path
    assert log is not None and log.exists()
    with pytest.raises(WorkerCrash):
        crash_runner.observe("reference", mm_case(m=101), "enabled")
    assert not log.exists()


def test_hang_raises_worker_hang_after_the_timeout_and_kills_the_worker(fork: bool):
    with running("planted_hang", example_timeout_s=2, fork=fork) as runner:
        assert properties.reference(runner.observe("reference", mm_case(k=6), "enabled")).ok
        stuck = runner._workers["enabled"]
        stuck_pid = runner.hello("enabled").pid

        start = time.monotonic()
        with pytest.raises(WorkerHang, match="no answer within 2 s") as hang:
            runner.observe("reference", mm_case(k=7), "enabled")
        waited = time.monotonic() - start
        assert 2 <= waited < 30
        assert hang.value.kind == "timeout"
        assert stuck._exit_code() == -signal.SIGKILL  # killed (and reaped), not left sleeping
        assert not pid_alive(stuck_pid)

        assert properties.reference(runner.observe("reference", mm_case(k=8), "enabled")).ok
        assert replacements(runner) == 2


def test_a_fresh_confirmation_cut_at_the_campaign_end_is_not_a_hang():
    """Past the campaign's end a fresh-process confirmation waits only CONFIRM_GRACE_S: a hang
    cut there proves nothing, so it raises ConfirmationCut (not confirmed), never WorkerHang
    (which would confirm a timeout finding)."""
    with running("planted_hang", example_timeout_s=60, fork=False) as runner:
        runner.deadline = time.monotonic() - CONFIRM_GRACE_S + 1.0  # 1 s of grace left
        start = time.monotonic()
        with pytest.raises(ConfirmationCut, match="at the campaign's end"):
            runner.fresh("reference", mm_case(k=7), "enabled")
        assert time.monotonic() - start < 30  # the 60 s example timeout was not waited out
        runner.deadline = None  # with no deadline, the same hang is a hang
        with pytest.raises(WorkerHang):
            runner.example_timeout_s = 2
            runner.fresh("reference", mm_case(k=7), "enabled")


def test_many_crashes_cost_forks_not_imports():
    """Shrinking a crash replays it again and again: each replay must cost a fork."""
    with running("planted_crash") as runner:
        for _ in range(10):
            with pytest.raises(WorkerCrash, match="SIGSEGV"):
                runner.observe("reference", mm_case(m=101), "enabled")
        assert properties.reference(runner.observe("reference", mm_case(m=3), "enabled")).ok
        assert (runner.starts, runner.forks) == (1, 11)


def test_a_dead_fork_server_is_replaced():
    with running("planted_correct") as runner:
        runner.observe("reference", mm_case(), "enabled")
        zygote = runner._zygotes["enabled"]
        zygote.kill()
        runner._workers["enabled"].kill()
        assert properties.reference(runner.observe("reference", mm_case(), "enabled")).ok
        assert (runner.starts, runner.forks) == (2, 2)


def test_closing_the_runner_leaves_no_process(probe_runner: Runner):
    probe_runner.observe("reference", mm_case(), "enabled")
    probe_runner.observe("reference", mm_case(), "disabled")
    pids = [probe_runner.hello(s).pid for s in ("enabled", "disabled")]
    pids += [z.process.pid for z in probe_runner._zygotes.values()]
    assert len(set(pids)) == 4
    probe_runner.close()
    assert not any(pid_alive(pid) for pid in pids)


def test_fresh_runs_in_a_new_process_and_leaves_the_long_lived_worker(
    probe_runner: Runner, probe_file: Path
):
    long_lived = probe_runner.hello("enabled").pid
    observation = probe_runner.fresh("reference", mm_case(m=2), "enabled")
    assert properties.reference(observation).ok

    lines = probe_lines(probe_file)
    enables = [line["pid"] for line in lines if line["event"] == "enable"]
    # the fork server's, then the fresh interpreter's (then, maybe already, the spare's)
    assert len(enables) in (2, 3)
    fresh = enables[1]
    assert fresh not in (long_lived, enables[0])
    assert [line["pid"] for line in lines if line["event"] == "mm"] == [fresh]
    assert not pid_alive(fresh)  # closed after its one request
    assert probe_runner.starts == 1  # fresh workers are not the runner's long-lived ones
    assert probe_runner._workers["enabled"].alive()
    assert probe_runner.hello("enabled").pid == long_lived

    # The next confirmation finds a spare interpreter, spawned after the first one's run: new,
    # loaded in the background, and it ran nothing before this case.
    (spare,) = probe_runner._spares["enabled"]
    assert spare.alive() and probe_runner.spares_used == 0
    again = probe_runner.fresh("reference", mm_case(m=3), "enabled")
    assert properties.reference(again).ok and probe_runner.spares_used == 1
    lines = probe_lines(probe_file)
    mm_pids = [line["pid"] for line in lines if line["event"] == "mm"]
    assert mm_pids[0] == fresh and mm_pids[1] == spare.process.pid
    assert spare.process.pid not in (long_lived, fresh)
    assert not pid_alive(spare.process.pid)


def test_fresh_reports_a_crash_of_the_new_process():
    with running("planted_crash") as runner, pytest.raises(WorkerCrash, match="SIGSEGV"):
        runner.fresh("reference", mm_case(m=101), "enabled")


def test_a_worker_can_be_driven_directly():
    worker = Worker("planted_correct", "enabled", start_timeout_s=120)
    try:
        hello = worker.start()
        assert hello.status == "ready" and hello.switch == "enabled"
        assert worker.alive() and worker.process.pid == hello.pid
        observation = worker.request(("observe", "determinism", mm_case()), 60, "x")
        assert properties.determinism(observation).ok
    finally:
        worker.close()
    assert not worker.alive()


# -- targets that cannot load -------------------------------------------------------------------


def test_missing_module_says_hello_with_status_missing():
    with running(MISSING) as runner:
        hello = runner.hello("disabled")
        assert hello.status == "missing"
        assert MISSING in hello.message
        assert "PYTHONPATH" in hello.message  # says how to fix it
        with pytest.raises(WorkerStartFailure, match="missing"):
            runner.observe("reference", mm_case(), "disabled")


@pytest.mark.parametrize("switch", ["disabled", "enabled"])
def test_enable_raising_gives_status_broken_with_the_exception(switch: str):
    with running("planted_broken_enable") as runner:
        hello = runner.hello(switch)
        assert hello.status == "broken"
        state = "True" if switch == "enabled" else "False"
        assert f"enable({state}) raised" in hello.message
        assert "RuntimeError" in hello.message
        assert f"planted: no accelerator for enable({state})" in hello.message


def test_unknown_op_in_ops_gives_status_broken_naming_it():
    with running("planted_unknown_op") as runner:
        hello = runner.hello("enabled")
        assert hello.status == "broken"
        assert "flash_mm" in hello.message
        assert "['flash_mm']" in hello.message  # mm itself is known


def test_missing_dependency_of_a_present_target_is_broken_not_missing():
    with running("planted_bad_import") as runner:
        hello = runner.hello("disabled")
        assert hello.status == "broken", hello.message
        assert "bi_props_planted_absent_dependency" in hello.message


def test_missing_dependency_named_like_a_prefix_of_the_target_is_broken():
    with running("planted_prefix_dep") as runner:
        hello = runner.hello("disabled")
        assert hello.status == "broken", hello.message


# -- the plugin on a missing target -------------------------------------------------------------

PROPERTY_TESTS = (
    "from bi_props.suite.test_properties import test_batch_variance_control, test_property\n"
)


def test_plugin_fails_the_session_with_one_message_for_a_missing_target(pytester):
    pytester.makepyfile(test_props=PROPERTY_TESTS)
    result = pytester.runpytest_subprocess(
        "--hypothesis-profile=ci", "--bi-target", MISSING, "-p", "no:cacheprovider", timeout=120
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    output = result.stdout.str() + result.stderr.str()
    headline = f"bi_props: target {MISSING!r} cannot run here (missing)"
    assert output.count(headline) == 1, output
    assert "--bi-allow-missing" in output  # says how to skip instead
    assert "Traceback" not in output
    assert "passed" not in output and "failed" not in output


def test_plugin_with_allow_missing_skips_loudly(pytester):
    pytester.makepyfile(test_props=PROPERTY_TESTS)
    result = pytester.runpytest_subprocess(
        "--hypothesis-profile=ci",
        "--bi-target",
        MISSING,
        "--bi-allow-missing",
        "-p",
        "no:cacheprovider",
        timeout=120,
    )
    assert result.ret == pytest.ExitCode.OK
    outcomes = result.parseoutcomes()
    assert outcomes.get("skipped", 0) > 0
    assert "passed" not in outcomes and "failed" not in outcomes
    result.stdout.fnmatch_lines(
        [
            "*bi_props: NOT RUN ON THE INTENDED HARDWARE*",
            f"*{outcomes['skipped']} property tests did not run*{MISSING}*",
        ]
    )


def test_a_runner_never_closed_leaves_no_worker_log_behind(tmp_path: Path) -> None:
    """Each worker logs to a temporary file, removed when it is closed or killed; a Runner left
    to the interpreter's exit (a test that stopped early) removes them then, in the process
    that made them only. Runs left hundreds of empty ``bi_props-*.log`` files in /tmp before."""
    script = (
        "from bi_props.runner.controller import Runner\n"
        "runner = Runner('cpu', start_timeout_s=120)\n"
        "runner.start_all()\n"
        "pools = (runner._workers, runner._zygotes)\n"
        "print([str(w.log_path) for pool in pools for w in pool.values()])\n"
    )
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300
    )
    assert done.returncode == 0, done.stderr
    logs = eval(done.stdout.strip().splitlines()[-1])
    assert len(logs) >= 2 and all(log.startswith(str(tmp_path)) for log in logs), logs
    assert not list(tmp_path.glob("bi_props-*.log")), list(tmp_path.iterdir())
