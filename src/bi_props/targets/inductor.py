"""The built-in ``inductor`` target: PyTorch's own batch-invariant switch, Inductor's config
``torch._inductor.config.batch_invariant`` (env ``TORCHINDUCTOR_BATCH_INVARIANT=1``: "stable
per-sample compiled kernel across batch sizes; implies deterministic").

Disabled: the flag forced off (whatever the shell's environment says); enabled: the environment
variable and the flag set, before anything compiles. The switch is read by Inductor while it
compiles, so it exists only under ``torch.compile``: every case of this target is compiled
(``Case.mode``, ``modes()``), each state in its own worker process like every target. The ops are
the catalogue's, compiled with Inductor (``execution/compiled.py``: dynamic shapes, the call one
graph); the switch claims them all (a compiler switch promises invariance of whatever it
compiles).

Routing: the switch propagating is observed (``switch_state``: the flag read back in the
worker, and the environment variable); which kernel Inductor generated under it is not (torch
2.13 reads the flag only in its Triton heuristics, ``triton_heuristics.py``'s persistent
reductions and ``codegen/triton.py``'s kernel metadata; Inductor's C++ backend never reads it,
and no kernel of its own exists for a profiler event or a dispatcher entry to name): every claimed
op's routing is declared unobservable with that reason (``unobservable``), as the compiled code
carries the invariance itself. Batch invariance, row permutation, determinism (across compiles
too) and the reference judge what it does.

The device: CUDA where torch sees a GPU (Triton kernels), else the CPU (Inductor's C++ backend,
which needs a C++ compiler); ``BI_PROPS_INDUCTOR_DEVICE`` chooses.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from typing import Any

from ..model.target import Target, TargetMissing, stock_precision, switch_requested

FLAG_ENV = "TORCHINDUCTOR_BATCH_INVARIANT"
DEVICE_ENV = "BI_PROPS_INDUCTOR_DEVICE"
FLAG = "torch._inductor.config.batch_invariant"
ENGINE_OPS = ("engine",)
"""Catalogue ops that are no torch call to compile (vLLM's engine)."""

EAGER_WHY = (
    f"PyTorch's switch is Inductor's config ({FLAG}): an eager call never reads it, so every "
    f"case of this target is compiled"
)
UNOBSERVABLE_WHY = {
    "cpu": (
        f"compile carries the switch's invariance itself: no kernel of its own for an event or "
        f"the dispatcher to name, and Inductor's C++ backend never reads {FLAG} (torch 2.13: "
        f"Triton heuristics only); the flag is read back in the worker"
    ),
    "cuda": (
        f"compile carries the switch's invariance itself: no kernel of its own for an event or "
        f"the dispatcher to name ({FLAG} shapes Inductor's Triton kernels while they are "
        f"generated); the flag is read back in the worker"
    ),
}


def cpp_compiler() -> tuple[str | None, str]:
    """(the C++ compiler Inductor's CPU backend would use, its first version line): ``CXX``, else
    g++ (Inductor's ``cpp.cxx`` default, without conda's download); (None, why) if absent."""
    name = os.environ.get("CXX") or "g++"
    path = shutil.which(name)
    if path is None:
        return None, f"no C++ compiler: {name!r} is not on PATH (set CXX, or install g++)"
    try:
        version = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=30, check=True
        ).stdout.splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError) as exc:
        return None, f"{path} does not run: {exc}"
    return path, version


def triton_version() -> str | None:
    """Triton's installed version (Inductor's GPU backend), or None; found, not imported."""
    if importlib.util.find_spec("triton") is None:
        return None
    try:
        from importlib.metadata import version

        return version("triton")
    except Exception:
        return "installed (version unknown)"


def backends() -> dict[str, str]:
    """What Inductor can compile with here, in words (``bi-props doctor --target inductor``)."""
    path, version = cpp_compiler()
    triton = triton_version()
    return {
        "C++ compiler (CPU)": f"yes: {path} ({version})" if path else f"NO: {version}",
        "Triton (GPU)": f"yes: triton {triton}" if triton else "no: triton is not installed",
    }


