"""The built-in ``sglang`` target: SGLang's ``sglang.srt.batch_invariant_ops`` (derived from
thinking-machines' batch_invariant_ops), its real Triton kernels run on CPU by Triton's interpreter.

SGLang's switch is in-process and two-way: ``enable_batch_invariant_mode()`` registers Python
kernels on aten ops (mm, mm.out, addmm, _log_softmax, mean.dim, rms_norm, mm.dtype, bmm) for the
device's dispatch key through ``torch.library.Library("aten", "IMPL")`` and swaps ``torch.bmm``;
``disable_batch_invariant_mode()`` destroys the library; ``set_batch_invariant_mode(enabled)`` is a
context manager. Here one worker per switch state calls enable (or nothing); the ``switching``
property (bi_props.switching) exercises the switch as state.

Two host queries have no CPU answer, so each has a stated stand-in, installed in the module's
globals (where ``from sglang.srt.utils.common import ...`` bound them), nowhere else:

- ``get_dispatch_device_backend()`` raises "No supported accelerator (CUDA/XPU) available" on CPU:
  the stand-in answers ``"CPU"`` (the interpreter runs the kernels on CPU tensors);
- ``get_device_core_count()`` returns 0 on CPU, so the persistent matmul would launch
  ``min(0, tiles) = 0`` programs and return uninitialised memory: the stand-in answers
  ``os.cpu_count()`` (the persistent kernels' tiles do not depend on the program count).

Routing is read in the dispatcher (``torch._C._dispatch_dump``), as for ``vllm``: is the CPU
kernel of each aten op the one registered from SGLang's file? Needs ``TRITON_INTERPRET=1`` and
triton (scripts/ci_triton_lane.sh installs both, with the SGLang wheel and only what its import
needs).
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from .. import triton_compat
from .base import Target, TargetBroken, TargetMissing, switch_requested
from .vllm import ATTRIBUTE_PATHS, parse_dispatch_kernel, registrations_to_ops

MODULE = "sglang.srt.batch_invariant_ops.batch_invariant_ops"
KEY = "CPU"
# What enable_batch_invariant_mode() registers off NPU (sglang 0.5.23), as written in its source.
REGISTERS = (
    "aten::mm",
    "aten::mm.out",
    "aten::addmm",
    "aten::_log_softmax",
    "aten::mean.dim",
    "aten::rms_norm",
    "aten::mm.dtype",
    "aten::bmm",
)
# Catalogue op -> the aten registrations its claim rests on (enabled) / that would leak (disabled).
CLAIM_OPS: dict[str, tuple[str, ...]] = {
    "mm": ("aten::mm",),
    "matmul": ("aten::mm",),
    "linear": ("aten::addmm",),
    "addmm": ("aten::addmm",),
    "bmm": ("aten::bmm",),
    "log_softmax": ("aten::_log_softmax",),
    "mean": ("aten::mean.dim",),
    "rms_norm": ("aten::rms_norm",),
}
INSTALL_HINT = (
    "Install SGLang's wheel without its dependencies, then what its import needs, and triton: "
    "see scripts/ci_triton_lane.sh (pip install triton==3.9.0 sglang==0.5.23 --no-deps, ...); "
    "run with TRITON_INTERPRET=1 on a CPU-only machine."
)


def stand_in_core_count(device_id: int = 0) -> int:
    """Stand-in for sglang's get_device_core_count() on CPU (there it returns 0)."""
    return os.cpu_count() or 1


def stand_in_dispatch_backend() -> str:
    """Stand-in for sglang's get_dispatch_device_backend() on CPU (there it raises)."""
    return KEY


STAND_INS = {
    "get_dispatch_device_backend": stand_in_dispatch_backend,
    "get_device_core_count": stand_in_core_count,
}


