"""The built-in ``vllm-ascend-triton`` target: vllm-ascend's batch-invariant Triton kernels
(``vllm_ascend/ops/triton/batch_invariant/``), run on CPU by Triton's interpreter, registered as
vllm-ascend registers them when its AscendC ops (``batch_invariant_ops``) are absent.

vllm-ascend is not installed (it needs torch_npu and CANN): the published wheel is downloaded and
unpacked without installing (scripts/fetch_vllm_ascend_wheel.sh DIR, read via
``BI_PROPS_VLLM_ASCEND_SRC=DIR``, as the contract check does). Three files of it are executed under
their own module names: ``ops/triton/batch_invariant/matmul.py`` and ``softmax.py`` (the kernels)
and ``batch_invariant.py`` (its ``init_batch_invariance()`` / ``enable_batch_invariant_mode()``,
which decide what is registered). Nothing of the wheel is copied into bi_props.

What those files import from outside themselves is answered by stated stand-ins (STAND_INS):

- ``vllm.triton_utils``: ``HAS_TRITON = True``, ``tl`` = triton.language, ``triton`` = triton with
  one host query answered: ``triton.runtime.driver.active.utils.get_device_properties(dev)``
  returns ``{"num_vectorcore": N}`` (default 48, an Atlas A2 / Ascend 910B with 24 AI cores; set
  ``BI_PROPS_ASCEND_NUM_VECTORCORE``). ``linear_persistent`` launches ``N // 2`` programs and picks
  its block shapes from that count and from M and N;
- ``torch.npu.current_device()`` -> 0 (the kernel modules' ``torch`` is torch plus that);
- ``batch_invariant_ops`` (the AscendC package) is absent, so ``HAS_ASCENDC_BATCH_INVARIANT`` is
  False and ``enable_batch_invariant_mode()`` takes its Triton-only branch: aten addmm, bmm,
  softmax, _softmax, mm, matmul, linear;
- the dispatch key: the source registers on ``"NPU"``; its ``torch.library.Library`` here is
  torch's, with ``impl(..., "NPU")`` registering on ``"CPU"`` instead (the tensors are CPU ones);
- ``torch_npu`` (imported, unused on that branch), ``vllm.envs`` (``VLLM_BATCH_INVARIANT`` from
  the environment), ``vllm.logger``, and ``vllm_ascend.ascend_config.get_ascend_config()`` (an
  object that ``override_envs_for_invariance()`` sets two fields on).

``linear_persistent`` uses non-power-of-two block shapes (``BLOCK_M = M`` below 256 rows, ...),
which triton-ascend allows and stock Triton refuses: the compat layer's ``relaxed_block_shape``
patch is turned on by this target (and only here). ``rmsnorm.py`` and ``mean.py`` are not loaded:
vllm-ascend 0.23.0 registers neither.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from . import triton_compat
from .base import SWITCH_ENV, Target, TargetBroken, TargetMissing, switch_requested
from .dispatcher import PATH_OPS, parse_dispatch_kernel
from .vllm import (
    CLAIM_OPS,
    PredictionError,
    parse_op_impls,
    predict_registrations,
    registrations_to_ops,
)

SRC_ENV = "BI_PROPS_VLLM_ASCEND_SRC"
CORES_ENV = "BI_PROPS_ASCEND_NUM_VECTORCORE"
DEFAULT_VECTORCORES = 48
KEY = "CPU"
SOURCE_KEY = "NPU"  # what the wheel's source registers on
PACKAGE = "vllm_ascend"
KERNELS = "vllm_ascend.ops.triton.batch_invariant"
SWITCH_MODULE = "vllm_ascend.batch_invariant"
# Files executed, by module name (relative to the unpacked wheel), in load order.
FILES = {
    f"{KERNELS}.matmul": "vllm_ascend/ops/triton/batch_invariant/matmul.py",
    f"{KERNELS}.softmax": "vllm_ascend/ops/triton/batch_invariant/softmax.py",
    SWITCH_MODULE: "vllm_ascend/batch_invariant.py",
}
INSTALL_HINT = (
    "Download and unpack the vllm-ascend wheel (not installed) and point "
    f"{SRC_ENV} at it: bash scripts/fetch_vllm_ascend_wheel.sh DIR 0.23.0 && export "
    f"{SRC_ENV}=DIR; install triton (pip install 'bi_props[triton]') and run with "
    "TRITON_INTERPRET=1 (scripts/ci_triton_lane.sh does all of this)."
)


def source_root() -> Path:
    """The unpacked wheel named by BI_PROPS_VLLM_ASCEND_SRC (TargetMissing when absent)."""
    value = os.environ.get(SRC_ENV, "")
    if not value:
        raise TargetMissing(f"target 'vllm-ascend-triton': {SRC_ENV} is not set. {INSTALL_HINT}")
    root = Path(value)
    missing = [rel for rel in FILES.values() if not (root / rel).is_file()]
    if missing:
        raise TargetMissing(
            f"target 'vllm-ascend-triton': {root} lacks {', '.join(missing)}. {INSTALL_HINT}"
        )
    return root


def wheel_version(root: Path) -> str:
    """The version in the unpacked wheel's dist-info folder name."""
    for info in sorted(root.glob("vllm_ascend-*.dist-info")):
        return info.name[len("vllm_ascend-") : -len(".dist-info")]
    return "?"


