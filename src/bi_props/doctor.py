"""`bi-props doctor`: what a target needs, what is installed, and a dry run of its switch.

The dry run starts two real workers (switch enabled and disabled), exactly as a test session would,
and prints what each reports: status, device, covered ops, kernel prefix, versions.
"""

from __future__ import annotations

import platform
import sys
from typing import TextIO

from .observation import Hello
from .runner.controller import Runner, WorkerFailure


def _rows(hello: Hello) -> list[tuple[str, str]]:
    rows = [("status", hello.status)]
    if hello.message:
        rows.append(("message", hello.message.strip().replace("\n", "\n    ")))
    if hello.status == "ready":
        rows += [
            ("device", hello.device),
            ("kernel prefix", hello.kernel_prefix or "(none)"),
            ("covered ops", ", ".join(hello.covered) or "(none)"),
        ]
        rows += sorted(hello.environment.items())
    return rows


def doctor(target: str, out: TextIO = sys.stdout) -> int:
    print(f"bi-props doctor: target {target!r}", file=out)
    print(f"  python: {platform.python_version()} ({sys.executable})", file=out)
    runner = Runner(target, start_timeout_s=600)
    ok = True
    if target == "ascend":  # the symbol contract, read from the installed source (never imported)
        from .contract import check_installed

        problems = check_installed()
        if problems is None:
            print("  contract: vllm_ascend is not installed (nothing to check)", file=out)
        else:
            print(f"  contract: {len(problems)} problem(s) in the installed vllm_ascend", file=out)
            for problem in problems:
                print(f"    {problem}", file=out)
            ok = ok and not problems
    try:
        for switch in ("disabled", "enabled"):
            print(
                f"\n[{switch}] worker with VLLM_BATCH_INVARIANT="
                f"{'1' if switch == 'enabled' else '0'}",
                file=out,
            )
            try:
                hello = runner.hello(switch)
            except WorkerFailure as exc:
                print(f"  the worker did not start: {exc}", file=out)
                ok = False
                continue
            for key, value in _rows(hello):
                print(f"  {key:>14}: {value}", file=out)
            ok &= hello.status == "ready"
    finally:
        runner.close()
    print(f"\nverdict: {'ready' if ok else 'CANNOT RUN here (see above)'}", file=out)
    return 0 if ok else 1
