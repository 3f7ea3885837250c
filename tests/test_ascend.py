"""Tests of the ascend target's pure logic (targets/ascend_routes.py) and of the adapter
(targets/ascend.py) on this NPU-less machine.

The adapter's code paths (check -> activate -> evidence/switch_state) also run against a
stand-in stack in a subprocess (``_FAKE_STACK``: fake torch_npu / vllm_ascend modules and CPU custom
ops named like the AscendC ones). That exercises the adapter's own logic only; nothing here is
evidence about real NPU behaviour, which remains unverified.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from bi_props.catalogue import OPS
from bi_props.model import properties
from bi_props.model.observation import Call, Hello, Observation
from bi_props.targets.ascend_routes import (
    ASCENDC_SINCE,
    CANN_CHECK,
    ENTRIES,
    KERNEL_PREFIX,
    REQUIREMENTS,
    Capabilities,
    Check,
    Probe,
    assess,
    cann_switch_problem,
    classify_import_failure,
    evaluate_checks,
    evidence_checks,
    fia_arguments,
    fia_keywords,
    in_range,
    init_enables,
    interpret_profiler,
    library_key,
    plan,
    registrations,
    requirements_for,
    routing_table,
    version_at_least,
    version_key,
)
from bi_props.targets.base import TargetMissing

MM = "batch_invariant_ops::npu_mm_batch_invariant"
MATMUL = "batch_invariant_ops::npu_matmul_batch_invariant"
SUM = "batch_invariant_ops::npu_reduce_sum_batch_invariant"
FIA = "batch_invariant_ops::npu_fused_infer_attention_score_batch_invariant"
TRITON = "vllm_ascend.ops.triton.batch_invariant"
BI = "vllm_ascend.batch_invariant"


def caps(ascendc: bool, triton: bool, version: str | None = "0.23.0") -> Capabilities:
    return Capabilities(ascendc, triton, version, "2.10.0.post4", "8.3.RC1")


# ---------------------------------------------------------------------------------------------
# Versions


VERSIONS = [
    "0.13.0rc1",
    "0.13.0rc2",
    "0.13.0",
    "0.13.0.post1",
    "0.14.0.dev3",
    "0.14.0a1",
    "0.14.0b2",
    "0.14.0rc1",
    "0.14.0",
    "0.15",
    "0.15.0.post2.dev1",
    "0.25.2.dev5+g1234abc",
    "0.26.0rc1",
    "0.27.1rc1",
    "1.0",
    "1!0.1",
    "8.3.RC1",
    "9.2.0",
    "26.2.0",
    "2.10.0.post4",
]


def test_version_order_matches_packaging():
    packaging_version = pytest.importorskip("packaging.version")
    ours = sorted(VERSIONS, key=version_key)
    theirs = sorted(VERSIONS, key=packaging_version.Version)
    assert ours == theirs


def test_version_helpers():
    assert version_key("not a version") is None and version_key(None) is None
    assert version_at_least("0.16.0rc1", "0.16.0rc1") is True
    assert version_at_least("0.16.0.dev3", "0.16.0rc1") is False
    assert version_at_least("0.23.0.post1", "0.23.0") is True
    assert version_at_least("8.3.RC1", "9.2.0") is False
    assert version_at_least("garbage", "1.0") is None
    assert in_range("0.20.0", since="0.15.0rc1", before="0.27.1rc1")
    assert not in_range("0.27.1rc1", before="0.27.1rc1")
    assert in_range(None, since="0.23.0")  # unknown reads as the reference version 0.23.0


# ---------------------------------------------------------------------------------------------
# Registrations and routing tables, per (version, backend)


def _pairs(c: Capabilities) -> list[tuple[str, str]]:
    return [(r.target, r.implementation) for r in registrations(c)]


def test_registrations_0_23_0_both_backends():
    """vllm_ascend/batch_invariant.py of the 0.23.0 wheel, lines 109-128."""
    assert _pairs(caps(True, True)) == [
        ("aten::addmm", f"{TRITON}.matmul.addmm_batch_invariant"),  # line 110
        ("aten::bmm", f"{TRITON}.matmul.bmm_batch_invariant"),  # line 111
        ("aten::softmax", f"{TRITON}.softmax.softmax_batch_invariant"),  # line 112
        ("aten::_softmax", f"{TRITON}.softmax.softmax_batch_invariant"),  # line 113
        ("aten::mm", "torch.ops.batch_invariant_ops.npu_mm_batch_invariant"),  # line 117
        ("aten::matmul", "torch.ops.batch_invariant_ops.npu_matmul_batch_invariant"),  # line 118
        ("aten::sum", "torch.ops.batch_invariant_ops.npu_reduce_sum_batch_invariant"),  # line 119
        (
            "torch_npu.npu_fused_infer_attention_score",  # lines 122-124
            "torch.ops.batch_invariant_ops.npu_fused_infer_attention_score_batch_invariant",
        ),
        ("torch_npu.npu_add_rms_norm", f"{BI}.add_rms_norm"),  # line 126
        ("torch.sum", f"{BI}.reduce_sum"),  # line 128
    ]


def test_registrations_0_23_0_triton_only_and_neither():
    """Lines 109-113 and the elif branch, lines 131-137."""
    assert _pairs(caps(False, True)) == [
        ("aten::addmm", f"{TRITON}.matmul.addmm_batch_invariant"),
        ("aten::bmm", f"{TRITON}.matmul.bmm_batch_invariant"),
        ("aten::softmax", f"{TRITON}.softmax.softmax_batch_invariant"),
        ("aten::_softmax", f"{TRITON}.softmax.softmax_batch_invariant"),
        ("aten::mm", f"{TRITON}.matmul.mm_batch_invariant"),
        ("aten::matmul", f"{TRITON}.matmul.matmul_batch_invariant"),
        ("aten::linear", f"{TRITON}.matmul.linear_batch_invariant"),
    ]
    assert registrations(caps(False, False)) == ()
    assert not init_enables(caps(False, False))
    assert init_enables(caps(True, False)) and init_enables(caps(False, True))


def test_version_dependent_registrations():
    targets = {
        v: {r.target for r in registrations(caps(True, True, v))}
        for v in ("0.14.0rc1", "0.15.0rc1", "0.18.0", "0.26.0rc1", "0.27.1rc1", "0.30.0rc2")
    }
    # 0.13-0.14: Triton for everything, no AscendC branch; init needs Triton.
    assert targets["0.14.0rc1"] == {
        f"aten::{op}" for op in ("mm", "addmm", "matmul", "linear", "bmm")
    }
    assert not init_enables(caps(True, False, "0.14.0rc1"))
    assert init_enables(caps(True, False, ASCENDC_SINCE))
    # 0.15: AscendC mm/matmul/sum + attention swap; no softmax, no torch.sum / add_rms_norm swaps.
    assert "aten::sum" in targets["0.15.0rc1"]
    assert "torch_npu.npu_fused_infer_attention_score" in targets["0.15.0rc1"]
    assert not {"aten::softmax", "torch.sum", "torch_npu.npu_add_rms_norm"} & targets["0.15.0rc1"]
    assert {"aten::softmax", "torch.sum", "torch_npu.npu_add_rms_norm"} <= targets["0.18.0"]
    # aten::sum up to 0.26.0rc1; torch.Tensor.sum swapped from 0.27.1rc1 (PyPI releases).
    assert "aten::sum" in targets["0.26.0rc1"] and "torch.Tensor.sum" not in targets["0.26.0rc1"]
    for v in ("0.27.1rc1", "0.30.0rc2"):
        assert "aten::sum" not in targets[v] and "torch.Tensor.sum" in targets[v]


def test_routing_table_ascendc_and_triton():
    table = routing_table(caps(True, True))
    assert set(table) == {
        "mm",
        "matmul",
        "bmm",
        "addmm",
        "linear",
        "sum",
        "softmax",
        "add_rms_norm",
        "attention",
        "fused_add_rms_norm",
        "paged_decode_attention",
        "mixed_attention",
    }
    assert table["mm"].events == (MM,) and table["mm"].backend == "ascendc"
    assert table["matmul"].events == (MATMUL,)
    assert table["sum"].events == (SUM,)
    assert table["sum"].aten == ("aten::sum",)
    assert table["sum"].swaps == (("torch.sum", f"{BI}.reduce_sum"),)
    assert table["attention"].events == (FIA,)
    # Triton kernels and Python swaps have no stable event: identity/registration decides.
    for op in ("bmm", "addmm", "softmax", "add_rms_norm"):
        assert table[op].events == ()
    assert table["linear"].backend == "mixed" and table["linear"].events == ()
    assert table["linear"].aten == ("aten::addmm", "aten::matmul")
    assert table["add_rms_norm"].swaps == (("torch_npu.npu_add_rms_norm", f"{BI}.add_rms_norm"),)
    assert any("Tensor.sum(dim=...)" in g for g in table["sum"].gaps)
    assert any("inert" in g for g in table["softmax"].gaps)
    assert any("beta/alpha" in g for g in table["addmm"].gaps)
    # Not covered on Ascend at all.
    assert not {"mean", "log_softmax", "rms_norm"} & set(table)


def test_routing_table_triton_only():
    table = routing_table(caps(False, True))
    assert set(table) == {"mm", "matmul", "bmm", "addmm", "linear", "softmax"}
    assert all(r.backend == "triton" and r.events == () for r in table.values())
    assert table["linear"].aten == ("aten::linear",)


def test_routing_table_ascendc_only():
    table = routing_table(caps(True, False))
    assert set(table) == {
        "mm",
        "matmul",
        "linear",
        "sum",
        "add_rms_norm",
        "attention",
        "fused_add_rms_norm",
        "paged_decode_attention",
        "mixed_attention",
    }
    assert table["linear"].events == (MATMUL,)  # a 2-D linear with bias will miss it:
    assert any("aten::addmm" in g for g in table["linear"].gaps)


def test_routing_table_neither_claims_but_cannot_route():
    table = routing_table(caps(False, False))
    assert set(table) == set(routing_table(caps(True, True)))
    assert all(r.backend is None and not r.registrations for r in table.values())
    (check,) = evidence_checks(table["mm"])
    assert check.kind == "backend"


def test_routing_table_0_30_tensor_sum():
    table = routing_table(caps(True, True, "0.30.0rc2"))
    assert table["sum"].aten == ()
    assert set(table["sum"].swaps) == {
        ("torch.sum", f"{BI}.reduce_sum"),
        ("torch.Tensor.sum", f"{BI}.reduce_sum"),
    }
    assert table["sum"].events == (SUM,)
    assert any("last dim" in g for g in table["sum"].gaps)


def test_plan_switches():
    vllm = plan(caps(True, True), "vllm", tuple(OPS))
    assert vllm.covered == tuple(op for op in OPS if op in routing_table(caps(True, True)))
    assert vllm.routes()["mm"] == (MM,)
    cann = plan(caps(True, True), "cann", tuple(OPS))
    assert cann.covered == tuple(OPS) and cann.routes() == {}
    assert cann.checks("mm") == (CANN_CHECK,)
    assert cann_switch_problem(caps(True, True)) == (
        "torch_npu 2.10.0.post4 < 26.2.0; CANN 8.3.RC1 < 9.2.0"
    )
    assert cann_switch_problem(Capabilities(True, True, None, "26.2.0", "9.2.0")) is None


# ---------------------------------------------------------------------------------------------
# Identity checks and their evaluation


def test_identity_check_expectations():
    names = [c.name for c in evidence_checks(routing_table(caps(True, True))["sum"])]
    assert names == ["aten::sum registered on NPU by vllm-ascend", f"torch.sum is {BI}.reduce_sum"]
    later = [c.name for c in evidence_checks(routing_table(caps(True, True, "0.30.0rc2"))["sum"])]
    assert f"torch.Tensor.sum is {BI}.reduce_sum" in later
    (fia,) = evidence_checks(routing_table(caps(True, True))["attention"])
    assert fia == Check(
        "torch_npu.npu_fused_infer_attention_score is torch.ops.batch_invariant_ops."
        "npu_fused_infer_attention_score_batch_invariant",
        "identity",
        "torch_npu.npu_fused_infer_attention_score",
        "torch.ops.batch_invariant_ops.npu_fused_infer_attention_score_batch_invariant",
    )
    assert library_key("aten::_softmax") == "aten/_softmax/NPU"


def test_evaluate_checks():
    checks = evidence_checks(routing_table(caps(True, True))["sum"])
    result = evaluate_checks(
        checks,
        registered={"aten/sum/NPU"}.__contains__,
        same=lambda a, b: a == "torch.sum",
        backend=True,
    )
    assert all(result.values()) and len(result) == 2
    off = evaluate_checks(
        checks, registered=lambda key: False, same=lambda a, b: False, backend=True
    )
    assert not any(off.values())
    assert evaluate_checks(
        [CANN_CHECK], registered=bool, same=bool, backend=True, cann_level=3
    ) == {CANN_CHECK.name: True}


# ---------------------------------------------------------------------------------------------
# Profiler interpretation (literal event lists; the seed test's event names)


def test_interpret_profiler_enabled():
    mm = routing_table(caps(True, True))["mm"]
    assert interpret_profiler(["aten::mm", MM], mm, enabled=True).proven is True
    reading = interpret_profiler(["aten::mm", "npu::npu_mm"], mm, enabled=True)
    assert reading.proven is False and MM in reading.message
    bmm = routing_table(caps(True, True))["bmm"]
    assert interpret_profiler(["aten::bmm"], bmm, enabled=True).proven is None
    add = routing_table(caps(True, True))["add_rms_norm"]
    fused = interpret_profiler(["npu::npu_add_rms_norm"], add, enabled=True)
    assert fused.proven is False
    split = interpret_profiler(["aten::add", "npu::npu_rms_norm"], add, enabled=True)
    assert split.proven is None  # a Python swap: identity decides
    neither = routing_table(caps(False, False))["mm"]
    assert interpret_profiler(["aten::mm"], neither, enabled=True).proven is False


def test_interpret_profiler_disabled_needs_zero_kernel_events():
    mm = routing_table(caps(True, True))["mm"]
    assert interpret_profiler(["aten::mm", "npu::npu_mm"], mm, enabled=False).proven is True
    leak = interpret_profiler(["aten::sum", SUM], routing_table(caps(True, True))["sum"], False)
    assert leak.proven is False and leak.reached == (SUM,)


def _hello(c: Capabilities, switch: str) -> Hello:
    p = plan(c, "vllm", tuple(OPS))
    return Hello(
        "ascend",
        switch,
        "ready",
        device="npu",
        kernel_prefix=KERNEL_PREFIX,
        covered=p.covered,
        entries=dict(ENTRIES),
        routes=p.routes(),
    )


def _observation(switch: str, events: list[str], identity: dict[str, bool], active: bool):
    call = Call(outputs=(), events=tuple(events))
    return Observation(
        "routing", switch, {"op": call}, evidence={"identity": identity, "active": active}
    )


def test_routing_property_passes_on_a_routed_call():
    c = caps(True, True)
    names = [ch.name for ch in evidence_checks(routing_table(c)["mm"])]
    obs = _observation("enabled", ["aten::mm", MM], dict.fromkeys(names, True), True)
    assert properties.routing(obs, _hello(c, "enabled"), "mm").ok
    missed = _observation("enabled", ["aten::mm"], dict.fromkeys(names, True), True)
    assert not properties.routing(missed, _hello(c, "enabled"), "mm").ok
    off = _observation("disabled", ["aten::mm"], dict.fromkeys(names, False), False)
    assert properties.routing(off, _hello(c, "disabled"), "mm").ok
    leak = _observation("disabled", ["aten::mm", MM], dict.fromkeys(names, False), False)
    assert not properties.routing(leak, _hello(c, "disabled"), "mm").ok


def test_routing_property_fails_for_covered_ops_when_nothing_is_installed():
    """The half-installed switch: on, but neither backend; init only warns."""
    c = caps(False, False)
    hello = _hello(c, "enabled")
    assert "mm" in hello.covered
    for op in hello.covered:
        names = [ch.name for ch in evidence_checks(routing_table(c)[op])]
        for active in (False, True):
            obs = _observation("enabled", ["aten::mm"], dict.fromkeys(names, False), active)
            verdict = properties.routing(obs, hello, op)
            assert not verdict.ok, (op, active)


# ---------------------------------------------------------------------------------------------
# check(): missing / broken classification


def test_classify_import_failures():
    absent = ModuleNotFoundError("No module named 'torch_npu'", name="torch_npu")
    assert classify_import_failure("torch_npu", "torch_npu", absent).state == "missing"
    cann = ImportError("libhccl.so: cannot open shared object file: No such file or directory")
    probe = classify_import_failure("torch_npu", "torch_npu", cann)
    assert (probe.piece, probe.state) == ("cann", "missing")
    no_vllm = ModuleNotFoundError("No module named 'vllm'", name="vllm")
    probe = classify_import_failure("vllm_ascend", "vllm_ascend.batch_invariant", no_vllm)
    assert (probe.piece, probe.state) == ("vllm", "missing")
    old = ModuleNotFoundError(
        "No module named 'vllm_ascend.batch_invariant'", name="vllm_ascend.batch_invariant"
    )
    probe = classify_import_failure("vllm_ascend", "vllm_ascend.batch_invariant", old)
    assert (probe.piece, probe.state) == ("batch_invariant", "missing")
    crash = RuntimeError("ACL error 507033")
    probe = classify_import_failure("vllm_ascend", "vllm_ascend.batch_invariant", crash)
    assert probe.state == "broken" and "507033" in probe.detail


def test_assess_names_each_missing_piece_with_install_hints():
    state, message = assess(
        [
            Probe("npu_device", "ok"),
            Probe("vllm_ascend", "missing", "import vllm_ascend: not found"),
            Probe("batch_invariant_ops", "missing", "not found"),
        ]
    )
    assert state == "missing"
    assert "vllm_ascend" in message and "pip install vllm-ascend" in message
    assert ".run installer" in message and "BI_PROPS_ASCEND_BACKEND=auto" in message
    state, message = assess(
        [
            Probe("batch_invariant_ops", "broken", "fails to import: X"),
            Probe("npu_device", "missing", "no device"),
        ]
    )
    assert state == "broken" and "fails to import: X" in message and "npu_device" in message
    assert assess([Probe("torch_npu", "ok")]) == ("ready", "")


def test_check_here_raises_target_missing_naming_torch_npu():
    from bi_props.targets.ascend import AscendTarget

    with pytest.raises(TargetMissing) as info:
        AscendTarget().check()
    assert "torch_npu" in str(info.value) and "torch-npu" in str(info.value)


def test_requirements_are_versioned():
    symbols = {r.symbol for r in requirements_for("0.23.0")}
    assert {
        "init_batch_invariance",
        "HAS_ASCENDC_BATCH_INVARIANT",
        "reduce_sum",
        "get_ascend_config",
        "_batch_invariant_LIB",
    } <= symbols
    old = {r.symbol for r in requirements_for("0.14.0rc1")}
    assert "HAS_ASCENDC_BATCH_INVARIANT" not in old and "get_ascend_config" not in old
    assert len({(r.module, r.symbol) for r in REQUIREMENTS}) == len(REQUIREMENTS)


# ---------------------------------------------------------------------------------------------
# The attention entry's arguments


def test_fia_arguments_from_cu_seqlens():
    kwargs = fia_arguments([0, 3, 3, 7], num_heads=8, num_kv_heads=2, scale=0.125, causal=True)
    assert kwargs == {
        "input_layout": "TND",
        "actual_seq_lengths": [3, 3, 7],
        "actual_seq_lengths_kv": [3, 3, 7],
        "num_heads": 8,
        "num_key_value_heads": 2,
        "scale": 0.125,
        "sparse_mode": 3,
        "block_table": None,
        "block_size": 128,
    }
    assert fia_arguments([0, 5], 4, 4, 1.0, causal=False)["sparse_mode"] == 0
    for bad in ([], [0], [1, 3], [0, 4, 2]):
        with pytest.raises(ValueError):
            fia_arguments(bad, 4, 4, 1.0, True)
    with pytest.raises(ValueError):
        fia_arguments([0, 2], 6, 4, 1.0, True)
    assert {"query", "key", "value", "atten_mask", "actual_seq_lengths"} <= fia_keywords()


def test_entries_name_npu_functions():
    assert ENTRIES["add_rms_norm"] == ("torch_npu.npu_add_rms_norm",)
    module, _, attr = ENTRIES["attention"][0].rpartition(".")
    import importlib

    assert callable(getattr(importlib.import_module(module), attr))


# ---------------------------------------------------------------------------------------------
# The adapter against a stand-in stack, in a fresh interpreter (swaps are process-global)

_FAKE_STACK = textwrap.dedent(
    r"""
    import importlib.machinery, json, os, sys, types
    import torch
    # imported once; each variant is a fork
    import bi_props.catalogue, bi_props.targets.ascend

    def variant(cfg):
        os.environ["VLLM_BATCH_INVARIANT"] = "1" if cfg["enabled"] else "0"
        os.environ["BI_PROPS_ASCEND_SWITCH"] = cfg.get("switch", "vllm")
        os.environ["BI_PROPS_ASCEND_BACKEND"] = cfg.get("backend", "ascendc")

        def module(name, **attrs):
            m = types.ModuleType(name)
            m.__spec__ = importlib.machinery.ModuleSpec(name, None, origin=f"<stand-in {name}>")
            m.__dict__.update(attrs)
            sys.modules[name] = m
            return m

        if cfg.get("custom_ops", True):  # CPU custom ops named like the AscendC package's
            lib = torch.library.Library("batch_invariant_ops", "DEF")
            for name in ("npu_mm_batch_invariant", "npu_matmul_batch_invariant"):
                lib.define(f"{name}(Tensor a, Tensor b) -> Tensor")
                lib.impl(name, lambda a, b: a @ b, "CompositeExplicitAutograd")
            lib.define("npu_fused_infer_attention_score_batch_invariant(Tensor q) -> Tensor")
            lib.impl("npu_fused_infer_attention_score_batch_invariant", lambda q: q,
                     "CompositeExplicitAutograd")
        if cfg.get("package", True):
            module("batch_invariant_ops")

        torch.npu = types.SimpleNamespace(is_available=lambda: True)
        levels = []
        npu = types.SimpleNamespace()
        if cfg.get("set_level", False):
            npu.set_deterministic_level = levels.append
            npu.get_deterministic_level = lambda: levels[-1] if levels else 0
        torch_npu = module("torch_npu", __version__="2.10.0.post4", npu=npu,
                           npu_add_rms_norm=lambda *a: a,
                           npu_fused_infer_attention_score=lambda: 0)
        module("vllm_ascend")
        config_module = module("vllm_ascend.ascend_config")
        def get_ascend_config():
            raise RuntimeError("Ascend config is not initialized. Please call init_ascend_config")
        config_module.get_ascend_config = get_ascend_config
        seen_configs = []

        bi = module("vllm_ascend.batch_invariant", HAS_TRITON=False,
                    HAS_ASCENDC_BATCH_INVARIANT=cfg.get("has_ascendc", True),
                    _batch_invariant_LIB=None)
        def add_rms_norm(x, residual, weight, eps):
            return x, None, residual
        def reduce_sum(x, dim=None, keepdim=False):
            return x
        def override_envs_for_invariance():
            from vllm_ascend.ascend_config import get_ascend_config
            config = get_ascend_config()
            seen_configs.append(dict(vars(config)))
            config.weight_nz_mode = 0
        def enable_batch_invariant_mode():
            bi._batch_invariant_LIB = types.SimpleNamespace(
                _op_impls={"aten/mm/NPU", "aten/matmul/NPU", "aten/sum/NPU"})
            torch_npu.npu_fused_infer_attention_score = (
                torch.ops.batch_invariant_ops.npu_fused_infer_attention_score_batch_invariant)
            torch_npu.npu_add_rms_norm = add_rms_norm
            torch.sum = reduce_sum
        def init_batch_invariance():
            if os.environ["VLLM_BATCH_INVARIANT"] == "1" and bi.HAS_ASCENDC_BATCH_INVARIANT:
                override_envs_for_invariance()
                enable_batch_invariant_mode()
        bi.__dict__.update(add_rms_norm=add_rms_norm, reduce_sum=reduce_sum,
                           init_batch_invariance=init_batch_invariance)

        from bi_props.targets.ascend import AscendTarget
        from bi_props.targets.base import TargetBroken, TargetMissing

        target = AscendTarget()
        try:
            target.check()
            target.activate()
        except (TargetMissing, TargetBroken) as exc:
            return {"raised": type(exc).__name__, "message": str(exc)}
        return {
            "covered": target.covered(),
            "routes": target.routes(),
            "evidence": {op: target.evidence(op) for op in target.covered()},
            "state": target.switch_state(),
            "configs": seen_configs,
            "restored": config_module.get_ascend_config is get_ascend_config,
            "environment": target.environment(),
        }

    results = {}
    for name, cfg in json.loads(sys.argv[1]).items():
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the switch is process-global and one-way: one fresh child per variant
            os.close(read)
            try:
                payload = {"ok": variant(cfg)}
            except BaseException as exc:
                payload = {"error": repr(exc)}
            os.write(write, json.dumps(payload).encode())
            os._exit(0)
        os.close(write)
        chunks = []
        while chunk := os.read(read, 65536):
            chunks.append(chunk)
        os.close(read)
        os.waitpid(pid, 0)
        results[name] = json.loads(b"".join(chunks))
    print(json.dumps(results))
    """
)

VARIANTS = {
    "enabled": {"enabled": True},
    "disabled": {"enabled": False},
    "half_installed": {"enabled": True, "has_ascendc": False},
    "name_clash": {"enabled": True, "custom_ops": False},
    "no_package": {"enabled": True, "package": False, "has_ascendc": False},
    "no_package_auto": {"enabled": True, "package": False, "has_ascendc": False, "backend": "auto"},
    "cann_on": {"enabled": True, "switch": "cann", "set_level": True},
    "cann_off": {"enabled": False, "switch": "cann", "set_level": True},
    "cann_missing": {"enabled": True, "switch": "cann"},
}


@pytest.fixture(scope="module")
def fake() -> dict:
    if not hasattr(os, "fork"):
        pytest.skip("the stand-in stack runs its variants in forked children (POSIX only)")
    done = subprocess.run(
        [sys.executable, "-c", _FAKE_STACK, json.dumps(VARIANTS)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    results = json.loads(done.stdout.strip().splitlines()[-1])
    for name, result in results.items():
        assert "ok" in result, f"{name}: {result}"
    return {name: result["ok"] for name, result in results.items()}


def test_adapter_enabled_on_a_stand_in_stack(fake):
    out = fake["enabled"]
    # fused_add_rms_norm: its adapter calls the swapped npu_add_rms_norm; paged_decode_attention
    # and mixed_attention (FIA's DecodeOnly and ChunkedPrefill calls) are claimed where the
    # catalogue has them (claims follow the catalogue).
    expected = ["mm", "matmul", "linear", "sum", "add_rms_norm", "attention", "fused_add_rms_norm"]
    for op in ("paged_decode_attention", "mixed_attention"):
        if op in OPS:
            expected.append(op)
    assert out["covered"] == [op for op in OPS if op in expected]
    assert out["routes"]["mm"] == [MM]
    assert out["state"]["active"] is True and out["state"]["config_standin"] is True
    assert out["state"]["VLLM_BATCH_INVARIANT"] == "1"
    assert out["configs"] == [{"weight_nz_mode": 1, "enable_matmul_allreduce": False}]
    assert out["restored"] is True
    assert out["evidence"]["mm"] == {"aten::mm registered on NPU by vllm-ascend": True}
    assert out["evidence"]["sum"] == {
        "aten::sum registered on NPU by vllm-ascend": True,
        f"torch.sum is {BI}.reduce_sum": True,
    }
    assert all(out["evidence"]["attention"].values())
    assert all(out["evidence"]["add_rms_norm"].values())
    assert out["environment"]["ascend_HAS_ASCENDC_BATCH_INVARIANT"] == "True"


def test_adapter_disabled_installs_nothing(fake):
    out = fake["disabled"]
    assert out["state"]["active"] is False and out["configs"] == []
    assert not any(v for ev in out["evidence"].values() for v in ev.values())


def test_adapter_half_installed_package_is_broken(fake):
    """batch_invariant_ops present, but vllm-ascend's ImportError swallowed it."""
    out = fake["half_installed"]
    assert out["raised"] == "TargetBroken" and "batch_invariant_ops" in out["message"]


def test_adapter_name_clash_is_broken(fake):
    out = fake["name_clash"]
    assert out["raised"] == "TargetBroken" and "thinking-machines" in out["message"]


def test_adapter_missing_package_is_missing_unless_auto(fake):
    out = fake["no_package"]
    assert out["raised"] == "TargetMissing" and ".run installer" in out["message"]
    auto = fake["no_package_auto"]
    assert auto["state"]["active"] is False  # init only warned: routing fails for covered ops
    assert "mm" in auto["covered"]
    assert auto["evidence"]["mm"] == {
        "a batch-invariant backend is installed (HAS_ASCENDC_BATCH_INVARIANT or HAS_TRITON)": False
    }


def test_adapter_cann_switch(fake):
    out = fake["cann_on"]
    assert out["covered"] == list(OPS) and out["routes"] == {}
    assert out["state"]["active"] is True
    assert out["evidence"]["mm"] == {CANN_CHECK.name: True}
    off = fake["cann_off"]
    assert off["state"]["active"] is False and off["evidence"]["mm"] == {CANN_CHECK.name: False}
    missing = fake["cann_missing"]
    assert missing["raised"] == "TargetMissing" and "26.2.0" in missing["message"]
