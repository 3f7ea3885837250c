"""Campaigns: seeds per round, findings that survive SIGKILL, resume, the example database
replaying past failures first, one finding per signature, SIGTERM, several targets.

The end-to-end tests run ``bi-props fuzz`` in subprocesses against a planted third-party target
written into the test's tmp directory: an ``mm`` with two distinct bugs (a wrong result when K is
odd; batch variance when the call has 64 rows or more).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from bi_props.campaigns.campaign import (
    FindingsLog,
    Ledger,
    derive_seed,
    done_outcome,
    finding_from_dict,
    live_outcome,
    round_seed,
    turn_seed,
)
from bi_props.campaigns.fuzz import database_key
from bi_props.campaigns.records import Finding
from bi_props.model.space import load

PLANTED = "bi_campaign_planted"
PLANTED_SOURCE = textwrap.dedent(
    '''
    """Planted library for the campaign tests: mm with two distinct bugs."""
    import warnings

    import torch

    NAMESPACE = "bi_campaign_planted"
    OPS = ["mm"]
    KERNEL_PREFIX = NAMESPACE + "::"
    ROUTES = {"mm": (NAMESPACE + "::mm",)}
    THRESHOLD = 64
    _LIBRARIES = []


    def _sum(a, b, columns, dtype, reverse):
        acc = torch.zeros((a.shape[0], b.shape[1]), dtype=dtype)
        a2, b2 = a.to(dtype), b.to(dtype)
        order = range(columns)
        for i in (reversed(order) if reverse else order):
            acc += a2[:, i : i + 1] * b2[i : i + 1, :]
        return acc


    def mm(a, b):
        torch._check(a.dim() == 2 and b.dim() == 2, lambda: "mm: both operands must be matrices")
        torch._check(
            a.shape[1] == b.shape[0],
            lambda: f"mat1 and mat2 shapes cannot be multiplied ({a.shape[0]}x{a.shape[1]} and "
            f"{b.shape[0]}x{b.shape[1]})",
        )
        torch._check(
            a.dtype == b.dtype,
            lambda: f"expected m1 and m2 to have the same dtype, but got: {a.dtype} != {b.dtype}",
        )
        k = a.shape[1]
        if a.shape[0] >= THRESHOLD:  # BUG 1: the algorithm depends on the batch's size
            return _sum(a, b, k, torch.float32, True).to(a.dtype)
        return _sum(a, b, k - k % 2, torch.float64, False).to(a.dtype)  # BUG 2: odd K loses one


    def enable(enabled):
        if not enabled:
            return
        defs = torch.library.Library(NAMESPACE, "DEF")
        defs.define("mm(Tensor self, Tensor mat2) -> Tensor")
        defs.impl("mm", mm, "CPU")
        aten = torch.library.Library("aten", "IMPL")
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="(?s).*previously registered kernel")
            aten.impl("mm", lambda self, mat2: torch.ops.bi_campaign_planted.mm(self, mat2), "CPU")
        _LIBRARIES.extend((defs, aten))
    '''
)
STRATEGIES = textwrap.dedent(
    """
    [profile]
    description = "campaign tests: mm, small shapes, float32"
    target = "cpu"

    [hypothesis]
    max_examples = 10
    database = "directory"

    [runner]
    control_examples = 10
    example_timeout_s = 60

    [ops]
    include = ["mm"]

    [dtypes]
    choices = ["float32"]

    [shapes]
    rows = { min = 1, max = 80 }
    dim = { min = 0, max = 12 }
    boundaries = [16, 64]

    [batch]
    max_companions = 3
    companion_rows = { min = 1, max = 80 }

    [scale]  # deployment sizes: tests/test_fuzz_deployment.py; budgets here measured without
    every = 0
    """
)
BUG_SIGNATURES = {
    (PLANTED, "mm", "reference", "enabled", "mismatch", None),
    (PLANTED, "mm", "batch_invariance", "enabled", "mismatch", None),
}
BUDGET = 25


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> dict:
    """The planted module and the strategies file, and an environment that imports it."""
    root = tmp_path_factory.mktemp("planted")
    (root / f"{PLANTED}.py").write_text(PLANTED_SOURCE)
    (root / "campaign.toml").write_text(STRATEGIES)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH", "")]))
    env.pop("CI", None)  # Hypothesis' own ci profile would derandomize the controls
    return {"root": root, "strategies": root / "campaign.toml", "env": env}


def _fuzz(planted: dict, out: Path, *extra: str, budget: float = BUDGET, target=PLANTED):
    targets = [target] if isinstance(target, str) else target
    return [
        sys.executable,
        "-m",
        "bi_props.cli",
        "fuzz",
        *[arg for t in targets for arg in ("--target", t)],
        "--budget",
        str(budget),
        "--out",
        str(out),
        "--strategies",
        str(planted["strategies"]),
        *extra,
    ]


def _run(planted: dict, out: Path, *extra: str, **kwargs) -> subprocess.CompletedProcess:
    command = _fuzz(planted, out, *extra, **kwargs)
    budget = kwargs.get("budget", BUDGET)
    return subprocess.run(
        command, env=planted["env"], capture_output=True, text=True, timeout=budget + 180
    )


def _report(out: Path) -> dict:
    return json.loads((out / "report.json").read_text())


def _signatures(report: dict) -> list[tuple]:
    return [finding_from_dict(f).signature() for f in report["findings"]]


def _lines(path: Path) -> list[dict]:
    result = []
    if path.exists():
        for raw in path.read_text().splitlines():
            try:
                result.append(json.loads(raw))
            except json.JSONDecodeError:
                pass  # a line torn by the kill
    return result


def _finding(prop: str = "reference", **changes) -> Finding:
    fields = dict(
        target="lib",
        op="mm",
        property=prop,
        switch="enabled",
        kind="mismatch",
        case="Case(...)",
        message="m",
        reproduced_in_fresh_process=True,
    )
    fields.update(changes)
    return Finding(**fields)


# -- units -------------------------------------------------------------------------------------


def test_seeds_are_derived_stably_and_differ_per_round_and_turn() -> None:
    assert derive_seed(7, "cpu", 0) == derive_seed(7, "cpu", 0)
    assert derive_seed(7, "cpu", 0) == int.from_bytes(
        __import__("hashlib").sha256(repr((7, "cpu", 0)).encode()).digest()[:8], "big"
    )
    seeds = {round_seed(7, "cpu", r) for r in range(100)} | {round_seed(8, "cpu", 0)}
    assert len(seeds) == 101
    base = round_seed(7, "cpu", 3)
    assert turn_seed(base, "mm", "reference", "enabled") == derive_seed(
        base, "mm", "reference", "enabled"
    )
    assert turn_seed(base, "mm", "reference", "enabled", 1) != turn_seed(
        base, "mm", "reference", "enabled"
    )


def test_findings_log_is_fsynced_and_survives_a_torn_line(tmp_path: Path, monkeypatch) -> None:
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    log = FindingsLog(tmp_path / "findings.jsonl")
    log.append(_finding("reference"))
    log.append(_finding("parity", switch="both", kind="error", error_type="TypeError"))
    assert len(synced) >= 2  # every append (and the new file's directory entry)
    with (tmp_path / "findings.jsonl").open("a") as f:
        f.write('{"target": "lib", "op": "mm", "prop')  # SIGKILL in the middle of a write
    found = log.load()
    assert [f.property for f in found] == ["reference", "parity"]
    assert found[1].error_type == "TypeError"


def test_ledger_keeps_one_finding_per_signature_across_runs(tmp_path: Path) -> None:
    space = load(_write(tmp_path / "s.toml", STRATEGIES))
    first = Ledger(tmp_path, ["lib"], space, seed=1)
    assert first.record(_finding("reference"))
    assert not first.record(_finding("reference", case="Case(other)"))  # same signature
    assert first.record(_finding("reference", kind="crash"))  # another kind: another signature
    assert first.next_round("lib") == (0, round_seed(1, "lib", 0))
    assert first.next_round("lib")[0] == 1
    first.finish()

    second = Ledger(tmp_path, ["lib"], space, seed=1, resume=True)
    assert second.resumed and len(second.findings) == 2
    assert not second.record(_finding("reference"))
    assert second.finding_status(_finding("reference").signature()) == "still failing"
    assert second.finding_status(_finding(kind="crash").signature()) == "not seen this run"
    assert second.next_round("lib") == (2, round_seed(1, "lib", 2))  # rounds continue
    second.finish()
    lines = _lines(tmp_path / "findings.jsonl")
    assert len(lines) == 2  # nothing re-reported
    report = _report(tmp_path)
    assert [r["first"] for r in report["rounds"]] == [0, 2]
    assert report["campaign"]["runs"][1]["resumed"] is True


def test_a_flaky_finding_settles_the_kind_it_was_first_seen_with(tmp_path: Path) -> None:
    """A cell stays live after a finding, so a flaky one (a mismatch that passed when
    replayed) must account for its first-seen kind, in this run and after a resume: met again
    as a mismatch it is the same finding (skipped by later turns), not a new one to shrink."""
    space = load(_write(tmp_path / "s.toml", STRATEGIES))
    first = Ledger(tmp_path, ["lib"], space, seed=1)
    flaky = _finding(kind="flaky", first_kind="mismatch")
    # one finding of its cell whatever the class (a flaky case's class says nothing): "*"
    unclassed = {(*sig[:-1], "*") for sig in (flaky.signature(), _finding().signature())}
    assert flaky.settles() == unclassed
    assert first.record(flaky)
    assert first.known_signature(_finding().signature())  # its first kind: settled
    assert not first.known_signature(_finding(kind="error").signature())
    assert not first.record(_finding())  # met again as a mismatch: the same finding
    first.finish()

    second = Ledger(tmp_path, ["lib"], space, seed=1, resume=True)
    assert second.known_signature(_finding().signature())  # first_kind survives the log
    assert not second.record(_finding())
    assert second.finding_status(flaky.signature()) == "still failing"
    assert len(_lines(tmp_path / "findings.jsonl")) == 1


def test_the_progress_line_says_whether_a_cell_with_a_finding_keeps_exploring(
    tmp_path: Path,
) -> None:
    space = load(_write(tmp_path / "s.toml", STRATEGIES))
    ledger = Ledger(tmp_path, ["lib"], space, seed=1)
    assert live_outcome(ledger, 0, 0) == ""
    ledger.record(_finding())
    assert live_outcome(ledger, 0, 0) == " -> FINDING; the cell keeps exploring for other bugs"
    ledger.record(_finding(kind="error", error_type="ValueError", status="known"))
    assert live_outcome(ledger, 1, 0).startswith(" -> a known failure (recorded as known)")
    why = "5 turns met only its known failure(s), nothing new"
    assert done_outcome(ledger, 2, 0, why) == f" -> retired: {why}"
    assert done_outcome(ledger, 1, 0, "a crash finding") == " -> FINDING; retired: a crash finding"


def test_resume_imports_the_findings_of_an_older_report(tmp_path: Path) -> None:
    space = load(_write(tmp_path / "s.toml", STRATEGIES))
    old = {"target": "lib", "findings": [{**_finding().__dict__, "future_field": 1}]}
    (tmp_path / "report.json").write_text(json.dumps(old))
    ledger = Ledger(tmp_path, ["lib"], space, resume=True)
    assert [f.signature() for f in ledger.findings] == [_finding().signature()]
    assert len(_lines(tmp_path / "findings.jsonl")) == 1


def test_known_findings_do_not_fail_the_campaign(tmp_path: Path) -> None:
    space = load(_write(tmp_path / "s.toml", STRATEGIES))
    ledger = Ledger(tmp_path, ["lib"], space)
    ledger.record(_finding(status="known"))
    assert ledger.exit_status() == 0
    ledger.record(_finding("parity"))
    assert ledger.exit_status() == 1


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# -- end to end --------------------------------------------------------------------------------


@pytest.mark.campaign
@pytest.mark.slow
def test_resume_after_sigkill_finds_everything_an_uninterrupted_run_finds(
    planted: dict, tmp_path: Path
) -> None:
    # 1. The uninterrupted campaign.
    full = tmp_path / "full"
    done = _run(planted, full, "--seed", "11")
    assert done.returncode == 1, done.stderr[-3000:]
    # what each bug is (the failure class of its shrunk case aside: a resumed run's shrink may
    # end in another class of the same bug)
    expected = {s[:6] for s in _signatures(_report(full))}
    assert expected >= BUG_SIGNATURES, done.stderr[-3000:]

    # 2. The same campaign, SIGKILLed as soon as its first finding is on disk.
    killed = tmp_path / "killed"
    process = subprocess.Popen(
        _fuzz(planted, killed, "--seed", "11", budget=300),
        env=planted["env"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    findings = killed / "findings.jsonl"
    limit = time.monotonic() + 240
    try:
        while not _lines(findings):
            assert process.poll() is None, "the campaign ended before its first finding"
            assert time.monotonic() < limit, "no finding within 240 s"
            time.sleep(0.05)
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    before = _lines(findings)
    assert 1 <= len(before) < len(BUG_SIGNATURES) + 1

    # 3. Resumed with the same seed: everything the uninterrupted run found, each once.
    resumed = _run(planted, killed, "--seed", "11", "--resume")
    assert resumed.returncode == 1, resumed.stderr[-3000:]
    assert "resuming the campaign" in resumed.stderr
    report = _report(killed)
    final = _signatures(report)
    assert len(final) == len(set(final)), "a signature was reported twice"
    assert {s[:6] for s in final} >= expected
    after = _lines(findings)
    assert [finding_from_dict(f).signature() for f in after] == final
    assert after[: len(before)] == before  # what was on disk before the kill is kept as it was
    runs = report["campaign"]["runs"]
    assert [r["resumed"] for r in runs] == [False, True]
    first_round = runs[1]["rounds"][PLANTED][0]
    assert first_round > runs[0]["rounds"][PLANTED][1]  # new rounds, new seeds

    # The database key is stable: each failure found before the kill replays first on resume,
    # so its cell fails on the resumed run's first example (and is not reported again).
    coverage = _lines(killed / "examples.jsonl")
    for line in before:
        cell = (line["op"], line["property"], line["switch"])
        mine = [
            c
            for c in coverage
            if (c["op"], c["property"], c["switch"]) == cell and c["round"] >= first_round
        ]
        assert mine and mine[0]["outcome"] == line["kind"], (cell, mine[:3])
        digest = __import__("hashlib").sha384(database_key(PLANTED, *cell)).hexdigest()[:16]
        assert (killed / "examples" / digest).is_dir()
    assert "still failing (known from a previous run)" in resumed.stderr

    # The same seed, the same examples: round 0 of the first cell the killed campaign drew
    # for (the first turn of both campaigns), in both. A turn is time-boxed, so one campaign's
    # turn may stop earlier: the shorter is a prefix of the longer. (How long it is depends on
    # the machine: a floored first turn runs to its floor, and a failure's shrink adds more.)
    drawn = [c for c in _lines(killed / "examples.jsonl") if not c.get("explicit")]
    first = (drawn[0]["op"], drawn[0]["property"], drawn[0]["switch"])

    def round0(out: Path) -> list[dict]:
        return [
            c
            for c in _lines(out / "examples.jsonl")
            if c["round"] == 0
            and (c["op"], c["property"], c["switch"]) == first
            and not c.get("explicit")
        ]

    mine, theirs = round0(killed), round0(full)
    shorter = min(len(mine), len(theirs))
    assert shorter >= 1 and mine[:shorter] == theirs[:shorter], (first, mine, theirs)

    # The reports of the resumed run.
    for name in ("report.md", "junit.xml", "report.html"):
        assert (killed / name).stat().st_size > 0
    suite = ET.parse(killed / "junit.xml").getroot().find("testsuite")
    failed = {c.get("name") for c in suite.iter("testcase") if c.find("failure") is not None}
    assert failed >= {"mm reference [enabled]", "mm batch_invariance [enabled]"}


@pytest.mark.campaign
@pytest.mark.slow
def test_sigterm_stops_the_campaign_and_writes_the_report(planted: dict, tmp_path: Path) -> None:
    out = tmp_path / "out"
    process = subprocess.Popen(
        _fuzz(planted, out, budget=300, target="cpu"),
        env=planted["env"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines = []
    assert process.stderr is not None
    for line in process.stderr:
        lines.append(line)
        if "round 1 |" in line:  # well inside the cells' Hypothesis runs
            break
    started = time.monotonic()
    process.send_signal(signal.SIGTERM)
    rest = process.communicate(timeout=60)[1]
    assert time.monotonic() - started < 30
    assert process.returncode == 130, "".join(lines[-5:]) + rest
    assert "interrupted: writing the report" in rest
    assert "-> retired" not in rest and "FINDING" not in rest  # not mistaken for a failure
    report = _report(out)
    assert report["campaign"]["interrupted"] is True and report["findings"] == []
    assert (out / "junit.xml").exists()


@pytest.mark.campaign
@pytest.mark.slow
def test_several_targets_share_the_budget(planted: dict, tmp_path: Path) -> None:
    out = tmp_path / "out"
    # 40 s: two targets' workers start within it and each still gets turns on loaded cores
    done = _run(planted, out, "--seed", "3", budget=40, target=[PLANTED, "cpu"])
    assert done.returncode == 1, done.stderr[-3000:]
    report = _report(out)
    assert report["targets"] == [PLANTED, "cpu"]
    assert set(report["per_target"]) == {PLANTED, "cpu"}
    seconds = {t: 0.0 for t in report["targets"]}
    for cell in report["cells"]:
        seconds[cell["target"]] += cell["seconds"]
    assert all(s > 0.2 * sum(seconds.values()) for s in seconds.values()), seconds
    assert {f["target"] for f in report["findings"]} == {PLANTED}
    assert {c["target"] for c in report["controls"]} == {PLANTED, "cpu"}
    assert {line["target"] for line in _lines(out / "examples.jsonl")} == {PLANTED, "cpu"}
    suites = ET.parse(out / "junit.xml").getroot().findall("testsuite")
    assert [s.get("name") for s in suites] == [f"bi_props.{PLANTED}", "bi_props.cpu"]


# -- the budget is spent on the kernels (issue #12) --------------------------------------------


def test_status_is_incomplete_when_no_enabled_state_cell_ran(tmp_path: Path) -> None:
    space = load(_write(tmp_path / "s.toml", STRATEGIES))
    ledger = Ledger(tmp_path, ["lib"], space)
    ledger.cell("lib", "mm", "reference", "enabled")
    disabled = ledger.cell("lib", "mm", "reference", "disabled")
    ledger.turn_done(disabled, 10, 1.0, False)  # only a disabled-state cell ran
    ledger.finish()
    report = ledger.report()
    assert report["status"] == "incomplete"
    assert report["campaign"]["cells_not_run"] == 1
    assert ledger.exit_status() == 3
    enabled = ledger.cell("lib", "mm", "reference", "enabled")
    ledger.turn_done(enabled, 1, 0.1, False)
    assert ledger.report()["status"] == "complete" and ledger.exit_status() == 0


@pytest.mark.slow
def test_a_budget_that_ends_before_any_enabled_state_cell_runs_exits_3(
    planted: dict, tmp_path: Path
) -> None:
    # Starting the workers alone takes longer than this budget: no cell can run.
    out = tmp_path / "out"
    done = _run(planted, out, budget=0.2)
    assert done.returncode == 3, done.stderr[-3000:]
    report = _report(out)
    assert report["status"] == "incomplete"
    assert report["campaign"]["cells_not_run"] == report["campaign"]["cells_total"] > 0
    assert "INCOMPLETE: no enabled-state cell ran" in done.stderr
    headline = (out / "report.md").read_text().splitlines()[0]
    assert "INCOMPLETE" in headline and "cells not run" in headline, headline
    assert [c["state"] for c in report["controls"]] == ["not run"]


HANG_SPACE = STRATEGIES.replace("example_timeout_s = 60", "example_timeout_s = 600").replace(
    "dim = { min = 0, max = 12 }", "dim = { min = 7, max = 7 }"
)


@pytest.mark.campaign
@pytest.mark.slow
def test_the_campaign_ends_near_its_budget_when_the_kernel_hangs(
    planted: dict, tmp_path: Path
) -> None:
    # Every enabled mm hangs (K == 7 always) and the profile waits 600 s for an example: the
    # example timeout must shrink to the time left, and the campaign end near its budget.
    planted_dir = Path(__file__).parent / "planted"
    space = _write(tmp_path / "hang.toml", HANG_SPACE)
    env = dict(planted["env"])
    env["PYTHONPATH"] = os.pathsep.join([str(planted_dir), env["PYTHONPATH"]])
    out = tmp_path / "out"
    command = [sys.executable, "-m", "bi_props.cli", "fuzz", "--target", "planted_hang",
               "--budget", "20", "--out", str(out), "--strategies", str(space),
               "--seed", "5"]  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=400)
    elapsed = time.monotonic() - started
    assert elapsed < 20 + 20, f"{elapsed:.0f} s for a 20 s budget:\n{done.stderr[-3000:]}"
    report = _report(out)
    assert report["campaign"]["overrun_s"] is not None and report["campaign"]["overrun_s"] < 15
    # An example cut at the budget's end proves no hang: no timeout finding (none waited 600 s).
    assert [f for f in report["findings"] if f["kind"] == "timeout"] == []


# -- --max-findings: stop at the first N new findings (a bisection, a CI gate) ------------------


def test_max_findings_is_validated(tmp_path: Path, capsys) -> None:
    from bi_props.cli import main

    assert main(["fuzz", "--max-findings", "0", "--out", str(tmp_path / "a")]) == 2
    assert "--max-findings 0: must be at least 1" in capsys.readouterr().err


def test_max_findings_stops_the_turns_and_the_report_says_so(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from bi_props.campaigns.campaign import Campaign
    from bi_props.model.space import parse
    from bi_props.reporting.data import ReportData
    from bi_props.reporting.markdown import render

    space = parse({"ops": {"include": ["mm"]}}, "x", "x")
    lines: list[str] = []
    ledger = SimpleNamespace(
        new=set(),
        findings=[],
        extra={},
        started_monotonic=0.0,
        progress=lambda what, n: lines.append(what),
    )

    def found(name: str, kind: str = "mismatch") -> None:
        ledger.new.add((name,))
        ledger.findings.append(SimpleNamespace(signature=lambda: (name,), kind=kind))

    campaign = Campaign(["cpu"], space, tmp_path, 60.0, max_findings=2)
    assert not campaign._enough_findings(ledger, lambda: 0)
    found("a")
    found("w", "widening")  # accepts more than stock: no failure, so it does not count
    assert not campaign._enough_findings(ledger, lambda: 0) and not ledger.extra
    found("b")
    assert campaign._enough_findings(ledger, lambda: 0)
    assert ledger.extra["stopped_early"].startswith("after 2 new finding(s) (--max-findings 2)")
    assert lines and lines[-1].startswith("stopping after 2 new finding(s)")
    assert not Campaign(["cpu"], space, tmp_path, 60.0)._enough_findings(ledger, lambda: 0)
    with pytest.raises(ValueError, match="max_findings"):
        Campaign(["cpu"], space, tmp_path, 60.0, max_findings=0)
    report = {"campaign": {"stopped_early": ledger.extra["stopped_early"]}}
    text = render(ReportData(tmp_path, report, [], {}, {}, [], []))
    assert "stopped early after 2 new finding(s)" in text.splitlines()[0]


# -- --examples-per-cell: stop once every cell has evidence of a stated size -----------------


def test_examples_per_cell_is_validated(tmp_path: Path, capsys) -> None:
    from bi_props.campaigns.campaign import Campaign
    from bi_props.cli import main
    from bi_props.model.space import parse

    assert main(["fuzz", "--examples-per-cell", "0", "--out", str(tmp_path / "a")]) == 2
    assert "--examples-per-cell 0: must be at least 1" in capsys.readouterr().err
    space = parse({"ops": {"include": ["mm"]}}, "x", "x")
    with pytest.raises(ValueError, match="examples_per_cell"):
        Campaign(["cpu"], space, tmp_path, 60.0, examples_per_cell=0)


def test_examples_per_cell_waits_for_every_cell_and_every_control(tmp_path: Path) -> None:
    """The stop needs every cell at N examples or retired, and (controls on) every control
    settled; one cell short, or one control still searching, keeps the campaign going."""
    from types import SimpleNamespace

    from bi_props.campaigns.campaign import Campaign
    from bi_props.model.space import parse

    space = parse({"ops": {"include": ["mm"]}}, "x", "x")
    lines: list[str] = []
    ledger = SimpleNamespace(
        extra={}, started_monotonic=0.0, progress=lambda what, n: lines.append(what)
    )
    a = SimpleNamespace(done=False, examples=10)
    b = SimpleNamespace(done=False, examples=9)
    control = SimpleNamespace(done=False)
    schedule = SimpleNamespace(cells=lambda: [a, b], controls=lambda: [control])
    campaign = Campaign(["cpu"], space, tmp_path, 60.0, examples_per_cell=10)
    assert not campaign._enough_examples(schedule, ledger, lambda: 0)
    b.done = True  # retired (a finding, or nothing left to draw) counts as enough
    assert not campaign._enough_examples(schedule, ledger, lambda: 0) and not ledger.extra
    control.done = True
    assert campaign._enough_examples(schedule, ledger, lambda: 0)
    assert "--examples-per-cell 10" in ledger.extra["stopped_early"]
    assert lines[-1].startswith("stopping once every cell had run 10 examples")
    no_controls = Campaign(["cpu"], space, tmp_path, 60.0, control_share=0, examples_per_cell=10)
    control.done, ledger.extra = False, {}
    assert no_controls._enough_examples(schedule, ledger, lambda: 0)
    spend_it_all = Campaign(["cpu"], space, tmp_path, 60.0)
    assert not spend_it_all._enough_examples(schedule, ledger, lambda: 0)


@pytest.mark.campaign
def test_examples_per_cell_ends_a_real_campaign_early_with_that_evidence(tmp_path: Path) -> None:
    """A real campaign on one small op: it stops well inside its budget, every cell's report
    entry shows at least N examples (or a finding), and the headline says it stopped early."""
    import json
    import subprocess
    import sys

    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "bi_props.cli", "fuzz", "--ops", "silu", "--budget", "240",
         "--examples-per-cell", "12", "--out", str(out), "--seed", "1"],
        capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert "--examples-per-cell 12" in report["campaign"]["stopped_early"]
    elapsed = report["campaign"]["runs"][-1]["elapsed_s"]
    assert elapsed < 200, elapsed
    cells = [c for c in report["cells"] if c.get("op") == "silu"]
    assert cells and all(c["examples"] >= 12 or c.get("findings") for c in cells), cells
    assert "stopped early" in (out / "report.md").read_text().splitlines()[0]
