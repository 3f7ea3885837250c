"""scripts/gpu_check.sh without a GPU or triton: syntax, arguments, the plan and its time budget,
``--check``, the part runner's hard limit (kills the part's group and the workers that left it
in sessions of their own) and the summary. The script runs end to end on CPU under Triton's
interpreter in the Triton lane (tests/triton_lane/lane_gpu_check.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "gpu_check.sh"
PARTS = REPO / "scripts" / "gpu_check_parts"


def _run(*args: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **env},
    )


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_syntax():
    proc = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_help_states_what_must_be_installed_and_the_parts():
    proc = _run("--help")
    assert proc.returncode == 0, proc.stderr
    words = (
        "OUT_DIR",
        "--wheels",
        "--check",
        "controls",
        "sglang",
        "vllm",
        "--interpret",
        "scenarios",
        "CUDA graphs",
    )
    for word in (*words, "numpy", "hypothesis", "pytest", "torch", "triton", "optional", "TF32"):
        assert word in proc.stdout, word


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "missing OUT_DIR"),
        (("out", "--bogus"), "unknown option '--bogus'"),
        (("out", "other"), "one OUT_DIR only"),
        (("out", "--wheels"), "--wheels needs a folder"),
        (("out", "--wheels", "/nonexistent/wheels"), "is not a folder"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(args, message):
    proc = _run(*args)
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert message in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_bad_variables_are_refused():
    proc = _run("out", "--plan", BI_PROPS_GPU_CHECK_INTERPRET="yes")
    assert proc.returncode == 2 and "must be 0 or 1" in proc.stderr, proc.stderr
    proc = _run("out", "--plan", BI_PROPS_GPU_CHECK_TOTAL_S="7m")
    assert proc.returncode == 2 and "whole number of seconds" in proc.stderr, proc.stderr


def _plan(tmp_path: Path, *args: str, **env: str) -> list[tuple[str, int, str]]:
    proc = _run(str(tmp_path / "out"), "--plan", *args, **env)
    assert proc.returncode == 0, proc.stderr
    rows = []
    for line in proc.stdout.splitlines()[1:]:
        part, _, rest = line.strip().partition(" ")
        limit = int(rest.split("limit ", 1)[1].split(" s:", 1)[0])
        rows.append((part, limit, rest))
    return rows


def test_gpu_plan_fits_eight_minutes_with_margin(tmp_path):
    rows = _plan(tmp_path, BI_PROPS_GPU_CHECK_INTERPRET="0")
    assert [r[0] for r in rows] == ["controls", "sglang", "vllm", "scenarios", "inductor"]
    grace = 5 + 1  # run_part.py: TERM, 5 s, KILL
    assert sum(limit + grace for _, limit, _ in rows) + 15 <= 450 < 480  # 15 s: --check, wheels
    for part, _, line in rows[:3]:
        assert f"{tmp_path}/out/{part}/report.json" in line, line
    controls, sglang, vllm = (r[2] for r in rows[:3])
    # stock controls need only torch: no SGLang, no vLLM, not the `cuda` profile's 300 examples
    assert "--bi-target gpu_check_stock" in controls and "test_batch_variance_control" in controls
    assert "gpu-check-controls.toml" in controls and "--hypothesis-profile" not in controls
    assert "gpu-check.toml" in sglang and "--bi-target sglang" in sglang
    assert "--bi-target vllm" in vllm
    # PyTorch's own switch: the inductor target, compiled cases only (its space), both states
    inductor = rows[4][2]
    assert "--bi-target inductor" in inductor and "gpu-check-inductor.toml" in inductor
    assert f"{tmp_path}/out/inductor/report.json" in inductor
    assert not (tmp_path / "out").exists(), "--plan must not create anything"


def test_scenarios_part_runs_the_engine_campaign_with_cuda_graphs(tmp_path):
    """The scenarios part: `bi-props scenarios` on vLLM's engine, states off and on only (the
    kernels state installs bi_props' CPU kernels), the CUDA space, searching a third of its limit
    and shrinking 10 s past it, so that two states' start-up fits the rest."""
    import shlex

    (part, limit, line), = [r for r in _plan(tmp_path, BI_PROPS_GPU_CHECK_INTERPRET="0")
                            if r[0] == "scenarios"]  # fmt: skip
    assert part == "scenarios" and "[vllm-engine]" in line
    words = shlex.split(line.split(" s: ", 1)[1])
    assert words[1:4] == ["-m", "bi_props.cli", "scenarios"], words
    option = {words[i]: words[i + 1] for i in range(4, len(words) - 1, 2)}
    assert option["--target"] == "vllm-engine" and option["--states"] == "off,on"
    assert option["--props"] == "alone,decode_vs_prefill"  # both twins run eagerly
    assert option["--space"] == str(REPO / "strategies" / "scenarios-cuda.toml")
    assert option["--out"] == f"{tmp_path}/out/scenarios/campaign"
    assert int(option["--budget"]) == limit // 3 and float(option["--shrink-s"]) == 10
    longer = _plan(tmp_path, BI_PROPS_GPU_CHECK_INTERPRET="0", BI_PROPS_GPU_CHECK_SCENARIOS_S="300")
    (_, limit, line), = [r for r in longer if r[0] == "scenarios"]  # fmt: skip
    assert "--budget 100 " in line and limit == 300