def num_vectorcore() -> int:
    """The stand-in NPU's vector-core count (BI_PROPS_ASCEND_NUM_VECTORCORE, default 48)."""
    value = os.environ.get(CORES_ENV, "")
    try:
        count = int(value) if value else DEFAULT_VECTORCORES
    except ValueError:
        raise TargetBroken(f"{CORES_ENV}={value!r} is not an integer") from None
    if count < 8:
        raise TargetBroken(
            f"{CORES_ENV}={count}: linear_persistent divides num_vectorcore // 2 by 4, so fewer "
            f"than 8 vector cores divide by zero; use 8 or more (an Ascend 910B has 40-48)"
        )
    return count


def stand_in_device_properties(device: Any = None) -> dict[str, int]:
    """Stand-in for triton-ascend's ``driver.active.utils.get_device_properties(device)``."""
    return {"num_vectorcore": num_vectorcore(), "num_aicore": num_vectorcore() // 2}


class _Forwarding(types.ModuleType):
    """A module that is ``base`` with a few attributes replaced (the stand-ins)."""

    def __init__(self, name: str, base: Any, **replaced: Any) -> None:
        super().__init__(name)
        self._base = base
        self.__dict__.update(replaced)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._base, name)


def _library_class() -> type:
    """torch.library.Library, with registrations for the NPU key made on the CPU key. A subclass
    (not a wrapper function), so that the dispatcher records the upstream file as the place the
    library was created: routing evidence reads that location."""
    import torch

    class NpuAsCpuLibrary(torch.library.Library):
        def impl(self, op_name: Any, fn: Any, dispatch_key: str = "", **kwargs: Any) -> Any:
            if dispatch_key == SOURCE_KEY:
                dispatch_key = KEY
            return super().impl(op_name, fn, dispatch_key, **kwargs)

    return NpuAsCpuLibrary


def _stand_in_modules() -> dict[str, types.ModuleType]:
    """The modules the wheel's three files import, as stated stand-ins (see the docstring)."""
    import triton
    import triton.language as tl

    def module(name: str, **attrs: Any) -> types.ModuleType:
        m = types.ModuleType(name)
        m.__dict__.update(attrs)
        return m

    driver = types.SimpleNamespace(
        active=types.SimpleNamespace(
            utils=types.SimpleNamespace(get_device_properties=stand_in_device_properties)
        )
    )
    triton_stand_in = _Forwarding("triton", triton, runtime=types.SimpleNamespace(driver=driver))
    return {
        "vllm": module("vllm"),
        "vllm.triton_utils": module(
            "vllm.triton_utils", HAS_TRITON=True, tl=tl, triton=triton_stand_in
        ),
        "vllm.envs": module("vllm.envs", VLLM_BATCH_INVARIANT=switch_requested()),
        "vllm.logger": module("vllm.logger", logger=logging.getLogger("vllm_ascend")),
        "torch_npu": module("torch_npu"),
    }


