import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

# The `switching` property spawns an interpreter per pytest session of a two-way module target at
# its end; the many suite runs of this test suite leave it out (tests/test_switching.py turns it
# back on where it is what is tested).
os.environ.setdefault("BI_PROPS_SWITCHING", "0")


CAMPAIGN_LANE = (
    "end-to-end `bi-props fuzz` campaigns (marker `campaign`): they run in the campaign lane, "
    "`pytest --hypothesis-profile=ci -m campaign -n 2 --dist loadfile` (.ci/run's step 'campaign')"
)


def pytest_collection_modifyitems(config, items) -> None:
    """The end-to-end campaign tests (wall-clock budgets of 20-120 s each) are deselected unless
    a ``-m`` expression is given: ``-m campaign`` runs the lane, ``-m ""`` runs everything; a test
    named by its node id (``path::test``) on the command line runs too. The summary says so
    (``skip_summary``)."""
    given = config.invocation_params.args
    if config.option.markexpr or any(a == "-m" or a.startswith("-m") for a in map(str, given)):
        return
    named = [arg.replace(os.sep, "/") for arg in config.args if "::" in arg]

    def lane_only(item) -> bool:
        if item.get_closest_marker("campaign") is None:
            return False
        return not any(item.nodeid.startswith(n) or n.endswith(item.nodeid) for n in named)

    lane = [item for item in items if lane_only(item)]
    if lane:
        items[:] = [item for item in items if not lane_only(item)]
        config.hook.pytest_deselected(items=lane)
    if hasattr(config, "workeroutput"):  # a pytest-xdist worker: its controller sums up
        config.workeroutput["campaign_lane_deselected"] = len(lane)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """pytest-xdist's controller collects nothing itself: the campaign-lane deselections come
    from its workers (each collected the whole suite; the largest count is the suite's)."""
    sent = getattr(node, "workeroutput", {}).get("campaign_lane_deselected", 0)
    counts = node.config.stash.setdefault(_LANE_DESELECTED, [])
    counts.append(sent)


_LANE_DESELECTED = pytest.StashKey[list]()


def _why(report) -> str:
    """A skip's reason, first line, without pytest's 'Skipped: ' prefix."""
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    reason = reason.removeprefix("Skipped: ").splitlines()[0] if reason else "no reason given"
    return reason if len(reason) <= 200 else reason[:197] + "..."


def skip_summary(stats: dict) -> list[str]:
    """'N skipped: why' per distinct reason, most frequent first, then deselections not made by
    bi_props' plugin (which explains its own test_regression deselection)."""
    from collections import Counter

    reasons = Counter(_why(r) for r in stats.get("skipped", []) if r.when in ("setup", "call"))
    lines = [f"{n} skipped: {why}" for why, n in reasons.most_common()]
    deselected = [
        item
        for item in stats.get("deselected", [])
        if getattr(item, "originalname", "") != "test_regression"
    ]
    lane = [i for i in deselected if getattr(i, "get_closest_marker", lambda _: None)("campaign")]
    other = [i for i in deselected if i not in lane]
    if lane:
        lines.append(f"{len(lane)} deselected: {CAMPAIGN_LANE}")
    if other:
        lines.append(f"{len(other)} deselected: by -k / -m on the command line")
    return lines


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    """Skipped and deselected tests say why (issue #15): a bare "3 skipped" teaches nothing."""
    lines = skip_summary(terminalreporter.stats)
    from_workers = max(config.stash.get(_LANE_DESELECTED, [0]) or [0])
    if from_workers and not any(line.endswith(CAMPAIGN_LANE) for line in lines):
        lines.append(f"{from_workers} deselected: {CAMPAIGN_LANE}")
    if lines:
        terminalreporter.section("why tests were skipped or deselected")
        for line in lines:
            terminalreporter.line(line)


@pytest.fixture(autouse=True)
def _declared_targets_restored():
    """A test that starts a Session or Runner on a planted module target registers that module
    as declared (its EXTRA_OPS go to every later worker); a later test's worker, without the
    planted folder on its PYTHONPATH, then fails to start. Restore the declarations after each
    test (test_parity_dtypes failed after test_padded's reproducer test this way)."""
    from bi_props.targets import module

    declared = dict(module._DECLARED)
    yield
    if declared != module._DECLARED:
        module._DECLARED.clear()
        module._DECLARED.update(declared)


@pytest.fixture
def clean_cpu_campaign(tmp_path: Path) -> Callable[..., dict]:
    """``bi-props fuzz --target cpu --ops OP --strict-controls`` on a space file; asserts what an
    op with a batch-invariant cpu kernel must show: exit 0, no finding, every one of its cells ran
    examples (routing, reference, determinism in both states, batch_invariance enabled, parity),
    and its negative control (stock, switch off) saw batch variance. With ``examples_per_cell``
    the run is bounded by that evidence (``--examples-per-cell``; the budget only caps it) and
    must have stopped on it, every cell with that many examples. Returns the report."""

    def run(
        op: str, space: str, budget_s: int, seed: int, examples_per_cell: int | None = None
    ) -> dict:
        space_file = tmp_path / "space.toml"
        space_file.write_text(space)
        out = tmp_path / "campaign"
        command = [sys.executable, "-m", "bi_props.cli", "fuzz", "--target", "cpu", "--ops", op,
                   "--budget", str(budget_s), "--out", str(out), "--strategies", str(space_file),
                   "--seed", str(seed), "--strict-controls"]  # fmt: skip
        if examples_per_cell is not None:
            command += ["--examples-per-cell", str(examples_per_cell)]
        proc = subprocess.run(command, capture_output=True, text=True, timeout=budget_s * 10)
        report = json.loads((out / "report.json").read_text())
        assert proc.returncode == 0, (
            report.get("findings"),
            proc.stdout[-3000:],
            proc.stderr[-3000:],
        )
        assert report["findings"] == []
        ran = {(c["op"], c["property"], c["switch"]) for c in report["cells"] if c["examples"]}
        want = {
            (op, prop, switch)
            for prop in ("routing", "reference", "determinism")
            for switch in ("enabled", "disabled")
        } | {(op, "batch_invariance", "enabled"), (op, "row_permutation", "enabled")}
        want |= {(op, "parity", "both")}
        assert ran == want, ran ^ want
        controls = [c for c in report["controls"] if c["op"] == op]
        assert controls and all(c["variance_seen"] for c in controls), controls
        assert [c["property"] for c in controls] == ["batch_invariance"], controls
        if examples_per_cell is not None:
            stopped = report["campaign"].get("stopped_early", "")
            assert f"--examples-per-cell {examples_per_cell}" in stopped, stopped
            thin = [c for c in report["cells"] if c["examples"] < examples_per_cell]
            assert not thin, thin
        return report

    return run
