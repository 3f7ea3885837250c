"""The controller side of the runner: long-lived workers, timeouts, crash recovery.

One worker per (target, switch state), started lazily and kept for many examples: process start and
the target's import cost (seconds for vLLM) are paid once, not per example. A crash (signal, abort),
a hang (no answer within the per-example timeout) or an out-of-memory kill is raised here as a
WorkerFailure, so Hypothesis records and shrinks it like any failure; the dead worker is replaced on
the next request. ``fresh`` runs one request in a brand-new worker to confirm a minimal failing case
in isolation. Imports neither torch nor the target's packages.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..case import Case
from ..observation import Hello, Observation
from .protocol import read_exact, receive, send

SWITCH_ENV = "VLLM_BATCH_INVARIANT"


class WorkerFailure(Exception):
    """The worker could not give an answer: the base of crash and hang findings."""

    kind = "error"


class WorkerCrash(WorkerFailure):
    """The worker process died (a signal, an abort, an out-of-memory kill) while running a case."""

    kind = "crash"


class WorkerHang(WorkerFailure):
    """The worker gave no answer within the per-example timeout; it was killed."""

    kind = "timeout"


class WorkerStartFailure(WorkerFailure):
    """The worker did not come up (bad interpreter, import crash, start timeout)."""


class InternalError(Exception):
    """bi_props itself failed inside the worker (a bug of ours, not a finding)."""


def _signal_name(returncode: int | None) -> str:
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        hint = " (likely killed for memory)" if returncode == -signal.SIGKILL else ""
        return f"{name}{hint}"
    return f"exit status {returncode}"


@dataclass
class Worker:
    """One spawned interpreter serving one (target, switch state)."""

    target: str
    switch: str
    start_timeout_s: float = 300.0
    extra_env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen | None = None
    hello: Hello | None = None
    log_path: Path | None = None
    requests: int = 0

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.extra_env)
        env[SWITCH_ENV] = "1" if self.switch == "enabled" else "0"
        env["BI_PROPS_TARGET"] = self.target
        env["BI_PROPS_SWITCH"] = self.switch
        env.setdefault("PYTHONUNBUFFERED", "1")
        # The worker must import the same bi_props as the controller, installed or not.
        package_root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(
            [package_root, *filter(None, [env.get("PYTHONPATH", "")])]
        )
        return env

    def start(self) -> Hello:
        self.spawn()
        return self.wait_hello()

    def spawn(self) -> None:
        """Start the interpreter; it imports the target while the caller does other work."""
        log = tempfile.NamedTemporaryFile(
            prefix=f"bi_props-{self.target.replace(':', '_').replace('/', '_')}-{self.switch}-",
            suffix=".log",
            delete=False,
        )
        self.log_path = Path(log.name)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "bi_props.runner.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            bufsize=0,  # unbuffered: select() must see every byte that has arrived
            env=self.environment(),
            start_new_session=True,
        )
        log.close()

    def wait_hello(self) -> Hello:
        try:
            hello = self._receive(self.start_timeout_s, "starting")
        except WorkerFailure as exc:
            raise WorkerStartFailure(str(exc)) from None
        if not isinstance(hello, Hello):
            raise WorkerStartFailure(f"worker sent {hello!r} instead of a hello")
        self.hello = hello
        return hello

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stderr_tail(self, lines: int = 25) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def _describe(self, doing: str) -> str:
        return f"worker for target {self.target!r} ({self.switch}) while {doing}"

    def _receive(self, timeout_s: float, doing: str) -> Any:
        assert self.process is not None and self.process.stdout is not None
        stream = self.process.stdout
        ready, _, _ = select.select([stream], [], [], timeout_s)
        if not ready:
            tail = self.stderr_tail()
            self.kill()
            raise WorkerHang(
                f"{self._describe(doing)}: no answer within {timeout_s:g} s; killed.\n"
                f"Last worker output:\n{tail}"
            )
        try:
            return receive(stream)
        except (EOFError, OSError):
            code = self.process.wait(timeout=30)
            raise WorkerCrash(
                f"{self._describe(doing)}: the process died ({_signal_name(code)}).\n"
                f"Last worker output:\n{self.stderr_tail()}"
            ) from None

    def request(self, message: tuple, timeout_s: float, doing: str) -> Any:
        assert self.process is not None and self.process.stdin is not None
        self.requests += 1
        try:
            send(self.process.stdin, message)
        except (BrokenPipeError, OSError):
            code = self.process.wait(timeout=30)
            raise WorkerCrash(
                f"{self._describe(doing)}: the process was already dead ({_signal_name(code)}).\n"
                f"Last worker output:\n{self.stderr_tail()}"
            ) from None
        status, payload = self._receive(timeout_s, doing)
        if status == "internal":
            raise InternalError(f"{self._describe(doing)}: bi_props failed:\n{payload}")
        return payload

    def kill(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self.process.kill()
        self.process.wait(timeout=30)
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                stream.close()
        if self.log_path is not None:  # crash and hang messages quoted it before the kill
            self.log_path.unlink(missing_ok=True)

    def close(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            try:
                assert self.process.stdin is not None
                send(self.process.stdin, ("exit",))
                self.process.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired, ValueError):
                pass
        self.kill()


class Runner:
    """Workers for one target, one per switch state, replaced when they crash or hang."""

    def __init__(
        self,
        target: str,
        *,
        example_timeout_s: float = 60.0,
        start_timeout_s: float = 300.0,
        extra_env: dict[str, str] | None = None,
    ) -> None:
        self.target = target
        self.example_timeout_s = example_timeout_s
        self.start_timeout_s = start_timeout_s
        self.extra_env = dict(extra_env or {})
        self._workers: dict[str, Worker] = {}
        self._hellos: dict[str, Hello] = {}
        self.starts = 0
        self.examples = 0
        self.seconds_in_workers = 0.0

    def _new_worker(self, switch: str) -> Worker:
        worker = Worker(self.target, switch, self.start_timeout_s, self.extra_env)
        self.starts += 1
        try:
            hello = worker.start()
        except BaseException:
            worker.kill()
            raise
        self._hellos[switch] = hello
        return worker

    def start_all(self, switches: tuple[str, ...] = ("disabled", "enabled")) -> None:
        """Start the workers of several switch states concurrently (a session's cold start is
        then one target import, not one per state)."""
        pending = []
        for switch in switches:
            if switch in self._workers and self._workers[switch].alive():
                continue
            worker = Worker(self.target, switch, self.start_timeout_s, self.extra_env)
            self.starts += 1
            worker.spawn()
            pending.append((switch, worker))
        for switch, worker in pending:
            try:
                self._hellos[switch] = worker.wait_hello()
            except BaseException:
                worker.kill()
                raise
            self._workers[switch] = worker

    def worker(self, switch: str) -> Worker:
        worker = self._workers.get(switch)
        if worker is None or not worker.alive():
            if worker is not None:
                worker.kill()
            worker = self._new_worker(switch)
            self._workers[switch] = worker
        return worker

    def hello(self, switch: str) -> Hello:
        """The target's self-description in this switch state (starts the worker if needed)."""
        if switch not in self._hellos:
            self.worker(switch)
        return self._hellos[switch]

    def observe(self, prop: str, case: Case, switch: str) -> Observation:
        worker = self.worker(switch)
        if worker.hello is not None and worker.hello.status != "ready":
            raise WorkerStartFailure(
                f"target {self.target!r} is {worker.hello.status}: {worker.hello.message}"
            )
        start = time.perf_counter()
        try:
            observation = worker.request(
                ("observe", prop, case), self.example_timeout_s, f"running {prop} on {case!r}"
            )
        except WorkerFailure:
            self._workers.pop(switch, None)
            worker.kill()
            raise
        finally:
            self.examples += 1
            self.seconds_in_workers += time.perf_counter() - start
        return observation

    def export(self, prop: str, case: Case, switch: str) -> dict:
        """The exact tensors (and reference) of a case, for a standalone reproducer."""
        worker = self.worker(switch)
        return worker.request(("export", prop, case), self.example_timeout_s, f"exporting {case!r}")

    def fresh(self, prop: str, case: Case, switch: str) -> Observation:
        """Run one case in a brand-new worker (then close it): does it reproduce in isolation?"""
        worker = Worker(self.target, switch, self.start_timeout_s, self.extra_env)
        try:
            worker.start()
            return worker.request(
                ("observe", prop, case), self.example_timeout_s, f"re-running {prop} on {case!r}"
            )
        finally:
            worker.close()

    def close(self) -> None:
        for worker in self._workers.values():
            worker.close()
        self._workers.clear()


__all__ = [
    "InternalError",
    "Runner",
    "Worker",
    "WorkerCrash",
    "WorkerFailure",
    "WorkerHang",
    "WorkerStartFailure",
    "read_exact",
]
