"""The worker process: ``python -m bi_props.runner.worker``.

Started by the controller with the switch already in its environment (upstream switches are read at
import or init time and cannot be undone), it loads the target once, says hello, then serves many
examples. It imports nothing from Hypothesis or pytest. stdout is re-pointed to stderr so that a
library printing to stdout cannot corrupt the protocol.

The first message after the hello decides the process' role. An example makes it a plain server.
``("fork", log)`` makes it a fork server (a *zygote*): it never runs an example itself, and forks
one serving child per request, each with the target already imported and its switch already
turned. A crash or a hang then costs a fork (milliseconds) instead of an interpreter start and a
target import (seconds): that is what makes shrinking a crashing case affordable. The zygote only
offers this where forking is sound (see ``_fork_capability``): a CPU target whose loading started
no thread, and a forked child that passes a parallel op.
"""

from __future__ import annotations

import os
import socket
import sys
import time
import traceback
from dataclasses import replace

FORK_FD_ENV = "BI_PROPS_FORK_FD"  # the Unix socket on which a zygote hands out child channels
FORK_ENV = "BI_PROPS_FORK"  # "0": never offer forking


def _serve() -> None:
    from bi_props.runner.protocol import receive, send

    inbox = sys.stdin.buffer
    outbox = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    target_spec = os.environ["BI_PROPS_TARGET"]
    switch = os.environ["BI_PROPS_SWITCH"]
    threads_before = _threads_after_torch()
    hello, target = _load(target_spec, switch)
    if target is not None:
        forkable, note = _fork_capability(target, threads_before)
        hello = replace(hello, forkable=forkable, fork_note=note)
    send(outbox, hello)
    if target is None:
        return
    try:
        first = receive(inbox)
    except EOFError:
        return
    if first[0] == "fork" and hello.forkable:
        _zygote(inbox, outbox, target, switch, first)
    else:
        _requests(inbox, outbox, target, switch, first)


def _requests(inbox, outbox, target, switch: str, first=None) -> None:
    """Serve examples until "exit" or the end of the channel."""
    from bi_props.execution.execute import export, observe
    from bi_props.runner.protocol import receive, send

    message = first
    while True:
        if message is None:
            try:
                message = receive(inbox)
            except EOFError:
                return
        kind = message[0]
        if kind == "exit":
            return
        try:
            if kind == "observe":  # one example
                _, prop, case = message
                send(outbox, ("ok", observe(prop, case, target, switch)))
            elif kind == "export":  # the exact tensors of a case, for a standalone reproducer
                _, prop, case = message
                send(outbox, ("ok", export(prop, case, target)))
            elif kind == "localize":  # a model-level finding's first diverging op (tape.py)
                from bi_props.execution.tape import localize

                _, case, out_dir = message
                send(outbox, ("ok", localize(case, target, out_dir)))
            else:
                send(outbox, ("internal", f"unknown message {kind!r}"))
        except Exception:
            send(outbox, ("internal", traceback.format_exc()))
        message = None


def _zygote(inbox, outbox, target, switch: str, first) -> None:
    """Fork a serving child per "fork"; reap children on "wait"; stop on "exit"."""
    from bi_props.runner.protocol import receive, send

    handout = socket.socket(fileno=int(os.environ[FORK_FD_ENV]))
    message = first
    while True:
        kind = message[0]
        if kind == "exit":
            return
        try:
            if kind == "fork":
                ours, theirs = socket.socketpair()
                pid = os.fork()
                if pid == 0:  # the child: never returns into this loop
                    ours.close()
                    handout.close()
                    _child(theirs, outbox, message[1], target, switch)
                theirs.close()
                socket.send_fds(handout, [b"c"], [ours.fileno()])
                ours.close()
                send(outbox, ("ok", pid))
            elif kind == "wait":  # reap a child (the controller killed it or saw it end)
                send(outbox, ("ok", _wait(message[1])))
            else:
                send(outbox, ("internal", f"unknown message to a fork server {kind!r}"))
        except Exception:
            send(outbox, ("internal", traceback.format_exc()))
        try:
            message = receive(inbox)
        except EOFError:
            return


def _child(channel: socket.socket, zygote_outbox, log_path: str, target, switch: str) -> None:
    """A forked serving process: own session (killable as a group), own log, own channel."""
    code = 1
    try:
        os.setsid()
        zygote_outbox.close()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        stream = channel.makefile("rwb", buffering=0)
        _requests(stream, stream, target, switch)
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stderr.flush()
        os._exit(code)


def _wait(pid: int) -> int | None:
    """The child's end as a Popen-style return code (negative: the signal); None if unknown."""
    try:
        _, status = os.waitpid(pid, 0)
    except ChildProcessError:
        return None
    if os.WIFSIGNALED(status):
        return -os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def _thread_count() -> int | None:
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return None


