"""The controller side of the runner: long-lived workers, timeouts, crash recovery.

One worker per (target, switch state), started lazily and kept for many examples: process start and
the target's import cost (seconds for vLLM) are paid once, not per example. A crash (signal, abort),
a hang (no answer within the per-example timeout) or an out-of-memory kill is raised here as a
WorkerFailure, so Hypothesis records and shrinks it like any failure; the dead worker is replaced on
the next request. ``fresh`` runs one request in a brand-new worker to confirm a minimal failing case
in isolation. Imports neither torch nor the target's packages.

Hang suspicion (``Runner.suspect_hangs``, on in `bi-props fuzz`): while searching and shrinking, an
example's timeout comes from the op's own observed cost, ``min(example_timeout_s,
max(SUSPECT_FLOOR_S, SUSPECT_FACTOR x slowest))``, so a hang is suspected in seconds instead of
after the profile's whole timeout. A suspicion is only that: a finding of a hang needs the
fresh-process confirmation, which always waits the profile's full ``example_timeout_s``
(campaigns/hangs.py says what an unconfirmed suspicion becomes).
"""

from __future__ import annotations

import atexit
import os
import select
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, BinaryIO

from ..integrations.switches import PROVIDER_ENV
from ..model.case import Case
from ..model.modes import CompileStats, effective_modes, settle_mode
from ..model.observation import Hello, Observation
from ..model.op_registry import OPS
from .protocol import read_exact, receive, send
from .worker import FORK_FD_ENV

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


class DeadlineReached(KeyboardInterrupt):
    """An example cut at the campaign's end: its timeout had been shortened to the time left
    (``Runner.deadline``), so its silence proves no hang. A KeyboardInterrupt, so that Hypothesis
    stops at once and takes it for no failure; the campaign's slice ends there."""


CONFIRM_GRACE_S = 5.0
"""Past the campaign's end, a fresh-process confirmation or a reproducer's export may still wait
this long for its one example (then the confirmation is cut: ``ConfirmationCut``)."""

CONFIRM_PATIENCE = 3.0
"""A fresh-process confirmation of a finding that is not a hang waits this many example timeouts
for its one example: it is the first example of a new interpreter (cold caches, lazy kernel
loads) and often runs on a loaded machine, and what it must show is the finding's kind, not speed.
A hang's confirmation keeps the profile's timeout: that timeout is the finding."""


SUSPECT_FACTOR = 20.0
"""A suspected hang: no answer within this many times the slowest completed call of the same
(op, property, switch state) in this run. Generous on purpose: a loaded 2-core machine (several
campaigns, a compiler, pytest at once) makes a call a few times slower than it was, and the
scaling by size (``suspect_timeout``'s ``scale``) is only a linear estimate; 20x leaves room for
both, while a real hang still shows within seconds instead of the profile's minute."""

SUSPECT_FLOOR_S = 5.0
"""The shortest timeout a suspicion may use. Calls of milliseconds would otherwise get a timeout
of a fraction of a second, which a scheduler stall, a garbage collection or a burst of load on a
shared machine can exceed without any hang; a real hang costs only these few seconds per
hanging example (Hypothesis' shrink replays the hanging case many times)."""

COMPILE_PATIENCE = 5.0
"""A compiled case (``Case.mode``) waits this many example timeouts, and is never suspected of a
hang from the op's observed cost: its call may compile a new graph (seconds to minutes: a whole
probe model, fresh caches, a loaded machine), and compile time is no kernel's time. A real hang
under compile is found all the same, later."""


def suspect_timeout(full_s: float, slowest_s: float | None, scale: float = 1.0) -> float:
    """The example timeout while searching: ``min(full_s, max(SUSPECT_FLOOR_S, SUSPECT_FACTOR
    x slowest_s x scale))``. ``slowest_s`` is the slowest completed call observed (None: none
    yet, so the profile's full timeout: a first call may pay lazy imports, kernel loads, a JIT);
    ``scale`` (>= 1) is how much more work this case asks than the largest call observed."""
    if slowest_s is None:
        return full_s
    wanted = SUSPECT_FACTOR * slowest_s * max(scale, 1.0)
    return min(full_s, max(SUSPECT_FLOOR_S, round(wanted, 1)))