def test_cuda_scenario_space_turns_cuda_graphs_on_with_small_counts():
    from bi_props.model.space import load

    space = load(REPO / "strategies" / "scenarios-cuda.toml")
    scenarios = space.scenarios
    assert scenarios.cuda_graphs and scenarios.cuda_graph_sizes == (1, 4)
    assert scenarios.cuda_graph_mode == "FULL_DECODE_ONLY"  # full graphs: no torch.compile
    assert space.max_examples <= 10 and space.database == "none" and space.derandomize
    assert len(scenarios.chunk_budgets) == len(scenarios.kv_blocks) == 1
    assert len(scenarios.max_num_seqs) == 1


def test_total_cap_is_stated_in_the_plan(tmp_path):
    proc = _run(str(tmp_path), "--plan", BI_PROPS_GPU_CHECK_INTERPRET="0")
    assert "at most 450 s in all" in proc.stdout, proc.stdout


def test_interpret_plan_uses_the_tiny_space_and_a_planted_hang_first(tmp_path):
    rows = _plan(tmp_path, "--interpret", BI_PROPS_GPU_CHECK_PLANT_HANG="20")
    assert [r[0] for r in rows] == ["hang", "controls", "sglang", "vllm", "scenarios", "inductor"]
    assert rows[0][1] == 20 and "--bi-target planted_hang" in rows[0][2]
    assert "hang_case.toml" in rows[0][2]
    assert all("gpu-check-interpret.toml" in r[2] for r in rows[:4])


def test_spaces_fit_their_parts():
    from bi_props.model.space import load

    for name, part_s in (("gpu-check-controls", 65), ("gpu-check", 95), ("gpu-check-inductor", 55)):
        space = load(REPO / "strategies" / f"{name}.toml")
        assert space.start_timeout_s < part_s and space.example_timeout_s < part_s, name
        assert space.database == "none" and space.derandomize, name
    controls = load(REPO / "strategies" / "gpu-check-controls.toml")
    assert controls.control_examples <= 50 and controls.rows.max <= 1024
    space = load(REPO / "strategies" / "gpu-check.toml")
    assert {"bmm", "rms_norm", "mean", "log_softmax"} <= set(space.ops)
    assert space.dim.max > 128 and space.dim_for("log_softmax").max > 1024
    inductor = load(REPO / "strategies" / "gpu-check-inductor.toml")
    assert inductor.target == "inductor" and inductor.modes == ("compiled",)


