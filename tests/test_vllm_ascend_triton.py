"""The ``vllm-ascend-triton`` target's parts that need neither triton nor the wheel: its stated
stand-ins (the NPU-as-CPU library, num_vectorcore) and its error messages. Loading the wheel's
kernels under the interpreter is tested in the Triton lane (tests/triton_lane/lane_vllm_ascend.py).
"""

from __future__ import annotations

import pytest
import torch

from bi_props.targets import BUILTIN, TargetBroken, TargetMissing
from bi_props.targets import vllm_ascend_triton as vat


def test_registered_as_a_builtin_target():
    assert BUILTIN["vllm-ascend-triton"].endswith(":VllmAscendTritonTarget")


def test_npu_registrations_land_on_the_cpu_key_and_name_the_caller():
    """impl(..., "NPU") registers for CPU, and the dispatcher records the file that created the
    library (this test), not bi_props' stand-in: routing evidence depends on that."""
    define = torch.library.Library("bi_props_vat_test", "DEF")
    define.define("twice(Tensor x) -> Tensor")
    lib = vat._library_class()("bi_props_vat_test", "IMPL")
    try:
        lib.impl("twice", lambda x: x * 2, "NPU")
        assert "bi_props_vat_test/twice/CPU" in lib._op_impls, lib._op_impls
        out = torch.ops.bi_props_vat_test.twice(torch.ones(3))
        torch.testing.assert_close(out, torch.full((3,), 2.0))
        dump = torch._C._dispatch_dump("bi_props_vat_test::twice")
        cpu = [line for line in dump.splitlines() if line.startswith("CPU:")]
        assert cpu and __file__ in cpu[0], dump
    finally:
        lib._destroy()
        define._destroy()


def test_num_vectorcore_default_and_override(monkeypatch):
    monkeypatch.delenv(vat.CORES_ENV, raising=False)
    assert vat.stand_in_device_properties(0)["num_vectorcore"] == 48
    monkeypatch.setenv(vat.CORES_ENV, "40")
    assert vat.stand_in_device_properties(0)["num_vectorcore"] == 40


@pytest.mark.parametrize("value", ["many", "6"])
def test_num_vectorcore_bad_values_say_why(monkeypatch, value):
    monkeypatch.setenv(vat.CORES_ENV, value)
    with pytest.raises(TargetBroken, match=vat.CORES_ENV):
        vat.num_vectorcore()


def test_missing_wheel_says_how_to_fetch_it(monkeypatch, tmp_path):
    monkeypatch.delenv(vat.SRC_ENV, raising=False)
    with pytest.raises(TargetMissing, match=r"fetch_vllm_ascend_wheel\.sh"):
        vat.source_root()
    monkeypatch.setenv(vat.SRC_ENV, str(tmp_path))
    with pytest.raises(TargetMissing, match="lacks vllm_ascend/ops/triton/batch_invariant/matmul"):
        vat.source_root()


def test_without_the_interpreter_the_target_is_missing_not_broken(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(TargetMissing, match="TRITON_INTERPRET=1"):
        vat.load_module()


def test_wheel_version_read_from_dist_info(tmp_path):
    (tmp_path / "vllm_ascend-0.23.0.dist-info").mkdir()
    assert vat.wheel_version(tmp_path) == "0.23.0"
    assert vat.wheel_version(tmp_path / "nowhere") == "?"