def _torch_stand_in() -> types.ModuleType:
    """torch, plus ``torch.npu.current_device() -> 0`` and the NPU-as-CPU Library."""
    import torch

    library = _Forwarding("torch.library", torch.library, Library=_library_class())
    npu = types.SimpleNamespace(current_device=lambda: 0)
    return _Forwarding("torch", torch, npu=npu, library=library)


def _package(name: str, path: Path) -> types.ModuleType:
    package = types.ModuleType(name)
    package.__path__ = [str(path)]
    return package


@contextmanager
def _temporarily(modules: dict[str, Any]) -> Iterator[None]:
    """Put ``modules`` into sys.modules while the wheel's files execute; restore after (a real
    vLLM in the same process is not shadowed later)."""
    saved = {name: sys.modules.get(name) for name in modules}
    sys.modules.update(modules)
    try:
        yield
    finally:
        for name, previous in saved.items():
            if previous is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = previous


def load_module() -> Any:
    """vllm-ascend's ``batch_invariant.py`` (with its Triton kernel modules) executed from the
    unpacked wheel with the stand-ins above. Needs triton and TRITON_INTERPRET=1."""
    if not triton_compat.interpreting():
        raise TargetMissing(
            "target 'vllm-ascend-triton' runs vllm-ascend's Triton kernels under Triton's "
            f"interpreter on CPU: set TRITON_INTERPRET=1. {INSTALL_HINT}"
        )
    if importlib.util.find_spec("triton") is None:
        raise TargetMissing(f"target 'vllm-ascend-triton' needs triton. {INSTALL_HINT}")
    root = source_root()
    if SWITCH_MODULE in sys.modules:
        return sys.modules[SWITCH_MODULE]
    torch_stand_in = _torch_stand_in()
    # The wheel's packages as bare namespaces (their __init__ files import vllm and torch_npu);
    # the AscendC package is absent (None in sys.modules makes its import raise ImportError).
    packages = {
        PACKAGE: _package(PACKAGE, root / "vllm_ascend"),
        f"{PACKAGE}.ops": _package(f"{PACKAGE}.ops", root / "vllm_ascend/ops"),
        f"{PACKAGE}.ops.triton": _package(f"{PACKAGE}.ops.triton", root / "vllm_ascend/ops/triton"),
        KERNELS: _package(KERNELS, root / "vllm_ascend/ops/triton/batch_invariant"),
        f"{PACKAGE}.ascend_config": types.ModuleType(f"{PACKAGE}.ascend_config"),
        "batch_invariant_ops": None,
    }
    config = types.SimpleNamespace(weight_nz_mode=None, enable_matmul_allreduce=None)
    packages[f"{PACKAGE}.ascend_config"].get_ascend_config = lambda: config  # type: ignore[union-attr]
    sys.modules.update({k: v for k, v in packages.items() if k not in sys.modules})
    loaded: dict[str, Any] = {}
    with _temporarily(_stand_in_modules()):
        for name, rel in FILES.items():
            path = root / rel
            spec = importlib.util.spec_from_file_location(name, path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            try:
                spec.loader.exec_module(module)
            except Exception as exc:
                sys.modules.pop(name, None)
                raise TargetBroken(
                    f"target 'vllm-ascend-triton': executing {path} failed: {exc!r}"
                ) from None
            if hasattr(module, "torch"):
                module.torch = torch_stand_in  # torch.npu, and the NPU-as-CPU Library
            loaded[name] = module
    return loaded[SWITCH_MODULE]


class VllmAscendTritonTarget(Target):
    one_way = "vllm-ascend's enable_batch_invariant_mode() has no disable and no idempotence guard"
    name = "vllm-ascend-triton"
    device = "cpu"
    kernel_prefix = ""  # Python kernels on aten ops: the dispatcher is read instead

    def __init__(self) -> None:
        self.module: Any = None
        self.relaxed = False

    def check(self) -> None:
        # relaxed_block_shape is on for this target unless BI_PROPS_TRITON_COMPAT names patches
        # without it (then linear_persistent's non-power-of-two blocks are refused, visibly).
        spec = os.environ.get(triton_compat.COMPAT_ENV, "")
        wanted = not spec.strip() or "relaxed_block_shape" in spec
        if wanted and triton_compat.interpreting() and importlib.util.find_spec("triton"):
            triton_compat.apply(["relaxed_block_shape"])
            self.relaxed = True
        self.module = load_module()

    def activate(self) -> None:
        try:  # reads VLLM_BATCH_INVARIANT itself, as vLLM's engine start-up calls it
            self.module.init_batch_invariance()
        except Exception as exc:
            raise TargetBroken(
                f"target 'vllm-ascend-triton': init_batch_invariance() raised {exc!r} with "
                f"{SWITCH_ENV}={os.environ.get(SWITCH_ENV)!r}"
            ) from None

    def repro_setup(self, enabled: bool) -> str:
        return "\n".join(
            [
                "# vllm-ascend's batch_invariant.py and Triton kernels from the unpacked wheel",
                f"# (${SRC_ENV}), with bi_props' stated stand-ins (bi_props.targets."
                "vllm_ascend_triton)",
                "from bi_props.targets import triton_compat",
                "triton_compat.apply(['relaxed_block_shape'])",
                "from bi_props.targets.vllm_ascend_triton import load_module",
                "bi = load_module()",
                "bi.init_batch_invariance()  # reads VLLM_BATCH_INVARIANT",
            ]
        )

    # -- claims and evidence ---------------------------------------------------------------------

    def active(self) -> bool:
        return getattr(self.module, "_batch_invariant_LIB", None) is not None

    def registered(self) -> list[str]:
        """The aten ops registered now on the CPU key (the library's own record)."""
        lib = getattr(self.module, "_batch_invariant_LIB", None)
        impls = getattr(lib, "_op_impls", None) or ()
        return [name for name, key in parse_op_impls(impls) if key == KEY]

    def predicted(self) -> list[str]:
        """What enable_batch_invariant_mode() registers here, read from its source."""
        namespace = dict(vars(self.module))
        try:
            return predict_registrations(
                self.module.enable_batch_invariant_mode, namespace, SOURCE_KEY
            )
        except PredictionError:
            return []

    def covered(self) -> tuple[str, ...]:
        names = self.registered() if self.active() else self.predicted()
        return registrations_to_ops(names)

    def observe_routing(self) -> str:
        return "none"

    def kernel_is_ascend(self, qualified_name: str) -> bool:
        """Whether the CPU kernel of an aten op was registered from the wheel's
        batch_invariant.py."""
        import torch

        location = parse_dispatch_kernel(torch._C._dispatch_dump(qualified_name), KEY)
        if not location:
            return False
        path = location.rpartition(":")[0] or location
        return os.path.realpath(path) == os.path.realpath(self.module.__file__)

    def evidence(self, op: str) -> dict[str, bool]:
        names = CLAIM_OPS.get(op, ()) if self.active() else PATH_OPS.get(op, ())
        return {f"{n} [{KEY}] is vllm-ascend's kernel": self.kernel_is_ascend(n) for n in names}

    def switch_state(self) -> dict[str, Any]:
        return {
            "active": self.active(),
            SWITCH_ENV: os.environ.get(SWITCH_ENV),
            "vllm_ascend_registered": ", ".join(self.registered()) or "(none)",
        }

    def environment(self) -> dict[str, Any]:
        env = super().environment()
        root = source_root()
        env["vllm_ascend"] = wheel_version(root)
        env["vllm_ascend_source"] = str(root)
        env["vllm_ascend_HAS_TRITON"] = str(getattr(self.module, "HAS_TRITON", "?"))
        env["vllm_ascend_HAS_ASCENDC_BATCH_INVARIANT"] = str(
            getattr(self.module, "HAS_ASCENDC_BATCH_INVARIANT", "?")
        )
        env["vllm_ascend_dispatch_key"] = f"{KEY} (the source's {SOURCE_KEY})"
        env["vllm_ascend_stand_ins"] = (
            f"get_device_properties() -> num_vectorcore {num_vectorcore()}; "
            "torch.npu.current_device() -> 0; batch_invariant_ops (AscendC) absent; "
            "NPU registrations made on CPU"
        )
        env["vllm_ascend_registered"] = ", ".join(self.registered()) or "(none)"
        env["vllm_ascend_predicted"] = ", ".join(sorted(self.predicted())) or "(none)"
        return env