def load_module() -> Any:
    """Import SGLang's batch-invariant module and install the stand-ins in its globals."""
    if not triton_compat.interpreting():
        try:
            import torch

            on_gpu = torch.cuda.is_available()
        except Exception:
            on_gpu = False
        if not on_gpu:
            raise TargetMissing(
                f"target 'sglang' needs a GPU or TRITON_INTERPRET=1 (Triton's interpreter on "
                f"CPU). {INSTALL_HINT}"
            )
    try:
        module = importlib.import_module(MODULE)
    except ModuleNotFoundError as exc:
        raise TargetMissing(
            f"target 'sglang': cannot import {MODULE} ({exc}). {INSTALL_HINT}"
        ) from None
    except Exception as exc:
        raise TargetBroken(f"target 'sglang': importing {MODULE} failed: {exc!r}") from None
    if triton_compat.interpreting():
        for name, stand_in in STAND_INS.items():
            if not hasattr(module, name):
                raise TargetBroken(f"target 'sglang': {MODULE} has no {name} to stand in for")
            setattr(module, name, stand_in)
    return module


class SglangTarget(Target):
    name = "sglang"
    device = "cpu"
    kernel_prefix = ""  # Python kernels on aten ops: no custom-op events; see evidence()

    def __init__(self) -> None:
        self.module: Any = None

    def check(self) -> None:
        self.module = load_module()
        if not triton_compat.interpreting():
            self.device = "cuda"

    def activate(self) -> None:
        if switch_requested():
            try:
                self.module.enable_batch_invariant_mode()
            except Exception as exc:
                raise TargetBroken(
                    f"target 'sglang': enable_batch_invariant_mode() raised {exc!r}"
                ) from None

    def repro_setup(self, enabled: bool) -> str:
        lines = [f"import {MODULE} as bio"]
        if triton_compat.interpreting():
            lines += [
                "import os  # stand-ins for the CPU (see bi_props.targets.sglang)",
                "bio.get_dispatch_device_backend = lambda: 'CPU'",
                "bio.get_device_core_count = lambda device_id=0: os.cpu_count() or 1",
            ]
        if enabled:
            lines.append("bio.enable_batch_invariant_mode()")
        return "\n".join(lines)

    # -- claims and evidence ---------------------------------------------------------------------

    def covered(self) -> tuple[str, ...]:
        ops = set(registrations_to_ops(REGISTERS)) | {"rms_norm", "matmul", "linear"}
        from ..catalogue import OPS

        return tuple(op for op in OPS if op in ops)

    def observe_routing(self) -> str:
        return "none"  # the dispatcher is read instead of the profiler

    def kernel_is_sglang(self, qualified_name: str) -> bool:
        """Whether the active CPU kernel of an aten op was registered from SGLang's module."""
        import torch

        location = parse_dispatch_kernel(torch._C._dispatch_dump(qualified_name), self._key())
        if not location:
            return False
        path = location.rpartition(":")[0] or location
        return os.path.realpath(path) == os.path.realpath(self.module.__file__)

    def _key(self) -> str:
        return KEY if self.device == "cpu" else "CUDA"

    def evidence(self, op: str) -> dict[str, bool]:
        result = {
            f"{name} [{self._key()}] is SGLang's kernel": self.kernel_is_sglang(name)
            for name in CLAIM_OPS.get(op, ())
        }
        if op in ("bmm",) or not self.active():
            for dotted in ATTRIBUTE_PATHS.get(op, ()):
                module_name, _, attr = dotted.rpartition(".")
                value = getattr(sys.modules.get(module_name), attr, None)
                owner = getattr(value, "__module__", "") or ""
                result[f"{dotted} is SGLang's function"] = owner.startswith("sglang.")
        return result

    def active(self) -> bool:
        return bool(self.module.is_batch_invariant_mode_enabled())

    def registered(self) -> list[str]:
        """The aten ops whose CPU kernel is SGLang's now (dispatcher evidence)."""
        return [name for name in REGISTERS if self.kernel_is_sglang(name)]

    def switch_state(self) -> dict[str, Any]:
        return {
            "active": self.active(),
            "sglang_registered": ", ".join(self.registered()) or "(none)",
        }

    def environment(self) -> dict[str, Any]:
        env = super().environment()
        try:
            from importlib.metadata import version

            env["sglang"] = version("sglang")
        except Exception:
            env["sglang"] = "?"
        env["sglang_module"] = MODULE
        env["sglang_dispatch_key"] = self._key()
        if triton_compat.interpreting():
            env["sglang_stand_ins"] = (
                "get_dispatch_device_backend() -> 'CPU'; get_device_core_count() -> "
                f"os.cpu_count() = {stand_in_core_count()}"
            )
        env["sglang_registered"] = ", ".join(self.registered()) or "(none)"
        return env
