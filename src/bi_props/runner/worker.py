"""The worker process: ``python -m bi_props.runner.worker``.

Started by the controller with the switch already in its environment (upstream switches are read at
import or init time and cannot be undone), it loads the target once, says hello, then serves many
examples. It imports nothing from Hypothesis or pytest. stdout is re-pointed to stderr so that a
library printing to stdout cannot corrupt the protocol.
"""

from __future__ import annotations

import os
import sys
import traceback


def _serve() -> None:
    from bi_props.runner.protocol import receive, send

    inbox = sys.stdin.buffer
    outbox = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    target_spec = os.environ["BI_PROPS_TARGET"]
    switch = os.environ["BI_PROPS_SWITCH"]
    hello, target = _load(target_spec, switch)
    send(outbox, hello)
    if target is None:
        return
    from bi_props.execute import observe

    while True:
        try:
            message = receive(inbox)
        except EOFError:
            return
        kind = message[0]
        if kind == "exit":
            return
        if kind == "export":  # the exact tensors of a case, for a standalone reproducer
            _, prop, case = message
            try:
                from bi_props.execute import export

                send(outbox, ("ok", export(prop, case, target)))
            except Exception:
                send(outbox, ("internal", traceback.format_exc()))
            continue
        if kind == "observe":
            _, prop, case = message
            try:
                send(outbox, ("ok", observe(prop, case, target, switch)))
            except Exception:
                send(outbox, ("internal", traceback.format_exc()))
        else:
            send(outbox, ("internal", f"unknown message {kind!r}"))


def _load(target_spec: str, switch: str):
    """Import the target and turn its switch; missing stacks become a hello, not a crash."""
    from bi_props.observation import Hello
    from bi_props.targets import TargetBroken, TargetMissing, resolve

    try:
        target = resolve(target_spec)
        target.check()
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
            environment=dict(target.environment()),
            repro={"enabled": target.repro_setup(True), "disabled": target.repro_setup(False)},
            pid=os.getpid(),
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