def case_work(case: Case) -> int:
    """A case's size as the runner scales costs by: where the op states a cost model
    (``OpSpec.cost``), its cost of the needle and of each companion (attention's grows with the
    square of a sequence's keys, so a 512-key needle beside an 886-key sequence is no "smaller
    case" than 263 short rows of a wider head); else rows across the batch times the product of
    the other extents (for mm's (M, K, N): M x K x N, its multiply-adds); at least 1."""
    spec = OPS.get(case.op)
    if spec is not None and spec.cost is not None and case.shape:
        try:
            work = spec.sample_cost(case, int(case.shape[0]))
            if case.batch is not None:
                work += sum(spec.sample_cost(case, c.rows) for c in case.batch.companions)
            return max(int(work), 1)
        except Exception:  # a cost model that cannot read this case: the shape's product
            pass
    shape = tuple(case.shape)
    rows = shape[0] if shape else 1
    if case.batch is not None:
        rows += sum(c.rows for c in case.batch.companions)
    work = max(rows, 1)
    for extent in shape[1:]:
        work *= max(int(extent), 1)
    return work


@dataclass
class _Cost:
    """The completed calls of one (op, property, switch state): the slowest (seconds, round trip
    in the controller) and the largest (``case_work``)."""

    slowest_s: float = 0.0
    largest: int = 1
    calls: int = 0


class ConfirmationCut(WorkerFailure):
    """A fresh-process confirmation whose example was still running when its timeout, shortened
    to the campaign's end (plus ``CONFIRM_GRACE_S``), ran out: its silence proves no hang, so
    the finding is "not confirmed", never "reproduced" as a timeout."""


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


class _Channel:
    """One serving process behind a request/answer channel: the part shared by spawned and
    forked workers (framing, timeouts, and turning a dead or silent process into a finding)."""

    target: str
    switch: str
    hello: Hello | None
    log_path: Path | None
    requests: int

    def _inbox(self) -> BinaryIO:
        raise NotImplementedError

    def _outbox(self) -> BinaryIO:
        raise NotImplementedError

    def _exit_code(self) -> int | None:
        """Wait for the (dead or killed) process and return its Popen-style return code."""
        raise NotImplementedError

    def alive(self) -> bool:
        raise NotImplementedError

    def kill(self) -> None:
        raise NotImplementedError

    def stderr_tail(self, lines: int = 25) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def _describe(self, doing: str) -> str:
        return f"worker for target {self.target!r} ({self.switch}) while {doing}"

    def _receive(self, timeout_s: float, doing: str, why: str = "") -> Any:
        stream = self._inbox()
        ready, _, _ = select.select([stream], [], [], timeout_s)
        if not ready:
            tail = self.stderr_tail()
            self.kill()
            raise WorkerHang(
                f"{self._describe(doing)}: no answer within {timeout_s:g} s{why}; killed.\n"
                f"Last worker output:\n{tail}"
            )
        try:
            return receive(stream)
        except (EOFError, OSError):
            raise self._crash(doing, "the process died") from None

    def _crash(self, doing: str, what: str) -> WorkerCrash:
        code = self._exit_code()
        return WorkerCrash(
            f"{self._describe(doing)}: {what} ({_signal_name(code)}).\n"
            f"Last worker output:\n{self.stderr_tail()}"
        )

    def request(self, message: tuple, timeout_s: float, doing: str, why: str = "") -> Any:
        """Send one request and wait ``timeout_s`` for its answer (``why``: said in a hang's
        message after the timeout, e.g. that the timeout was a suspicion's)."""
        self.requests += 1
        try:
            send(self._outbox(), message)
        except (BrokenPipeError, OSError):
            raise self._crash(doing, "the process was already dead") from None
        status, payload = self._receive(timeout_s, doing, why)
        if status == "internal":
            raise InternalError(f"{self._describe(doing)}: bi_props failed:\n{payload}")
        return payload


_LOGS: dict[Path, int] = {}
"""Worker logs not removed yet -> the pid of the process that made them."""


def _log_file(target: str, switch: str):
    log = tempfile.NamedTemporaryFile(
        prefix=f"bi_props-{target.replace(':', '_').replace('/', '_')}-{switch}-",
        suffix=".log",
        delete=False,
    )
    _LOGS[Path(log.name)] = os.getpid()
    return log


def _remove_log(path: Path) -> None:
    path.unlink(missing_ok=True)
    _LOGS.pop(path, None)


