"""The built-in ``sglang`` target: SGLang's ``sglang.srt.batch_invariant_ops`` (derived from
thinking-machines' batch_invariant_ops), its real Triton kernels run on CPU by Triton's interpreter.

SGLang's switch is in-process and two-way: ``enable_batch_invariant_mode()`` registers Python
kernels on aten ops (mm, mm.out, addmm, _log_softmax, mean.dim, rms_norm, mm.dtype, bmm) for the
device's dispatch key through ``torch.library.Library("aten", "IMPL")`` and swaps ``torch.bmm``;
``disable_batch_invariant_mode()`` destroys the library; ``set_batch_invariant_mode(enabled)`` is a
context manager. Here one worker per switch state calls enable (or nothing); the ``switching``
property (bi_props.runner.switching) exercises the switch as state.

The file ``sglang/srt/batch_invariant_ops/batch_invariant_ops.py`` of the installed wheel (pip
``--no-deps``) is executed under its own module name; the names it imports from SGLang's package are
answered by stand-ins (STAND_INS) instead of importing that package, whose ``__init__`` pulls the
frontend, a web stack, transformers and a torchvision that cannot load beside torch+cpu. Two of
them are host queries with no CPU answer:

- ``get_dispatch_device_backend()`` raises "No supported accelerator (CUDA/XPU) available" on CPU:
  the stand-in answers ``"CPU"`` (the interpreter runs the kernels on CPU tensors);
- ``get_device_core_count()`` returns 0 on CPU, so the persistent matmul would launch
  ``min(0, tiles) = 0`` programs and return uninitialised memory: the stand-in answers
  ``os.cpu_count()`` (the persistent kernels' tiles do not depend on the program count).

Routing is read in the dispatcher (``torch._C._dispatch_dump``), as for ``vllm``: is the CPU
kernel of each aten op the one registered from SGLang's file? Needs ``TRITON_INTERPRET=1`` and
triton (scripts/ci_triton_lane.sh installs both, with the SGLang wheel and only what its import
needs: nothing beyond torch and triton).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import types
from typing import Any

from . import triton_compat
from .base import Target, TargetBroken, TargetMissing, switch_requested
from .dispatcher import parse_dispatch_kernel
from .vllm import ATTRIBUTE_PATHS, registrations_to_ops

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
# Ops whose SGLang kernels reduce with tl.dot, which SGLang calls without input_precision: on an
# NVIDIA GPU fp32 operands are then rounded to TF32 (10 explicit mantissa bits, float16's) and the
# products accumulated in fp32. bi_props has no TF32 precision; "float16" is the declared
# precision at least as loose (10-bit rounding, a 16-bit bound), so `reference` judges TF32
# honestly instead of against a float32 bound it never promised. Under the interpreter tl.dot is
# fp32 (numpy): the default ("float32") stays.
TF32_OPS = ("mm", "matmul", "linear", "addmm", "bmm")
TF32_DECLARED = "float16"
INSTALL_HINT = (
    "Install triton and SGLang's wheel without its dependencies (pip install triton==3.9.0 && "
    "pip install --no-deps sglang==0.5.23; scripts/ci_triton_lane.sh does this) and run with "
    "TRITON_INTERPRET=1 on a CPU-only machine."
)


def stand_in_core_count(device_id: int = 0) -> int:
    """Stand-in for sglang's get_device_core_count(): the SM count on CUDA (as sglang reads it),
    os.cpu_count() on CPU (where sglang returns 0)."""
    import torch

    if torch.cuda.is_available() and not triton_compat.interpreting():
        return int(torch.cuda.get_device_properties(device_id).multi_processor_count)
    return os.cpu_count() or 1


def stand_in_dispatch_backend() -> str:
    """Stand-in for sglang's get_dispatch_device_backend(): "CPU" under the interpreter (where
    sglang raises "No supported accelerator"), "CUDA" on a GPU."""
    return KEY if triton_compat.interpreting() else "CUDA"


def _get_bool_env_var(name: str, default: str = "false") -> bool:
    """sglang.srt.utils.common.get_bool_env_var's rule (without its warning)."""
    return os.getenv(name, default).lower() in ("true", "1")


