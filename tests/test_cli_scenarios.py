"""``bi-props scenarios``: its bad-input messages, its report (verdicts per state and property,
findings with shrunk scenario, features and timeline, the timeline picture) and its reproducers,
end to end on the fake engine (tests/scenario_fake.py; vLLM's engine runs in the vLLM lane)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bi_props.campaigns.scenario_campaign import findings, verdicts
from bi_props.campaigns.scenarios import search
from bi_props.cli import main
from bi_props.model.scenario import ScenarioSpace
from bi_props.reporting.scenario_report import render_markdown, timeline_svg

TESTS = Path(__file__).parent
SPACE = TESTS / "vllm_lane" / "scenarios.toml"


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), env.get("PYTHONPATH")]))
    return env


def _cli(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "bi_props.cli", "scenarios", *args]
    return subprocess.run(
        command, env=_env(), capture_output=True, text=True, timeout=timeout, check=False
    )


# ---------------------------------------------------------------------------------------------
# Bad input: exit 2 with one line saying what is wrong


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--budget", "0"], "--budget 0.0: must be a positive"),
        (["--budget", "nan"], "must be a positive, finite"),
        (["--examples", "0"], "--examples 0: must be at least 1"),
        (["--shrink-s", "-1"], "--shrink-s -1.0: must be a finite number of seconds >= 0"),
        (["--props", "alone,sideways"], "--props: unknown ['sideways']; choose from ['alone'"),
        (["--props", ","], "--props: unknown []"),
        (["--states", "off,sideways"], "--states: unknown ['sideways']"),
        (["--states", "off,off"], "a state is named twice"),
        (["--target", "no_such_module_xyz:f"], "No module named 'no_such_module_xyz'"),
        (["--target", "scenario_fake"], "expected vllm-engine or module:factory"),
        (["--target", "scenario_fake:nothing"], "has no 'nothing'"),
    ],
)
def test_bad_input_is_a_usage_error(args, message, capsys, monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(TESTS))
    code = main(["scenarios", "--target", "scenario_fake:factory", *args, "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert message in err, err
    assert not (tmp_path / "report.json").exists()


def test_bad_space_file_and_bad_out_are_usage_errors(capsys, monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(TESTS))
    bad = tmp_path / "bad.toml"
    bad.write_text("[scenarios]\nmax_requests = 0\n")
    base = ["scenarios", "--target", "scenario_fake:factory"]
    assert main([*base, "--space", str(bad), "--out", str(tmp_path / "o")]) == 2
    assert "bad strategies file" in capsys.readouterr().err
    afile = tmp_path / "file"
    afile.write_text("")
    assert main([*base, "--out", str(afile)]) == 2
    assert "exists and is not a directory" in capsys.readouterr().err


def test_vllm_engine_without_vllm_says_so(capsys, tmp_path):
    pytest.importorskip("hypothesis")
    import importlib.util

    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed here: the lane runs this target")
    assert main(["scenarios", "--out", str(tmp_path)]) == 2
    assert "--target vllm-engine needs vLLM in this interpreter" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------
# Pieces


def test_search_deadline_skips_instead_of_replaying():
    from scenario_fake import FakeEngine

    engine = FakeEngine()
    result = search("alone", engine, ScenarioSpace(), 20, deadline=time.perf_counter() - 1)
    assert engine.replays == 0 and result.examples == 0
    assert result.skipped > 0 and result.finding is None


def test_search_shrinks_past_its_deadline_once_it_found_a_failure(monkeypatch):
    """The deadline stops generation, not a shrink in progress (``shrink_s`` more): a failure
    found just before the deadline still comes out as shrunk as without a deadline; with no
    shrink time it stays as drawn. The search's clock jumps past the deadline at the first
    failing replay (a clock of the test's, not the machine's: the same on a loaded machine)."""
    from types import SimpleNamespace

    from bi_props.campaigns import scenarios
    from scenario_fake import planted_factory

    unbounded = search("alone", planted_factory("off"), ScenarioSpace(), 200).finding
    assert unbounded is not None

    def run(shrink_s: float):
        jump = [0.0]
        judge = scenarios._fails

        def fails_then_late(prop, scenario, replay):
            verdict, error = judge(prop, scenario, replay)
            if not jump[0] and (error is not None or (verdict is not None and not verdict.held)):
                jump[0] = 1000.0  # the deadline passes at the first failure, not before
            return verdict, error

        clock = SimpleNamespace(perf_counter=lambda: time.perf_counter() + jump[0])
        monkeypatch.setattr(scenarios, "time", clock)
        monkeypatch.setattr(scenarios, "_fails", fails_then_late)
        deadline = time.perf_counter() + 500
        return search("alone", planted_factory("off"), ScenarioSpace(), 200,
                      deadline=deadline, shrink_s=shrink_s)  # fmt: skip

    shrunk = run(shrink_s=600)
    assert shrunk.finding is not None and shrunk.finding.scenario == unbounded.scenario
    cut = run(shrink_s=0)
    assert cut.finding is not None and cut.skipped > 0
    assert len(cut.finding.scenario) > len(unbounded.scenario)  # not shrunk


def _state(name, searches, **extra):
    return {"state": name, "searches": searches, **extra}


def _search(prop, finding=None, examples=5, space="greedy"):
    return {
        "pass": space,
        "prop": prop,
        "examples": examples,
        "not_applicable": 1,
        "skipped": 0,
        "replays": 9,
        "seconds": 0.1,
        "finding": finding,
    }


def test_verdicts_and_findings_per_state_and_property():
    mismatch = {"prop": "alone", "kind": "mismatch", "message": "m", "scenario": "S"}
    states = [
        _state(
            "off",
            [
                _search("alone", mismatch, space="full"),
                _search("alone", mismatch),
                _search("chunked", examples=0),
                _search("prefix_cache"),
            ],
        ),
        _state("on", [], broken="RuntimeError: no forward"),
    ]
    rows = {(r["state"], r["prop"]): r for r in verdicts(states)}
    assert rows["off", "alone"]["verdict"] == "FAILED" and rows["off", "alone"]["judged"] == 10
    assert rows["off", "chunked"]["verdict"] == "not judged"
    assert rows["off", "prefix_cache"]["verdict"] == "held"
    assert rows["off", "preemption"]["verdict"] == "not judged"  # never searched
    assert rows["on", "alone"]["verdict"] == "state broken"
    found = findings(states, "t")
    assert [(f["state"], f["prop"], f["kind"]) for f in found] == [
        ("off", "alone", "mismatch"),
        ("on", "(first forward)", "state broken"),
    ]
    assert found[0]["pass"] == "full" and found[0]["also_failed_in"] == ["greedy"]


def test_timeline_picture_draws_each_step_phase_and_marks():
    data = {
        "steps": [
            [[0, "prefill", 16], [1, "prefill", 32]],
            [[0, "prefill", 14], [1, "decode", 1]],
            [[0, "decode", 1], [1, "recompute", 33]],
        ],
        "cached": {"1": 32},
        "preempted": {"1": 1},
    }
    svg = timeline_svg(data, "the scenario")
    assert svg.startswith("<svg") and svg.endswith("</svg>")
    assert svg.count('<rect class="prefill"') == 3
    assert svg.count('<rect class="decode"') == 2
    assert svg.count('<rect class="recompute"') == 1
    assert ">P16<" in svg and ">P14<" in svg  # the chunk boundary: 16 then 14 tokens
    assert "r1 (cache hit 32, preempted 1x)" in svg
    assert "step 2" in svg and "step 3" not in svg


# ---------------------------------------------------------------------------------------------
# End to end on the fake engine


@pytest.fixture(scope="module")
def planted_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("planted")
    target = "scenario_fake:planted_factory"
    proc = _cli("--target", target, "--states", "off,on", "--space", str(SPACE),
                "--examples", "40", "--budget", "120", "--out", str(out))  # fmt: skip
    return proc, out


def test_planted_bug_report(planted_run):
    proc, out = planted_run
    assert proc.returncode == 1, proc.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert [s["state"] for s in report["states"]] == ["off", "on"]
    assert report["states"][0]["facts"]["VLLM_BATCH_INVARIANT"] == "None"
    assert "first forward failed" in report["states"][1]["broken"]
    rows = {(r["state"], r["prop"]): r["verdict"] for r in report["verdicts"]}
    assert rows["off", "prefix_cache"] == "FAILED" and rows["on", "prefix_cache"] == "state broken"
    assert rows["off", "chunked"] == "held"  # the planted bug needs a cache hit
    by = {(f["state"], f["prop"]): f for f in report["findings"]}
    assert by["on", "(first forward)"]["kind"] == "state broken"
    hit = by["off", "prefix_cache"]
    assert hit["requests"] <= 3 and "prefix caching" in hit["features"]
    assert "prefix-cache hits (tokens): r" in hit["timeline"]
    assert hit["steps"]["cached"] and hit["steps"]["steps"]
    assert report["states"][0]["train_rollout"]["measured"] is False  # the wrapper has no view
    md = (out / "report.md").read_text()
    assert md == render_markdown(report)
    for section in ("## States", "## Verdicts: property x state", "## Findings", "## Searches"):
        assert section in md
    assert hit["scenario"] in md and "Timeline (the scenario):" in md
    html = (out / "report.html").read_text()
    assert '<svg xmlns="http://www.w3.org/2000/svg" class="timeline"' in html
    assert 'class="prefill"' in html


def test_planted_reproducer_runs_and_prints_the_diverging_token(planted_run):
    _, out = planted_run
    report = json.loads((out / "report.json").read_text())
    hit = next(f for f in report["findings"] if f["prop"] == "prefix_cache")
    script = out / hit["repro"]
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "REPRODUCES: the needle: logprob of generated token 0" in proc.stdout
    assert "prefix-cache hits (tokens)" in proc.stdout
    assert not any("repro" in f for f in report["findings"] if f["kind"] == "state broken")


def test_clean_engine_in_off_and_kernels_states(tmp_path):
    """The fake is invariant: no finding, every property judged in both states; the kernels
    state really installed bi_props' kernels and set VLLM_CPU_ATTN_SPLIT_KV=0 in its worker."""
    proc = _cli("--target", "scenario_fake:factory", "--states", "off,kernels", "--examples",
                "8", "--budget", "120", "--shrink-s", "7", "--out", str(tmp_path))  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["shrink_s"] == 7.0  # and each state's worker was asked for it:
    request = json.loads((tmp_path / "states" / "state-kernels.request.json").read_text())
    assert request["shrink_s"] == 7.0 and "plan" not in request  # every search: the default
    assert report["findings"] == [] and not list((tmp_path / "repro").iterdir())
    facts = {s["state"]: s["facts"] for s in report["states"]}
    assert facts["kernels"]["bi_props kernels installed"] == "bi_props_cpu"
    assert facts["kernels"]["VLLM_CPU_ATTN_SPLIT_KV"] == "0"
    assert facts["off"]["bi_props kernels installed"] == "no"
    held = [r for r in report["verdicts"] if r["verdict"] == "held"]
    assert {r["prop"] for r in held} == {
        "alone",
        "prefix_cache",
        "chunked",
        "preemption",
        "decode_vs_prefill",
    }
    assert all(r["verdict"] == "held" for r in report["verdicts"]), report["verdicts"]
    for state in report["states"]:  # the fake's trainer view is its own hash: bitwise equal
        tr = state["train_rollout"]
        assert tr["measured"] and len(tr["rows"]) == 8, tr
        assert all(r["bitwise"] and r["max_abs_delta"] == 0 for r in tr["rows"]), tr
    md = (tmp_path / "report.md").read_text()
    assert "- off: 8 of 8 needles bitwise equal; max |delta logprob| 0" in md