@atexit.register
def _remove_logs_left() -> None:
    """At exit, the logs of workers never closed (a Runner left to the garbage collector, a test
    that stopped early): each run left its workers' empty logs in the temp directory. Only the
    process that made a log removes it (a fork of this process must not)."""
    for path, pid in list(_LOGS.items()):
        if pid == os.getpid():
            _remove_log(path)


@dataclass
class Worker(_Channel):
    """One spawned interpreter serving one (target, switch state), or, once asked to ``fork``,
    the fork server (zygote) whose children serve it (runner/worker.py)."""

    target: str
    switch: str
    start_timeout_s: float = 300.0
    extra_env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen | None = None
    hello: Hello | None = None
    log_path: Path | None = None
    requests: int = 0
    handout: socket.socket | None = None  # our end of the channel children are handed over on

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.extra_env)
        env[SWITCH_ENV] = "1" if self.switch == "enabled" else "0"
        if env.get(PROVIDER_ENV, "env") != "env":  # e.g. verl: its own code sets the variable
            del env[SWITCH_ENV]
        env["BI_PROPS_TARGET"] = self.target
        env["BI_PROPS_SWITCH"] = self.switch
        from ..targets.module import OP_MODULES_ENV, declared_modules

        modules = declared_modules()  # the controller's registered EXTRA_OPS: the worker's too
        if modules:
            env[OP_MODULES_ENV] = ",".join(modules)
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
        log = _log_file(self.target, self.switch)
        self.log_path = Path(log.name)
        env = self.environment()
        theirs = None
        if hasattr(socket, "send_fds"):
            self.handout, theirs = socket.socketpair()
            env[FORK_FD_ENV] = str(theirs.fileno())
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "bi_props.runner.worker"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                bufsize=0,  # unbuffered: select() must see every byte that has arrived
                env=env,
                start_new_session=True,
                pass_fds=() if theirs is None else (theirs.fileno(),),
            )
        finally:
            log.close()
            if theirs is not None:
                theirs.close()

    def wait_hello(self) -> Hello:
        try:
            hello = self._receive(self.start_timeout_s, "starting")
        except WorkerFailure as exc:
            raise WorkerStartFailure(str(exc)) from None
        if not isinstance(hello, Hello):
            raise WorkerStartFailure(f"worker sent {hello!r} instead of a hello")
        self.hello = hello
        return hello

    def _inbox(self) -> BinaryIO:
        assert self.process is not None and self.process.stdout is not None
        return self.process.stdout

    def _outbox(self) -> BinaryIO:
        assert self.process is not None and self.process.stdin is not None
        return self.process.stdin

    def _exit_code(self) -> int | None:
        assert self.process is not None
        return self.process.wait(timeout=30)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def fork(self) -> ForkedWorker:
        """A new serving child of this fork server, with the target loaded and switched."""
        assert self.hello is not None and self.handout is not None
        log = _log_file(self.target, self.switch)
        log.close()
        try:
            pid = self.request(("fork", log.name), self.start_timeout_s, "forking a worker")
            _, fds, _, _ = socket.recv_fds(self.handout, 16, 1)
        except BaseException:
            _remove_log(Path(log.name))
            raise
        channel = socket.socket(fileno=fds[0])
        hello = replace(self.hello, pid=pid)
        return ForkedWorker(self.target, self.switch, self, pid, channel, hello, Path(log.name))

    def reap(self, pid: int) -> int | None:
        """Wait for a child of this fork server (after it ended or was killed)."""
        if not self.alive():
            return None
        try:
            return self.request(("wait", pid), 60, f"reaping worker {pid}")
        except (WorkerFailure, InternalError):
            return None

    def kill(self) -> None:
        if self.handout is not None:
            self.handout.close()
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
            _remove_log(self.log_path)

    def close(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            try:
                send(self._outbox(), ("exit",))
                self.process.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired, ValueError):
                pass
        self.kill()


