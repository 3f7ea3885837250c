"""The test summary explains itself (issue #15): skipped tests are grouped by their reason, and
deselected ones say who deselected them and why."""

from __future__ import annotations

from pathlib import Path

import pytest

PLANTED = Path(__file__).parent / "planted"
CONFTEST = (Path(__file__).parent / "conftest.py").read_text()


def test_skips_are_grouped_by_reason_and_deselections_explained(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(
        test_some="""
import pytest

@pytest.mark.parametrize("i", range(3))
def test_needs_vllm(i):
    pytest.skip("vLLM-only, run in the vLLM lane")

def test_posix():
    pytest.skip("POSIX only")

def test_runs():
    pass

def test_left_out():
    pass
"""
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "-k", "not left_out")
    result.assert_outcomes(passed=1, skipped=4, deselected=1)
    result.stdout.fnmatch_lines(
        [
            "*why tests were skipped or deselected*",
            "3 skipped: vLLM-only, run in the vLLM lane",
            "1 skipped: POSIX only",
            "1 deselected: by -k / -m on the command line",
        ]
    )


@pytest.mark.slow
def test_the_plugin_says_why_test_regression_is_deselected(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(PLANTED))
    pytester.makepyfile(
        test_suite="from bi_props.suite.test_properties import test_property, test_regression\n"
    )
    pytester.makefile(".toml", space='[hypothesis]\nmax_examples = 1\n[ops]\ninclude = ["mm"]\n')
    result = pytester.runpytest_subprocess(
        "--bi-target", "planted_correct", "--bi-strategies=space.toml", "-p", "no:cacheprovider",
        "-k", "mm-routing-enabled",
    )  # fmt: skip
    result.stdout.fnmatch_lines(
        ["bi_props: 1 deselected: test_regression, no --bi-regressions file given*"]
    )


CAMPAIGN_TESTS = """
import pytest

@pytest.mark.campaign
def test_a_campaign():
    pass

def test_a_unit():
    pass
"""


def test_campaign_tests_are_deselected_by_default_and_the_summary_names_the_lane(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makeini("[pytest]\nmarkers =\n    campaign: end to end\n")
    pytester.makepyfile(test_some=CAMPAIGN_TESTS)
    plain = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:bi_props")
    plain.assert_outcomes(passed=1, deselected=1)
    plain.stdout.fnmatch_lines(
        ["1 deselected: end-to-end `bi-props fuzz` campaigns*campaign lane*"]
    )
    lane = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:bi_props", "-m", "campaign")
    lane.assert_outcomes(passed=1, deselected=1)
    everything = pytester.runpytest("-p", "no:cacheprovider", "-p", "no:bi_props", "-m", "")
    everything.assert_outcomes(passed=2)
    named = pytester.runpytest(
        "-p", "no:cacheprovider", "-p", "no:bi_props", "test_some.py::test_a_campaign"
    )
    named.assert_outcomes(passed=1)


def test_under_pytest_xdist_the_campaign_lane_deselection_is_still_named(
    pytester: pytest.Pytester,
) -> None:
    """README command 2 runs under pytest-xdist: the workers collect and deselect, the
    controller (which collects nothing) must still say what was deselected and why."""
    pytester.makeconftest(CONFTEST)
    pytester.makeini("[pytest]\nmarkers =\n    campaign: end to end\n")
    pytester.makepyfile(test_some=CAMPAIGN_TESTS)
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", "-p", "no:bi_props", "-n", "2"
    )  # fmt: skip
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        ["1 deselected: end-to-end `bi-props fuzz` campaigns*campaign lane*"]
    )


@pytest.mark.slow
def _batch_invariance_space(pytester: pytest.Pytester, op: str, examples: int) -> None:
    """space.toml: one op, batch invariance only, ``examples`` examples per test."""
    from bi_props.model.property_spec import PROPERTIES

    others = [p for p in PROPERTIES if p != "batch_invariance"]
    pytester.makefile(
        ".toml",
        space=f'[hypothesis]\nmax_examples = {examples}\n[ops]\ninclude = ["{op}"]\n'
        f"[properties]\nexclude = {others!r}\n"
        # a few examples on purpose: the floor of evidence is one judged example
        "[runner]\nmin_judged = 1\n",
    )


def test_under_pytest_xdist_each_workers_bi_props_summary_reaches_the_terminal(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pytest-xdist worker has no terminal: its Session's summary (negative controls,
    findings) and its test_regression deselection travel to the controller
    (tests/test_promise.py checks its exit status 3). Two files, ``--dist loadfile``: each
    worker runs one file's Session."""
    monkeypatch.setenv("PYTHONPATH", str(PLANTED))
    suite = (
        "from bi_props.suite.test_properties import test_property, test_regression, "
        "test_batch_variance_control\n"
    )
    pytester.makepyfile(test_one=suite, test_two=suite)
    _batch_invariance_space(pytester, "mm", 5)
    result = pytester.runpytest_subprocess(
        "--bi-target", "planted_batch_variant", "--bi-strategies=space.toml",
        "-p", "no:cacheprovider", "-n", "2", "--dist", "loadfile", "--bi-report", "r.json",
    )  # fmt: skip
    out = result.stdout.str()
    assert result.ret == 1, out  # the planted bug is found (by one worker at least)
    # one report directory per worker, each named in its section (a shared path keeps the last
    # worker's report only and interleaves the coverage lines of examples.jsonl)
    for worker in ("gw0", "gw1"):
        written = pytester.path / worker / "r.json"
        assert written.is_file(), out
        assert (written.parent / "examples.jsonl").is_file(), out
        assert f"report: {worker}/r.json" in out, out
    assert not (pytester.path / "r.json").exists()
    # each worker collects both files (loadfile only schedules them): 2 deselected, said once
    result.stdout.fnmatch_lines(
        ["bi_props: 2 deselected: test_regression, no --bi-regressions file given*"]
    )
    assert out.count("deselected: test_regression") == 1, out
    for worker in ("gw0", "gw1"):
        assert f"bi_props (pytest-xdist worker {worker})" in out, out
    assert out.count("negative control mm batch_invariance: variance SEEN") == 2, out
    assert "finding: mm batch_invariance [enabled] mismatch" in out, out


def test_under_pytest_xdist_a_worker_given_no_property_test_prints_no_section(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--dist loadfile`` puts a file of property tests on one worker: the other collected them
    too (its Session probed the target) but ran none, and its section would say "0 examples"
    beside the real one."""
    monkeypatch.setenv("PYTHONPATH", str(PLANTED))
    pytester.makepyfile(
        test_props="from bi_props.suite.test_properties import test_property\n",
        test_plain="def test_one():\n    pass\n",
    )
    _batch_invariance_space(pytester, "silu", 3)
    result = pytester.runpytest_subprocess(
        "--bi-target", "cpu", "--bi-strategies=space.toml",
        "-p", "no:cacheprovider", "-n", "2", "--dist", "loadfile",
    )  # fmt: skip
    out = result.stdout.str()
    assert result.ret == 0, out
    sections = [line for line in out.splitlines() if "bi_props (pytest-xdist worker" in line]
    assert len(sections) == 1, out  # the worker that ran test_props.py only
    assert " 0 examples in " not in out, out
