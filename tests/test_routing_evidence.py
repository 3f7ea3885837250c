"""Routing needs positive evidence.

Enabled: a covered op must show one of the target's own events (its ROUTES, else any event with its
KERNEL_PREFIX) or a passing identity check; no evidence is a routing failure saying what was looked
for. Disabled: none of them. Where nothing can be looked for, the verdict is "not observable",
never a pass. A module without prefix (thinking-machines style) is judged from the dispatcher.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from bi_props.model import properties
from bi_props.model.case import Case
from bi_props.model.observation import Call, Hello, Observation
from bi_props.runner.controller import Runner

PLANTED = Path(__file__).resolve().parent / "planted"


def _obs(switch: str, events, identity=None, active=None, **evidence) -> Observation:
    call = Call(outputs=(), events=None if events is None else tuple(events))
    active = switch == "enabled" if active is None else active
    return Observation(
        "routing",
        switch,
        {"op": call},
        evidence={"active": active, "identity": identity or {}, **evidence},
    )


def _hello(switch: str, prefix: str = "", routes=None) -> Hello:
    return Hello("lib", switch, "ready", kernel_prefix=prefix, covered=("mm",), routes=routes or {})


# -- the judge -----------------------------------------------------------------------------------


def test_enabled_with_a_prefix_and_none_of_its_events_is_a_routing_failure():
    verdict = properties.routing(_obs("enabled", ["aten::mm"]), _hello("enabled", "lib::"), "mm")
    assert not verdict.ok and verdict.kind == "mismatch"
    assert "no evidence that mm reached target 'lib''s kernels" in verdict.message
    assert "looked for an event starting with 'lib::'" in verdict.message
    assert "seen: ['aten::mm']" in verdict.message and "identity checks: none" in verdict.message


def test_enabled_with_a_prefix_event_passes_and_disabled_with_one_leaks():
    hello = _hello("enabled", "lib::")
    assert properties.routing(_obs("enabled", ["aten::mm", "lib::mm"]), hello, "mm").ok
    assert properties.routing(_obs("disabled", ["aten::mm"]), _hello("disabled", "lib::"), "mm").ok
    leak = properties.routing(
        _obs("disabled", ["aten::mm", "lib::mm"]), _hello("disabled", "lib::"), "mm"
    )
    assert not leak.ok and "switch leak" in leak.message


def test_identity_evidence_alone_is_positive_evidence():
    yes = _obs("enabled", None, {"torch.mm is lib.mm": True})
    assert properties.routing(yes, _hello("enabled"), "mm").ok
    no = properties.routing(
        _obs("enabled", None, {"torch.mm is lib.mm": False}), _hello("enabled"), "mm"
    )
    assert not no.ok and "identity check failed" in no.message


@pytest.mark.parametrize("switch", ["enabled", "disabled"])
def test_nothing_to_look_for_is_not_observable_never_a_pass(switch: str):
    for events in (None, ["aten::mm"]):  # no profiler, or events but no prefix/routes to match
        verdict = properties.routing(_obs(switch, events), _hello(switch), "mm")
        assert (verdict.ok, verdict.kind) == (False, "not_observable"), events
        assert verdict.message.startswith("routing not observable: target 'lib' declares no")


def test_a_profiler_that_cannot_start_is_not_observable():
    obs = _obs("enabled", None, profiler_error="profiler already running")
    verdict = properties.routing(obs, _hello("enabled", "lib::"), "mm")
    assert (verdict.ok, verdict.kind) == (False, "not_observable")
    assert verdict.message == "routing not observable: profiler already running"


# -- real workers: planted libraries -------------------------------------------------------------


@pytest.fixture(autouse=True)
def planted_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    paths = [str(PLANTED), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, paths)))


@contextmanager
def running(target: str) -> Iterator[Runner]:
    runner = Runner(target, start_timeout_s=120)
    try:
        yield runner
    finally:
        runner.close()


MM = Case("mm", "torch.mm", "float32", (3, 5, 4), ("contiguous", "contiguous"), "general", 0)


def _route(runner: Runner, switch: str) -> properties.Verdict:
    hello = runner.hello(switch)
    assert hello.status == "ready", hello.message
    return properties.routing(runner.observe("routing", MM, switch), hello, "mm")


@pytest.mark.slow
def test_a_noop_enable_fails_routing_when_enabled():
    with running("planted_noop_enable") as runner:
        verdict = _route(runner, "enabled")
        assert not verdict.ok and verdict.kind == "mismatch", verdict
        assert "looked for an event starting with 'planted_noop_enable::'" in verdict.message
        assert _route(runner, "disabled").ok


@pytest.mark.slow
def test_a_prefixless_module_is_judged_from_the_dispatcher():
    with running("planted_tm_correct") as runner:
        note = runner.hello("enabled").routing_note
        assert "declares no KERNEL_PREFIX and no ROUTES" in note and "dispatcher" in note
        assert _route(runner, "enabled").ok
        assert _route(runner, "disabled").ok


@pytest.mark.slow
def test_a_prefixless_module_leaking_into_the_disabled_state_is_caught():
    with running("planted_tm_leak") as runner:
        verdict = _route(runner, "disabled")
        assert not verdict.ok and "switch leak" in verdict.message, verdict
        assert "aten::mm [CPU] is registered from" in verdict.message
        assert str(PLANTED) in verdict.message


def _linear(bias: bool) -> Case:
    layouts = ("contiguous",) * (3 if bias else 2)
    return Case("linear", "F.linear", "float32", (3, 5, 4), layouts, "general", 0, {"bias": bias})


def _route_linear(runner: Runner, switch: str, bias: bool) -> properties.Verdict:
    hello = runner.hello(switch)
    assert hello.status == "ready", hello.message
    return properties.routing(runner.observe("routing", _linear(bias), switch), hello, "linear")


def test_dispatcher_evidence_needs_every_dispatched_path_op(monkeypatch: pytest.MonkeyPatch):
    """In-process, with the dispatcher's answers faked: enabled, every dispatched aten op on the
    op's paths must be the module's (one stock one is a False check); non-path ops are ignored;
    nothing on the path dispatched is no evidence; disabled, the whole path is looked at too."""
    from bi_props.targets.module import ModuleTarget

    monkeypatch.syspath_prepend(str(PLANTED))
    target = ModuleTarget("planted_linear_mm_only")
    target.check()
    own = {"aten::mm": True, "aten::addmm": False, "aten::matmul": None, "aten::linear": None}
    monkeypatch.setattr(target, "kernel_is_own", own.get)
    monkeypatch.setattr(target, "_root", lambda: "/lib")
    target._active = True
    assert target.dispatch_trace()
    assert target.evidence("linear", dispatched=("aten::t", "aten::addmm")) == {
        "aten::addmm [CPU] is registered from /lib": False
    }
    assert target.evidence("linear", dispatched=("aten::t", "aten::mm")) == {
        "aten::mm [CPU] is registered from /lib": True
    }
    assert target.evidence("linear", dispatched=("aten::t",)) == {}
    target._active = False
    assert target.evidence("linear", dispatched=("aten::t",)) == {
        "aten::addmm [CPU] is registered from /lib": False,
        "aten::mm [CPU] is registered from /lib": True,
    }


SAFE_SOFTMAX_DUMP = """name: aten::_safe_softmax
schema: aten::_safe_softmax(Tensor self, int dim, ScalarType? dtype=None) -> Tensor
Meta: registered at /torch/_meta_registrations.py:54 :: (Tensor _0, int _1) -> Tensor _0
CompositeExplicitAutograd[alias]: registered at /aten/RegisterCompositeExplicitAutograd_0.cpp:22573 :: (Tensor _0) -> Tensor _0 [ boxed unboxed ]
"""  # noqa: E501


def test_the_active_kernel_falls_back_to_the_explicit_composite():
    """A stock op with no CPU kernel of its own (aten::_safe_softmax, on sdpa's math path) still
    runs a stock kernel: the explicit composite one. It was read as "no kernel", so never
    checked; an implicit composite or a missing op still has none."""
    from bi_props.targets.dispatcher import parse_active_kernel, parse_dispatch_kernel

    assert parse_dispatch_kernel(SAFE_SOFTMAX_DUMP, "CPU") is None
    assert parse_active_kernel(SAFE_SOFTMAX_DUMP, "CPU") == (
        "CompositeExplicitAutograd",
        "/aten/RegisterCompositeExplicitAutograd_0.cpp:22573",
    )
    assert parse_active_kernel("", "CPU") is None
    own_cpu = (
        SAFE_SOFTMAX_DUMP + "CPU: registered at /lib/kernels.py:7 :: (Tensor _0) -> Tensor _0\n"
    )
    assert parse_active_kernel(own_cpu, "CPU") == ("CPU", "/lib/kernels.py:7")


def test_a_stock_explicit_composite_counts_as_not_the_modules(monkeypatch: pytest.MonkeyPatch):
    """With the real dispatcher: aten::_safe_softmax's kernel is stock (False), not unknown."""
    from bi_props.targets.module import ModuleTarget

    monkeypatch.syspath_prepend(str(PLANTED))
    target = ModuleTarget("planted_linear_mm_only")
    target.check()
    assert target.kernel_is_own("aten::_safe_softmax") is False
    assert target.kernel_is_own("aten::no_such_op") is None


def test_order_sensitive_ops_off_the_path_need_the_modules_kernel(
    monkeypatch: pytest.MonkeyPatch,
):
    """Evidence once came only from the aten ops listed for the op's family, so a
    module claiming rms_norm whose call reached a stock reduction off that list (aten::sum), or
    one claiming attention whose sdpa call ran stock _safe_softmax or the fused CPU flash kernel,
    passed on its one overridden op. Every order-sensitive op the call dispatched is checked;
    elementwise ones (pow, rsqrt, mul) and order-insensitive reductions (amax) are not."""
    from bi_props.targets.dispatcher import is_order_sensitive
    from bi_props.targets.module import ModuleTarget

    assert is_order_sensitive("aten::sum.dim_IntList") and not is_order_sensitive("aten::amax")
    monkeypatch.syspath_prepend(str(PLANTED))
    target = ModuleTarget("planted_linear_mm_only")
    target.check()
    own = {"aten::mean.dim": True, "aten::sum.dim_IntList": False, "aten::bmm": True}
    own |= {
        "aten::_safe_softmax": False,
        "aten::_scaled_dot_product_flash_attention_for_cpu": False,
    }
    monkeypatch.setattr(target, "kernel_is_own", own.get)
    monkeypatch.setattr(target, "_root", lambda: "/lib")
    target._active = True
    rms = ("aten::pow.Tensor_Scalar", "aten::mean.dim", "aten::rsqrt", "aten::mul.Tensor")
    assert target.evidence("rms_norm", dispatched=rms) == {
        "aten::mean.dim [CPU] is registered from /lib": True
    }
    reduced = ("aten::pow.Tensor_Scalar", "aten::sum.dim_IntList", "aten::amax", "aten::rsqrt")
    assert target.evidence("rms_norm", dispatched=reduced) == {
        "aten::sum.dim_IntList [CPU] is registered from /lib": False
    }
    math_path = ("aten::bmm", "aten::_safe_softmax", "aten::bmm")
    assert target.evidence("attention", dispatched=math_path) == {
        "aten::bmm [CPU] is registered from /lib": True,
        "aten::_safe_softmax [CPU] is registered from /lib": False,
    }
    fused = ("aten::_scaled_dot_product_flash_attention_for_cpu",)
    assert target.evidence("attention", dispatched=fused) == {
        "aten::_scaled_dot_product_flash_attention_for_cpu [CPU] is registered from /lib": False
    }


@pytest.mark.slow
def test_routing_is_judged_on_the_aten_ops_this_call_dispatched():
    """A module claiming linear that overrides only aten::mm passed routing on
    aten::mm alone; F.linear with a bias dispatches stock aten::addmm, a routing failure naming
    it. Without a bias the call reaches the module's aten::mm and passes; disabled, no leak."""
    with running("planted_linear_mm_only") as runner:
        verdict = _route_linear(runner, "enabled", bias=True)
        assert not verdict.ok and verdict.kind == "mismatch", verdict
        assert "aten::addmm [CPU]" in verdict.message, verdict.message
        assert "aten::mm [CPU]" not in verdict.message, verdict.message
        assert _route_linear(runner, "enabled", bias=False).ok
        assert _route_linear(runner, "disabled", bias=True).ok
        assert _route_linear(runner, "disabled", bias=False).ok


@pytest.mark.campaign
@pytest.mark.slow
def test_fuzz_reports_a_routing_failure_for_a_noop_enable(tmp_path: Path):
    """The issue's acceptance command: `bi-props fuzz --target <no-op module> --ops mm
    --budget 30` reports a routing failure for mm."""
    out = tmp_path / "out"
    command = [sys.executable, "-m", "bi_props.cli", "fuzz", "--target", "planted_noop_enable",
               "--ops", "mm", "--budget", "30", "--out", str(out), "--seed", "1"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=400)
    assert done.returncode == 1, done.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    routing = [f for f in report["findings"] if (f["property"], f["op"]) == ("routing", "mm")]
    assert [(f["switch"], f["kind"]) for f in routing] == [("enabled", "mismatch")], report[
        "findings"
    ]
    assert "no evidence that mm reached" in routing[0]["message"]
    assert routing[0]["reproduced_in_fresh_process"] is True


def test_a_single_file_module_in_site_packages_owns_only_its_own_file(tmp_path: Path) -> None:
    """A one-file library installed in site-packages shares that directory with every other
    library: only registrations from its own file may count as its kernels."""
    from bi_props.targets.module import registration_root

    shared = tmp_path / "lib" / "python3.11" / "site-packages"
    package = shared / "mykernels"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (shared / "onefile.py").write_text("")
    (tmp_path / "planted.py").write_text("")
    assert registration_root(str(shared / "onefile.py")) == os.path.realpath(shared / "onefile.py")
    assert registration_root(str(package / "__init__.py")) == os.path.realpath(package)
    assert registration_root(str(tmp_path / "planted.py")) == os.path.realpath(tmp_path)
    assert registration_root(None) is None