class ForkedWorker(_Channel):
    """A serving child of a fork server: its own session (killed as a group), log and socket.
    Its parent is the zygote, so the zygote reaps it and reports how it ended."""

    def __init__(
        self,
        target: str,
        switch: str,
        zygote: Worker,
        pid: int,
        channel: socket.socket,
        hello: Hello,
        log_path: Path,
    ) -> None:
        self.target = target
        self.switch = switch
        self.zygote = zygote
        self.pid = pid
        self.channel = channel
        self.stream = channel.makefile("rwb", buffering=0)
        self.hello = hello
        self.log_path = log_path
        self.requests = 0
        self.ended = False
        self.returncode: int | None = None

    def _inbox(self) -> BinaryIO:
        return self.stream

    def _outbox(self) -> BinaryIO:
        return self.stream

    def _exit_code(self) -> int | None:
        if not self.ended:
            self.ended = True
            self.returncode = self.zygote.reap(self.pid)
        return self.returncode

    def alive(self) -> bool:
        """Idle children never write: a readable channel between requests means it ended."""
        if self.ended or self.channel.fileno() < 0:
            return False
        readable, _, _ = select.select([self.channel], [], [], 0)
        return not readable

    def kill(self) -> None:
        if not self.ended:
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            self._exit_code()
        self.stream.close()
        self.channel.close()
        _remove_log(self.log_path)

    def close(self) -> None:
        if not self.ended and self.channel.fileno() >= 0:
            try:
                send(self.stream, ("exit",))
                select.select([self.channel], [], [], 10)  # its end closes the channel
            except OSError:
                pass
        self.kill()


