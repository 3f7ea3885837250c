import os

pytest_plugins = ["pytester"]

# The `switching` property spawns an interpreter per pytest session of a two-way module target at
# its end; the many suite runs of this test suite leave it out (tests/test_switching.py turns it
# back on where it is what is tested).
os.environ.setdefault("BI_PROPS_SWITCHING", "0")


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
    other = [
        item
        for item in stats.get("deselected", [])
        if getattr(item, "originalname", "") != "test_regression"
    ]
    if other:
        lines.append(f"{len(other)} deselected: by -k / -m on the command line")
    return lines


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    """Skipped and deselected tests say why (issue #15): a bare "3 skipped" teaches nothing."""
    lines = skip_summary(terminalreporter.stats)
    if lines:
        terminalreporter.section("why tests were skipped or deselected")
        for line in lines:
            terminalreporter.line(line)