def test_check_lists_what_a_gpu_machine_must_have():
    t0 = time.monotonic()
    proc = _run("--check", BI_PROPS_GPU_CHECK_INTERPRET="0")
    seconds = time.monotonic() - t0
    assert seconds < 45, seconds
    names = [ln.split()[1] for ln in proc.stdout.splitlines()[1:-1]]
    for name in ("python", "numpy", "hypothesis", "pytest", "torch", "torch-cuda", "triton",
                 "triton-driver", "bi_props", "sglang", "vllm", "vllm-cuda",
                 "inductor-switch"):  # fmt: skip
        assert name in names, (name, proc.stdout)
    for optional in ("vllm", "vllm-cuda"):
        line = next(ln for ln in proc.stdout.splitlines() if ln.split()[1:2] == [optional])
        assert line.split()[0] in ("ok", "optional"), line  # never a reason to fail
    if "MISSING" in proc.stdout:  # e.g. this machine: no CUDA
        assert proc.returncode == 2 and proc.stdout.splitlines()[-1].startswith("MISSING: ")
    else:
        assert proc.returncode == 0


def _runner(tmp_path: Path, limit: float, code: str) -> tuple[subprocess.CompletedProcess, dict]:
    part = tmp_path / "part"
    proc = subprocess.run(
        [sys.executable, str(PARTS / "run_part.py"), str(part), str(limit), "--",
         sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    return proc, json.loads((part / "part.json").read_text())


HANGS_WITH_A_WORKER = """
    import os, subprocess, sys, time
    # like bi_props' controller: the worker in a session of its own, out of timeout's reach
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                             start_new_session=True)
    open("pids", "w").write(f"{os.getpid()} {child.pid}")
    print("TMPDIR", os.environ["TMPDIR"], "HYP", os.environ["HYPOTHESIS_STORAGE_DIRECTORY"],
          flush=True)
    time.sleep(600)
"""


def test_a_hanging_part_is_killed_with_the_workers_it_started(tmp_path):
    proc, record = _runner(tmp_path, 3, HANGS_WITH_A_WORKER)
    assert proc.returncode == 124 and record["timed_out"] is True, (proc, record)
    leader, child = (int(p) for p in (tmp_path / "part" / "pids").read_text().split())
    assert child in record["killed"] and leader in record["killed"], record
    assert record["survivors"] == []
    time.sleep(0.5)
    assert not _alive(child) and not _alive(leader)
    log = (tmp_path / "part" / "log").read_text()
    assert f"TMPDIR {tmp_path / 'part' / 'tmp'}" in log  # worker logs stay in the part's folder
    assert f"HYP {tmp_path / 'part' / 'hypothesis'}" in log
    assert "part cut after 3 s" in log


def test_a_part_that_ends_keeps_its_exit_code_and_leaves_nothing(tmp_path):
    proc, record = _runner(tmp_path, 60, "import sys; sys.exit(1)")
    assert proc.returncode == 1 and record["exit"] == 1 and record["timed_out"] is False
    assert record["killed"] == [] and record["survivors"] == []


def test_workers_left_behind_by_a_part_that_ended_are_killed(tmp_path):
    code = """
        import subprocess, sys
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                                 start_new_session=True)
        open("pids", "w").write(str(child.pid))
    """
    proc, record = _runner(tmp_path, 60, code)
    child = int((tmp_path / "part" / "pids").read_text())
    assert proc.returncode == 0 and child in record["killed"] and record["survivors"] == []
    time.sleep(0.5)
    assert not _alive(child)


def _write_part(out: Path, part: str, record: dict | None = None, report: dict | None = None,
                log: str = "", missing: str | None = None) -> None:  # fmt: skip
    folder = out / part
    folder.mkdir(parents=True)
    if missing is not None:
        (folder / "missing").write_text(missing)
    if record is not None:
        base = {"limit_s": 100, "seconds": 10, "exit": 0, "timed_out": False, "killed": [],
                "survivors": []}  # fmt: skip
        (folder / "part.json").write_text(json.dumps({**base, **record}))
    if report is not None:
        (folder / "report.json").write_text(json.dumps(report))
    (folder / "log").write_text(log)


def _summarize(out: Path, *parts: str) -> tuple[int, str]:
    proc = subprocess.run(
        [sys.executable, str(PARTS / "summarize.py"), str(out), "42", "0", *parts],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert (out / "summary.md").read_text().strip() == proc.stdout.strip()
    return proc.returncode, proc.stdout


def test_summary_of_a_cut_part_says_what_it_finished_and_where_it_was(tmp_path):
    log = (
        "x.py::test_property[mm-batch_invariance-enabled] PASSED [ 10%]\n"
        "x.py::test_property[mm-reference-enabled] FAILED [ 20%]\n"
        "x.py::test_property[bmm-batch_invariance-enabled] \n"
    )
    _write_part(tmp_path, "sglang", {"exit": 124, "timed_out": True, "killed": [7, 8]}, log=log)
    _write_part(tmp_path, "controls", {"exit": 0}, {"examples": 40, "findings": [],
                "controls": [{"op": "mm", "variance_seen": True}]})  # fmt: skip
    _write_part(tmp_path, "vllm", missing="optional: vllm: not importable")
    code, text = _summarize(tmp_path, "controls", "sglang", "vllm")
    assert code == 2, text
    assert "| controls | ran, passed | 0 | 10 of 100 | 40 | 0 | mm |" in text
    assert "| sglang | CUT after 100 s |" in text
    assert (
        "2 tests finished (1 passed), running: test_property[bmm-batch_invariance-enabled]" in text
    )
    assert "FAILED: test_property[mm-reference-enabled]" in text
    assert "killed (group and workers): [7, 8]" in text
    assert "| vllm | SKIPPED (optional): vllm: not importable |" in text


def test_summary_status_findings_survivors_and_missing(tmp_path):
    _write_part(tmp_path, "controls", {"exit": 0}, {"examples": 3, "findings": [], "controls": []})
    _write_part(tmp_path, "sglang", {"exit": 1}, {"examples": 3, "controls": [], "findings": [
        {"op": "addmm", "property": "reference", "switch": "enabled", "kind": "error",
         "message": "AssertionError: bias\nmore"}]})  # fmt: skip
    assert _summarize(tmp_path, "controls", "sglang")[0] == 1
    _write_part(tmp_path, "hang", {"exit": 124, "timed_out": True})
    code, text = _summarize(tmp_path, "hang", "controls", "sglang")
    assert code == 1 and "cut as planted" in text, text  # the planted hang is expected
    assert "finding: addmm reference [enabled] error: AssertionError: bias" in text
    _write_part(tmp_path, "vllm", {"exit": 0, "survivors": [99]}, {"examples": 1, "findings": []})
    code, text = _summarize(tmp_path, "controls", "vllm")
    assert code == 2 and "SURVIVING PROCESSES [99]" in text
    _write_part(tmp_path, "other", missing="sglang: not importable")
    assert _summarize(tmp_path, "controls", "other")[0] == 2


def test_missing_for_scenarios_says_it_needs_vllm_on_cuda(tmp_path):
    """Under --interpret the scenarios part is always skipped (optional): vLLM on CUDA only."""
    check = tmp_path / "check.json"
    subprocess.run([sys.executable, str(PARTS / "check_env.py"), "--interpret", "--json",
                    str(check)], capture_output=True, text=True, timeout=120)  # fmt: skip
    why = subprocess.run(
        [sys.executable, str(PARTS / "check_env.py"), "--missing-for", "scenarios", str(check)],
        capture_output=True, text=True, timeout=60,
    ).stdout.strip()  # fmt: skip
    assert why.startswith("optional: ") and "vllm-cuda: " in why, why
    assert "interpret mode (CPU): CUDA graphs need vLLM on CUDA" in why, why
    assert "needs vLLM on CUDA" in why and "torch-cuda" not in why  # skipped under --interpret


def test_summary_of_the_scenarios_part_counts_scenarios_and_names_features(tmp_path):
    campaign = {
        "findings": [{"state": "off", "prop": "alone", "kind": "mismatch",
                      "message": "the needle: logprob of generated token 1 differs\nmore",
                      "features": ["CUDA graphs (FULL_DECODE_ONLY, capture sizes 4)"]}],
        "verdicts": [{"state": "off", "prop": "alone", "judged": 7, "verdict": "FAILED"},
                     {"state": "off", "prop": "chunked", "judged": 3, "verdict": "held"},
                     {"state": "on", "prop": "alone", "judged": 0, "verdict": "state broken"}],
        "states": [{"state": "off"}, {"state": "on", "broken": "RuntimeError: no\nmore"}],
    }  # fmt: skip
    _write_part(tmp_path, "scenarios", {"exit": 1, "seconds": 99, "limit_s": 130})
    (tmp_path / "scenarios" / "campaign").mkdir()
    (tmp_path / "scenarios" / "campaign" / "report.json").write_text(json.dumps(campaign))
    code, text = _summarize(tmp_path, "scenarios")
    assert code == 1, text
    assert "| scenarios | ran, findings | 1 | 99 of 130 | 10 scenarios | 1 | - | - |" in text
    assert "state off: 10 scenarios judged; held: chunked" in text
    assert (
        "state on: 0 scenarios judged; held: none; BROKEN at its first forward: RuntimeError"
        in text
    )
    assert (
        "finding: off / alone mismatch: the needle: logprob of generated token 1 differs "
        "[features on: CUDA graphs (FULL_DECODE_ONLY, capture sizes 4)]" in text
    )
    _write_part(tmp_path, "bad", {"exit": 2})  # e.g. the CPU refusal: a usage error
    (tmp_path / "scenarios" / "part.json").write_text(json.dumps(
        {"limit_s": 130, "seconds": 6, "exit": 2, "timed_out": False, "killed": [],
         "survivors": []}))  # fmt: skip
    code, text = _summarize(tmp_path, "scenarios")
    assert code == 2 and "| scenarios | FAILED to run (exit 2; see scenarios/log)" in text, text


def test_largest_shapes_per_op_from_examples(tmp_path):
    sys.path.insert(0, str(PARTS))
    from summarize import largest_shapes

    lines = [
        {"op": "mm", "shape": [3, 200, 17], "batch_rows": 70},
        {"op": "mm", "shape": [9, 20, 300], "batch_rows": None},
        {"op": "bmm", "shape": [2, 5, 140, 130]},
    ]
    path = tmp_path / "examples.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines) + "not json\n")
    assert largest_shapes(path) == {
        "mm": {"M": 9, "K": 200, "N": 300, "batch_rows": 70},
        "bmm": {"B": 2, "M": 5, "K": 140, "N": 130},
    }


def test_sglang_declares_tf32_for_its_tl_dot_ops_on_a_gpu_only(monkeypatch):
    """SGLang calls tl.dot without input_precision: fp32 is TF32 on NVIDIA. The target declares
    the looser precision there (so `reference` judges TF32 honestly), not under the interpreter."""
    import types

    from bi_props.targets.sglang import TF32_DECLARED, TF32_OPS, SglangTarget

    target = SglangTarget()
    target.module = types.SimpleNamespace(
        is_batch_invariant_mode_enabled=lambda: True, __file__="/nonexistent/bio.py"
    )
    monkeypatch.delenv("TRITON_F32_DEFAULT", raising=False)
    target.device = "cuda"
    assert {op: target.precision(op) for op in TF32_OPS} == dict.fromkeys(TF32_OPS, TF32_DECLARED)
    assert target.precision("log_softmax") == "float32"
    assert "TF32" in target.environment()["sglang_tl_dot_precision"]
    monkeypatch.setenv("TRITON_F32_DEFAULT", "ieee")
    assert target.precision("mm") == "float32"
    monkeypatch.delenv("TRITON_F32_DEFAULT")
    target.device = "cpu"  # the interpreter: tl.dot is fp32
    assert target.precision("mm") == "float32"
    target.module.is_batch_invariant_mode_enabled = lambda: False
    target.device = "cuda"
    assert target.precision("mm") != TF32_DECLARED  # switch off: stock cuBLAS' declaration