def _calc_diff(x: Any, y: Any) -> Any:
    """sglang.srt.utils.common.calc_diff (used only in its DeepGEMM comparison mode)."""
    x, y = x.double(), y.double()
    return 1 - 2 * (x * y).sum() / (x * x + y * y).sum()


# The names batch_invariant_ops.py imports from SGLang's own package, answered without importing
# that package (its __init__ pulls SGLang's frontend, web stack, transformers and a torchvision
# that cannot load beside torch+cpu). DeepGEMM is off: it is CUDA-only, and the Triton kernels are
# what is tested. is_npu() is False: the NPU branch is another target's (ascend).
STAND_INS: dict[str, dict[str, Any]] = {
    "sglang.srt.layers.deep_gemm_wrapper.configurer": {"ENABLE_JIT_DEEPGEMM": False},
    "sglang.srt.utils": {"is_npu": lambda: False},
    "sglang.srt.utils.common": {
        "calc_diff": _calc_diff,
        "get_bool_env_var": _get_bool_env_var,
        "get_device_core_count": stand_in_core_count,
        "get_dispatch_device_backend": stand_in_dispatch_backend,
    },
}


def source_file() -> str:
    """batch_invariant_ops.py of the installed SGLang wheel (found without importing sglang)."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise TargetMissing(f"target 'sglang': SGLang is not installed. {INSTALL_HINT}")
    root = next(iter(spec.submodule_search_locations))
    path = os.path.join(root, "srt", "batch_invariant_ops", "batch_invariant_ops.py")
    if not os.path.exists(path):
        raise TargetBroken(f"target 'sglang': the installed SGLang has no {path}")
    return path


def load_module() -> Any:
    """SGLang's batch_invariant_ops.py, executed under its own name with the stand-ins above as
    the package modules it imports from. Needs a GPU or TRITON_INTERPRET=1."""
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
    if importlib.util.find_spec("triton") is None:
        raise TargetMissing(f"target 'sglang' needs triton. {INSTALL_HINT}")
    path = source_file()
    for name in (
        "sglang",
        "sglang.srt",
        "sglang.srt.layers",
        "sglang.srt.layers.deep_gemm_wrapper",
    ):
        sys.modules.setdefault(name, types.ModuleType(name))
    for name, attrs in STAND_INS.items():
        module = sys.modules.setdefault(name, types.ModuleType(name))
        for attr, value in attrs.items():
            setattr(module, attr, value)
    package = types.ModuleType("sglang.srt.batch_invariant_ops")
    package.__path__ = [os.path.dirname(path)]
    sys.modules["sglang.srt.batch_invariant_ops"] = package
    spec = importlib.util.spec_from_file_location(MODULE, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[MODULE] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise TargetBroken(f"target 'sglang': executing {path} failed: {exc!r}") from None
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
        lines = [
            "# SGLang's batch_invariant_ops.py, loaded with bi_props' stated stand-ins for the",
            "# package names it imports (see bi_props.targets.sglang)",
            "from bi_props.targets.sglang import load_module",
            "bio = load_module()",
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

    def tf32(self) -> bool:
        """Whether fp32 tl.dot runs as TF32 here: on an NVIDIA GPU unless TRITON_F32_DEFAULT says
        otherwise ("ieee"); never under the interpreter."""
        return self.device == "cuda" and os.environ.get("TRITON_F32_DEFAULT", "tf32") != "ieee"

    def precision(self, op: str) -> str:
        declared = super().precision(op)
        if declared == "float32" and op in TF32_OPS and self.active() and self.tf32():
            return TF32_DECLARED
        return declared

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
        env["sglang_source"] = getattr(self.module, "__file__", "?")
        env["sglang_stand_ins"] = (
            f"get_dispatch_device_backend() -> {stand_in_dispatch_backend()!r}; "
            f"get_device_core_count() -> {stand_in_core_count()}; ENABLE_JIT_DEEPGEMM = False; "
            "is_npu() -> False"
        )
        env["sglang_registered"] = ", ".join(self.registered()) or "(none)"
        env["sglang_tl_dot_precision"] = (
            f"TF32 (tl.dot without input_precision on NVIDIA): {', '.join(TF32_OPS)} declared "
            f"{TF32_DECLARED!r}"
            if self.tf32()
            else "float32 (interpreter or TRITON_F32_DEFAULT=ieee)"
        )
        return env