class InductorTarget(Target):
    name = "inductor"
    one_way = (
        "Inductor reads the flag while compiling: code compiled in one state keeps it, so each "
        "state compiles in its own process"
    )

    def __init__(self) -> None:
        self._active = False
        self.device = os.environ.get(DEVICE_ENV, "")

    def check(self) -> None:
        try:
            import torch
            import torch._inductor.config as config
        except Exception as exc:  # pragma: no cover: torch is a dependency
            raise TargetMissing(f"torch's Inductor cannot be imported: {exc!r}") from None
        if not hasattr(config, "batch_invariant"):
            raise TargetMissing(
                f"torch {torch.__version__} has no {FLAG} (PyTorch's batch-invariant switch; "
                f"in torch 2.13); install a torch that has it"
            )
        if not self.device:
            self.device = "cuda" if torch.cuda.is_available() else "cpu"
        if self.device == "cpu":
            path, why = cpp_compiler()
            if path is None:
                raise TargetMissing(f"Inductor's C++ backend (CPU) needs a C++ compiler: {why}")
        elif triton_version() is None:
            raise TargetMissing(
                f"Inductor on {self.device} needs Triton: not installed (pip install triton)"
            )

    def activate(self) -> None:
        import torch._inductor.config as config

        enabled = switch_requested()
        if enabled:
            os.environ[FLAG_ENV] = "1"
        else:  # off means off, whatever the shell exported
            os.environ.pop(FLAG_ENV, None)
        config.batch_invariant = enabled
        self._active = bool(config.batch_invariant)

    def modes(self) -> tuple[str, ...]:
        return ("compiled",)

    def unsupported_modes(self) -> dict[str, str]:
        return {"eager": EAGER_WHY}

    def covered(self) -> tuple[str, ...]:
        from ..model.op_registry import OPS

        return tuple(op for op in OPS if op not in ENGINE_OPS)

    def unobservable(self) -> dict[str, str]:
        why = UNOBSERVABLE_WHY.get(self.device.split(":")[0], UNOBSERVABLE_WHY["cuda"])
        return {op: why for op in self.covered()}

    def observe_routing(self) -> str:
        return "profiler"  # the compiled region's events: a call that ran no compiled code shows

    def switch_state(self) -> dict[str, Any]:
        import torch._inductor.config as config

        flag = bool(config.batch_invariant)
        return {"active": flag, FLAG: flag, FLAG_ENV: os.environ.get(FLAG_ENV, "(unset)")}

    def precision(self, op: str) -> str:
        """What stock PyTorch computes in on this device (``stock_precision``), in both states:
        the switch changes no precision (Inductor's generated code computes 16-bit inputs in
        float32 and rounds once where eager does; ``output`` where eager rounds in between)."""
        return stock_precision(self.device, op)

    def repro_setup(self, enabled: bool) -> str:
        value = "True" if enabled else "False"
        env = (
            f'os.environ["{FLAG_ENV}"] = "1"' if enabled else f'os.environ.pop("{FLAG_ENV}", None)'
        )
        config = "import torch._inductor.config"
        return f"{env}\n{config}\ntorch._inductor.config.batch_invariant = {value}"

    def environment(self) -> dict[str, str]:
        import torch

        env = super().environment()
        env["inductor_device"] = self.device
        env["inductor_batch_invariant"] = str(self._active)
        found = backends()
        env["inductor_cpp_compiler"] = found["C++ compiler (CPU)"]
        env["inductor_triton"] = found["Triton (GPU)"]
        if self.device.startswith("cuda") and torch.cuda.is_available():
            env["gpu"] = torch.cuda.get_device_name(0)
        return env

    def routing_note(self) -> str:
        return (
            f"target 'inductor': routing is declared unobservable ({FLAG} leaves no kernel of "
            f"its own to see); the flag itself is read back in each worker"
        )
