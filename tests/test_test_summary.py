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