def _threads_after_torch() -> int | None:
    """Threads once torch is imported (its BLAS may start one): the baseline of a clean load."""
    try:
        import torch  # noqa: F401
    except Exception:
        pass
    return _thread_count()


def _fork_capability(target, threads_before: int | None) -> tuple[bool, str]:
    """May serving workers be forked from this process? Only where a child is sound: a fork
    copies one thread, so a process whose loading started thread pools (OpenMP after a parallel
    op, CUDA, a tokenizer) would give children that hang in their first parallel region, and a
    hang would be reported as a finding. Hence: CPU device, no new thread, and a forked child
    that completes parallel ops."""
    if os.environ.get(FORK_ENV, "1") == "0":
        return False, f"{FORK_ENV}=0"
    if FORK_FD_ENV not in os.environ or not hasattr(os, "fork") or not hasattr(socket, "send_fds"):
        return False, "no fork-server channel on this platform"
    if getattr(target, "device", "cpu") != "cpu":
        return False, f"device {target.device!r}: a forked child cannot reuse its runtime"
    threads_after = _thread_count()
    if threads_before is None or threads_after is None:
        return False, "thread count not observable (/proc/self/task)"
    if threads_after > threads_before:
        return False, f"loading the target started {threads_after - threads_before} thread(s)"
    return _fork_self_test()


def _fork_self_test(timeout_s: float = 30.0) -> tuple[bool, str]:
    """Fork a child that runs parallel elementwise ops; it must exit cleanly in time."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            import torch

            # Elementwise only: the target's own kernels (mm, sum...) must not run here.
            x = torch.ones(1 << 20)
            code = 0 if bool(torch.all((x * 2.0).exp2() == 4.0)) else 2
        finally:
            os._exit(code)
    deadline = time.monotonic() + timeout_s
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
                return True, ""
            return False, f"a forked child failed the self-test (wait status {status})"
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            return False, f"a forked child did not finish a parallel op in {timeout_s:g} s"
        time.sleep(0.005)


def _precisions(target) -> dict[str, str]:
    """The target's declared internal precision for every op with a float64 reference."""
    from bi_props.catalogue import OPS

    return {op: target.precision(op) for op, info in OPS.items() if "reference" in info.properties}


def _load(target_spec: str, switch: str):
    """Import the target and turn its switch; missing stacks become a hello, not a crash."""
    from bi_props.integrations.switches import DEFAULT, PROVIDER_ENV, provide, rows
    from bi_props.model.observation import Hello
    from bi_props.targets import TargetBroken, TargetMissing, resolve, triton_compat

    try:
        # The switch provider first: "verl" sets VLLM_BATCH_INVARIANT with verl's own code.
        provided = provide(os.environ.get(PROVIDER_ENV) or DEFAULT, target_spec, switch)
        try:  # under TRITON_INTERPRET=1: the interpreter's corrections, before any kernel loads
            triton_compat.install_from_env()
        except ValueError as exc:
            raise TargetBroken(str(exc)) from None
        from bi_props.targets.module import declare_from_environment

        declare_from_environment(target_spec)  # other targets' EXTRA_OPS, before any op lookup
        target = resolve(target_spec)
        target.check()  # a module target registers its own EXTRA_OPS here
        target.activate()
        hello = Hello(
            target=target_spec,
            switch=switch,
            status="ready",
            device=target.device,
            kernel_prefix=target.kernel_prefix,
            covered=tuple(target.covered()),
            entries=dict(target.entries()),
            routes=dict(target.routes()),
            unobservable=dict(target.unobservable()),
            environment={
                **target.environment(),
                **rows(provided),
                **triton_compat.environment(),
            },
            repro={"enabled": target.repro_setup(True), "disabled": target.repro_setup(False)},
            pid=os.getpid(),
            provider=provided,
            promises_inference=bool(
                target.promises_inference() or provided.get("provider") == "verl"
            ),
            routing_note=target.routing_note(),
            precision=_precisions(target),
            modes=tuple(target.modes()),
            unsupported_modes=dict(target.unsupported_modes()),
        )
        return hello, target
    except TargetMissing as exc:
        return Hello(target_spec, switch, "missing", str(exc), pid=os.getpid()), None
    except TargetBroken as exc:
        return Hello(target_spec, switch, "broken", str(exc), pid=os.getpid()), None
    except Exception:
        message = f"loading target {target_spec!r} failed:\n{traceback.format_exc()}"
        return Hello(target_spec, switch, "broken", message, pid=os.getpid()), None


if __name__ == "__main__":
    _serve()