class Runner:
    """Workers for one target, one serving process per switch state, replaced when it crashes
    or hangs. Where the target allows it (hello.forkable), a switch state's first process
    becomes a fork server and every serving process is its child: a replacement then costs
    milliseconds, not a Python start and a target import."""

    def __init__(
        self,
        target: str,
        *,
        example_timeout_s: float = 60.0,
        start_timeout_s: float = 300.0,
        extra_env: dict[str, str] | None = None,
        fork: bool = True,
        suspect_hangs: bool = False,
        modes: tuple[str, ...] = ("eager",),
    ) -> None:
        self.target = target
        # The modes the space asks for (Case.mode); the target's hello narrows them
        # (``drawn_modes``), and every case is run in one of those (``settle``).
        self.modes = tuple(modes)
        # What the workers compiled (compiled cases): seconds, graphs, per op; not kernel time.
        self.compile_stats = CompileStats()
        self.example_timeout_s = example_timeout_s
        self.start_timeout_s = start_timeout_s
        self.extra_env = dict(extra_env or {})
        self.fork = fork
        self._zygotes: dict[str, Worker] = {}  # spawned, loaded, not yet serving
        self._workers: dict[str, _Channel] = {}  # serving
        self._hellos: dict[str, Hello] = {}
        # A brand-new interpreter per switch state, importing the target in the background once a
        # fresh-process confirmation was asked for: the next one then finds it loaded (it has run
        # nothing, so it is as fresh as one spawned on demand). ``spare_fresh=False``: none.
        self._spares: dict[str, list[Worker]] = {}
        self.spare_fresh = True
        self.spares_used = 0  # fresh-process confirmations that found their interpreter loaded
        self.starts = 0  # interpreters spawned (target imports)
        self.forks = 0  # serving children forked
        self.examples = 0
        self.seconds_in_workers = 0.0
        # time.monotonic() at which the campaign ends: no example waits past it (None: no end).
        self.deadline: float | None = None
        # Hang suspicion (the module's docstring): off, every example waits example_timeout_s.
        # Off by default: a pytest run cannot take a failed test back once a suspicion proves
        # to be slowness; `bi-props fuzz` (run_slice) turns it on.
        self.suspect_hangs = suspect_hangs
        self._costs: dict[tuple[str, str, str], _Cost] = {}  # (op, prop, switch) -> completed
        self._trusted: set[tuple[str, str, str]] = set()  # keys back on the full timeout
        self._suspected: dict[tuple[str, str, str], str] = {}  # (prop, switch, repr) -> why
        self.suspicions = 0  # examples stopped on a suspicion (a shortened timeout)

    def timeout(
        self, grace_s: float = 0.0, patience: float = 1.0, wanted_s: float | None = None
    ) -> tuple[float, bool]:
        """(the example timeout, whether the deadline shortened it): the profile's
        ``example_timeout_s`` times ``patience`` (or ``wanted_s``: a suspicion's), or the time
        left until ``deadline`` (plus ``grace_s``) when less."""
        wanted = self.example_timeout_s * patience if wanted_s is None else wanted_s
        if self.deadline is None:
            return wanted, False
        left = max(self.deadline - time.monotonic(), 0.0) + grace_s
        if left < wanted:
            return max(left, 0.01), True
        return wanted, False

    def _spawned(self, switch: str) -> Worker:
        worker = Worker(self.target, switch, self.start_timeout_s, self.extra_env)
        self.starts += 1
        return worker

    def start_all(self, switches: tuple[str, ...] = ("disabled", "enabled")) -> None:
        """Start the processes of several switch states concurrently (a session's cold start is
        then one target import, not one per state)."""
        pending = []
        for switch in switches:
            if self._loaded(switch) is not None:
                continue
            worker = self._spawned(switch)
            worker.spawn()
            pending.append((switch, worker))
        for switch, worker in pending:
            try:
                self._hellos[switch] = worker.wait_hello()
            except BaseException:
                worker.kill()
                raise
            self._zygotes[switch] = worker

    def _loaded(self, switch: str) -> _Channel | None:
        for pool in (self._workers, self._zygotes):
            worker = pool.get(switch)
            if worker is not None and worker.alive():
                return worker
        return None

    def _zygote(self, switch: str) -> Worker:
        zygote = self._zygotes.get(switch)
        if zygote is None or not zygote.alive():
            if zygote is not None:
                zygote.kill()
            zygote = self._spawned(switch)
            try:
                self._hellos[switch] = zygote.start()
            except BaseException:
                zygote.kill()
                raise
            self._zygotes[switch] = zygote
        return zygote

    def worker(self, switch: str) -> _Channel:
        worker = self._workers.get(switch)
        if worker is not None and worker.alive():
            return worker
        if worker is not None:
            worker.kill()
        zygote = self._zygote(switch)
        hello = zygote.hello
        if self.fork and hello is not None and hello.status == "ready" and hello.forkable:
            worker = zygote.fork()
            self.forks += 1
        else:  # it serves itself; its replacement will be spawned
            worker = self._zygotes.pop(switch)
        self._workers[switch] = worker
        if worker.hello is not None:
            self._hellos[switch] = worker.hello
        return worker

    def hello(self, switch: str) -> Hello:
        """The target's self-description in this switch state (starts a process if needed)."""
        if switch not in self._hellos:
            self.worker(switch)
        return self._hellos[switch]

    def _ready_hello(self, load: bool) -> Hello | None:
        hello = next((h for h in self._hellos.values() if h.status == "ready"), None)
        if hello is None and load:
            try:
                hello = self.hello("enabled")  # the one a session reads first (its entries)
            except Exception:  # a target that does not start: its failure shows where it runs
                return None
        return hello if hello is not None and hello.status == "ready" else None

    def drawn_modes(self, load: bool = True) -> tuple[tuple[str, ...], dict[str, str]]:
        """(the modes cases are drawn in, {mode: why not applicable}): the space's modes
        narrowed by the target's (``model.modes.effective_modes``), from a loaded worker's hello
        (with ``load``, one is started if none is); the space's own where none is loaded."""
        hello = self._ready_hello(load)
        if hello is None:
            return self.modes, {}
        return effective_modes(self.modes, hello.modes, hello.unsupported_modes)

    def settle(self, case: Case, load: bool = False) -> Case:
        """The case in a mode the target supports (``model.modes.settle_mode``): an explicit
        example built eagerly runs compiled against a target that compiles everything; a mode
        the target supports stays (a regression's compiled case, in an eager-only space).
        Before any worker said hello (without ``load``) the case stays as it is: ``observe``
        settles it again once its worker is loaded."""
        if not isinstance(case, Case):
            return case
        hello = self._ready_hello(load)
        if hello is None:
            return case
        drawn, _ = effective_modes(self.modes, hello.modes, hello.unsupported_modes)
        return settle_mode(case, drawn, hello.modes)

    def observe(self, prop: str, case: Case, switch: str) -> Observation:
        worker = self.worker(switch)
        if worker.hello is not None and worker.hello.status != "ready":
            raise WorkerStartFailure(
                f"target {self.target!r} is {worker.hello.status}: {worker.hello.message}"
            )
        case = self.settle(case)
        # A worker's first call pays its warm-up, so it teaches nothing about the op's cost. A
        # spawned worker's (a target import's lazy parts, a CUDA context, kernel loads, a JIT:
        # seconds to minutes) waits the full timeout. A forked child shares its fork server's
        # loaded target (CPU only): its first call pays the rest of bi_props' imports, 0.4 s
        # on the 2-core test machine, well inside SUSPECT_FLOOR_S even several times slower
        # under load, so it is suspected like any other (each hanging shrink candidate is
        # the first call of a fresh fork).
        first = worker.requests == 0
        warming = first and isinstance(worker, Worker)
        wanted, why = self.example_timeout(prop, case, switch, warming)
        start = time.perf_counter()
        timeout_s, cut = self.timeout(wanted_s=wanted)
        try:
            observation = worker.request(
                ("observe", prop, case),
                timeout_s,
                f"running {prop} on {case!r}",
                "" if cut else why,
            )
        except WorkerFailure as failure:
            self._workers.pop(switch, None)
            worker.kill()
            if cut and isinstance(failure, WorkerHang):
                raise DeadlineReached(f"{prop} on {case!r} cut at the campaign's end") from None
            if isinstance(failure, WorkerHang):
                self._hung(prop, case, switch, why)
            raise
        else:
            if not first:
                self.observed(case.op, prop, switch, case, time.perf_counter() - start)
            self.compile_stats.add(case.op, getattr(observation, "evidence", None))
        finally:
            self.examples += 1
            self.seconds_in_workers += time.perf_counter() - start
        return observation

    # -- hang suspicion ------------------------------------------------------------------------

    def observed(self, op: str, prop: str, switch: str, case: Case, seconds: float) -> None:
        """A completed call of (op, prop, switch) that took ``seconds`` (the round trip)."""
        cost = self._costs.setdefault((op, prop, switch), _Cost())
        cost.slowest_s = max(cost.slowest_s, seconds)
        cost.largest = max(cost.largest, case_work(case))
        cost.calls += 1

    def example_timeout(
        self, prop: str, case: Case, switch: str, warming: bool = False
    ) -> tuple[float, str]:
        """(this example's timeout before the campaign's end bounds it, why it is shorter than
        ``example_timeout_s``: "" when it is not). With ``suspect_hangs``: ``suspect_timeout``
        of the slowest completed call of (op, prop, switch), scaled by how much more work this
        case asks than the largest of them; the full timeout before any completed call (or
        ``warming``: a spawned worker's first call), and for keys ``trust``ed."""
        full = self.example_timeout_s
        if getattr(case, "mode", "eager") == "compiled":  # compile time is no kernel's time
            return full * COMPILE_PATIENCE, ""
        key = (case.op, prop, switch)
        cost = self._costs.get(key)
        if not self.suspect_hangs or warming or cost is None or key in self._trusted:
            return full, ""
        scale = case_work(case) / cost.largest
        wanted = suspect_timeout(full, cost.slowest_s, scale)
        if wanted >= full:
            return full, ""
        sized = f", scaled x{scale:.3g} for this larger case" if scale > 1 else ""
        return wanted, (
            f" (a hang suspected: {SUSPECT_FACTOR:g}x the slowest completed call of {prop} on "
            f"{case.op} [{switch}] in this run, {cost.slowest_s:.3g} s{sized}, at least "
            f"{SUSPECT_FLOOR_S:g} s; the profile's example timeout is {full:g} s)"
        )

    def _hung(self, prop: str, case: Case, switch: str, why: str) -> None:
        key = (prop, switch, repr(case))
        if why:
            self.suspicions += 1
            self._suspected[key] = why.strip(" ()")
        else:  # it waited the full timeout: a hang, no suspicion
            self._suspected.pop(key, None)

    def suspicion(self, prop: str, case: Case, switch: str) -> str | None:
        """Why this case's last hang in this runner was only a suspicion (its timeout shortened
        by ``example_timeout``), or None (it never hung, or it hung the full timeout). Kept
        after a later pass: a suspected hang whose replay passed is slowness, not flakiness.
        ``switch`` "both" (parity): either state's."""
        for state in ("enabled", "disabled") if switch == "both" else (switch,):
            why = self._suspected.get((prop, state, repr(case)))
            if why is not None:
                return why
        return None

    def trust(self, op: str, prop: str, switch: str) -> None:
        """Back to the full example timeout for (op, prop, switch): a suspicion there was not
        confirmed, so its calls can be slower than its history says (one wasted confirmation
        per cell at most, never a loop of them). ``switch`` "both": both states."""
        for state in ("enabled", "disabled") if switch == "both" else (switch,):
            self._trusted.add((op, prop, state))

    def export(self, prop: str, case: Case, switch: str) -> dict:
        """The exact tensors (and reference) of a case, for a standalone reproducer."""
        worker = self.worker(switch)
        case = self.settle(case)
        patience = COMPILE_PATIENCE if case.mode == "compiled" else 1.0
        timeout_s, _ = self.timeout(CONFIRM_GRACE_S, patience)
        return worker.request(("export", prop, case), timeout_s, f"exporting {case!r}")

    def localize(self, case: Case, switch: str, out_dir: str | None) -> dict:
        """A model-level case replayed alone and in its batch under a per-op tape
        (execution/tape.py): the first diverging op, its inputs saved under ``out_dir``."""
        worker = self.worker(switch)
        timeout_s, _ = self.timeout(CONFIRM_GRACE_S, CONFIRM_PATIENCE)
        try:
            return worker.request(("localize", case, out_dir), timeout_s, f"localizing {case!r}")
        except WorkerFailure:
            self._workers.pop(switch, None)
            worker.kill()
            raise

    def fresh(self, prop: str, case: Case, switch: str, *, patience: float = 1.0) -> Observation:
        """Run one case in a brand-new interpreter (then close it): does it reproduce in
        isolation? Always spawned, never forked: nothing is shared with the long-lived ones. The
        interpreter is the spare spawned after the previous confirmation when there is one.
        ``patience`` scales the example timeout (``CONFIRM_PATIENCE`` for a finding that is not
        a hang); the campaign's end still bounds it."""
        spares = self._spares.get(switch) or []
        worker = spares.pop(0) if spares else None
        if worker is None or not worker.alive():
            if worker is not None:
                worker.kill()
            worker = Worker(self.target, switch, self.start_timeout_s, self.extra_env)
            worker.spawn()
        else:
            self.spares_used += 1
        try:
            hello = worker.wait_hello()
            if hello.status != "ready":
                raise WorkerStartFailure(
                    f"target {self.target!r} is {hello.status}: {hello.message}"
                )
            case = self.settle(case)
            if case.mode == "compiled":  # a fresh process compiles everything again
                patience *= COMPILE_PATIENCE
            timeout_s, cut = self.timeout(CONFIRM_GRACE_S, patience)
            try:
                observation = worker.request(
                    ("observe", prop, case), timeout_s, f"re-running {prop} on {case!r}"
                )
                self.compile_stats.add(case.op, getattr(observation, "evidence", None))
                return observation
            except WorkerHang:
                if cut:
                    raise ConfirmationCut(
                        f"cut after {timeout_s:.1f} s at the campaign's end"
                    ) from None
                raise
        finally:
            worker.close()
            self.prewarm(switch)  # spawned after this one's run: it never competed with it

    def prewarm(self, switch: str, count: int = 1) -> None:
        """Have ``count`` spare fresh interpreters of ``switch`` loading (``fresh`` takes them):
        asked for when a failure is first seen, so that its confirmation after the shrink finds
        its interpreter loaded."""
        if not self.spare_fresh:
            return
        spares = self._spares.setdefault(switch, [])
        for ended in [w for w in spares if not w.alive()]:
            ended.kill()  # reaped, its log removed
            spares.remove(ended)
        while len(spares) < count:
            spare = Worker(self.target, switch, self.start_timeout_s, self.extra_env)
            spare.spawn()
            spares.append(spare)

    def close(self) -> None:
        for spares in self._spares.values():
            for spare in spares:
                spare.kill()
        self._spares.clear()
        for worker in self._workers.values():
            worker.close()
        self._workers.clear()
        for zygote in self._zygotes.values():
            zygote.close()
        self._zygotes.clear()


__all__ = [
    "CONFIRM_PATIENCE",
    "SUSPECT_FACTOR",
    "SUSPECT_FLOOR_S",
    "ConfirmationCut",
    "DeadlineReached",
    "ForkedWorker",
    "InternalError",
    "Runner",
    "Worker",
    "WorkerCrash",
    "WorkerFailure",
    "WorkerHang",
    "WorkerStartFailure",
    "case_work",
    "read_exact",
    "suspect_timeout",
]