def test_train_rollout_agreement_is_bitwise_and_names_the_first_divergence():
    from bi_props.model.scenario_judge import float_bits, train_rollout

    values = [-1.5, -0.25, -3.0]
    bits = tuple(float_bits(v) for v in values)
    same = train_rollout((7, 8, 9), bits, values)
    assert same == {"tokens": 3, "bitwise": True, "max_abs_delta": 0.0, "first_diverging": None}
    off = train_rollout((7, 8, 9), bits, [-1.5, -0.25000003, -3.5])
    assert not off["bitwise"] and off["max_abs_delta"] == 0.5
    assert off["first_diverging"]["index"] == 1 and off["first_diverging"]["token"] == 8
    with pytest.raises(ValueError, match="2 trainer logprobs for 3 tokens"):
        train_rollout((7, 8, 9), bits, values[:2])


def test_props_narrows_the_searches_to_those_properties(tmp_path):
    """--props alone: each state runs only the plan's searches of `alone` (the GPU check's
    scenarios part uses it: fewer searches, each a larger share); the other properties are
    reported not judged, never held."""
    from bi_props.campaigns.scenario_worker import PLAN

    proc = _cli("--target", "scenario_fake:factory", "--states", "off", "--examples", "5",
                "--budget", "60", "--props", "alone", "--out", str(tmp_path))  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["props"] == ["alone"]
    searches = report["states"][0]["searches"]
    assert [(s["pass"], s["prop"]) for s in searches] == [p for p in PLAN if p[1] == "alone"]
    rows = {r["prop"]: r["verdict"] for r in report["verdicts"]}
    assert rows.pop("alone") == "held" and set(rows.values()) == {"not judged"}, rows
