"""``bi-props model SPEC``: a user's transformers model, asked the model-level question (a
sequence's logprob vectors alone == inside a padded batch, bitwise) under a target's switch.

The unit tests need no transformers; the campaigns (marker ``campaign``) run a built-in small
Llama and a Qwen-MoE-like model with random weights, offline, on the ``cpu`` target in both
switch states."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from bi_props.cli import main
from bi_props.execution.hf_model import (
    BUILTIN_CONFIGS,
    ModelSpecError,
    _scaled,
    config_dict,
    vocab_size,
)
from bi_props.model.space import SpaceError, load_profile, parse


def test_specs_name_a_builtin_a_config_json_or_a_directory(tmp_path: Path) -> None:
    assert {"llama", "qwen2", "mistral", "qwen2_moe"} <= set(BUILTIN_CONFIGS)
    assert vocab_size("llama") == 512
    config = {"model_type": "llama", "vocab_size": 1000, "hidden_size": 32}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert config_dict(str(tmp_path))["vocab_size"] == 1000  # a model directory
    assert vocab_size(str(tmp_path / "config.json")) == 1000
    with pytest.raises(ModelSpecError, match="not a built-in configuration"):
        config_dict(str(tmp_path / "missing.json"))
    (tmp_path / "bad.json").write_text(json.dumps({"vocab_size": 3}))
    with pytest.raises(ModelSpecError, match="no 'model_type'"):
        config_dict(str(tmp_path / "bad.json"))


def test_layers_and_hidden_cut_the_configuration_keeping_the_head_size() -> None:
    cut = _scaled(BUILTIN_CONFIGS["llama"], 1, 32)
    assert cut["num_hidden_layers"] == 1 and cut["hidden_size"] == 32
    assert cut["head_dim"] == 16 and cut["num_attention_heads"] == 2  # 64 / 4 heads = 16
    assert cut["num_attention_heads"] % cut["num_key_value_heads"] == 0
    assert _scaled(BUILTIN_CONFIGS["llama"], None, None) == BUILTIN_CONFIGS["llama"]


def _parse(text: str):
    return parse(tomllib.loads(text), "t.toml", "t")


def test_a_space_names_its_model_and_asks_its_question() -> None:
    space = _parse('[model]\nspec = "llama"\nlayers = 1\nattention = "eager"\n')
    assert (space.model_spec, space.model_layers, space.model_attention) == ("llama", 1, "eager")
    assert space.asked_ops == ("hf_model",)
    assert load_profile("cpu").asked_ops == ()  # no model: hf_model is opt-in, never default
    assert "hf_model" not in load_profile("cpu").ops
    with pytest.raises(SpaceError, match=r"model\.attention"):
        _parse('[model]\nspec = "llama"\nattention = "flash"\n')


def test_an_architecture_transformers_does_not_know_is_one_message(capsys, tmp_path) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "no_such_arch", "vocab_size": 8}))
    assert main(["model", str(config), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "model_type 'no_such_arch' is not one this transformers knows" in err, err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["model", "no-such-model"], "not a built-in configuration"),
        (["model", "llama", "--layers", "0"], "--layers 0"),
        (["model", "llama", "--ops", "mm"], "bi-props model runs its model"),
    ],
)
def test_bad_input_is_one_message_and_exit_2(argv, message, capsys, tmp_path) -> None:
    assert main([*argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("error:") == 1, err


def _model(spec: str, out: Path, *extra: str) -> tuple[int, str, dict]:
    # transformers is in the dev extra: without it the command exits 2 with that message
    command = [sys.executable, "-m", "bi_props.cli", "model", spec, "--target", "cpu"]
    command += ["--out", str(out), *extra]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    report = json.loads((out / "report.json").read_text())
    return proc.returncode, proc.stdout + proc.stderr, report


def _judged(report: dict, prop: str, switch: str) -> int:
    return sum(
        c["examples"]
        for c in report["cells"]
        if (c["op"], c["property"], c["switch"]) == ("hf_model", prop, switch)
    )


@pytest.mark.campaign
def test_a_llama_with_eager_attention_is_batch_invariant_under_the_cpu_switch(tmp_path) -> None:
    """With eager attention the model's ops are the cpu target's (mm, softmax, mean...): its
    logprobs hold with the switch on; with it off the negative control sees the variance."""
    code, log, report = _model("llama", tmp_path, "--attention", "eager", "--budget", "45")
    assert code == 0, log[-3000:]
    assert not report["findings"], report["findings"]
    assert _judged(report, "logprobs", "enabled") >= 1, report["cells"]
    control = next(c for c in report["controls"] if c["property"] == "logprobs")
    assert control["variance_seen"], control


@pytest.mark.campaign
def test_a_moe_model_is_batch_variant_under_the_cpu_switch_and_says_where(tmp_path) -> None:
    """transformers' MoE routes tokens to experts through ops the cpu target does not claim
    (a grouped GEMM whose groups are the batch's tokens per expert; SDPA by default): with the
    switch on a sequence's logprobs still depend on its batch, a failure of the model (exit 1),
    whose message names the ops outside the target's claim."""
    code, log, report = _model("qwen2_moe", tmp_path, "--budget", "60", "--max-findings", "1")
    assert code == 1, log[-3000:]
    found = [f for f in report["findings"] if f["op"] == "hf_model"]
    assert found, report["findings"]
    assert (found[0]["property"], found[0]["switch"]) == ("logprobs", "enabled"), found[0]
    assert "other aten ops the model used" in found[0]["message"], found[0]["message"]
    assert "'spec': 'qwen2_moe'" in found[0]["case"], found[0]["case"]
