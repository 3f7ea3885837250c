"""``--help`` teaches: every subcommand shows its defaults and examples (issue #15)."""

from __future__ import annotations

import pytest

from bi_props.cli import main


def _help(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--help"])
    assert exit_info.value.code == 0
    return " ".join(capsys.readouterr().out.split())


def test_fuzz_help_shows_the_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    text = _help(capsys, "fuzz")
    for expected in ("(default: 60.0)", "(default: bi_props-out)", "(default: cpu)"):
        assert expected in text, f"bi-props fuzz --help lacks {expected!r}:\n{text}"
    assert "examples:" in text and "bi-props fuzz --target cpu --budget 60" in text
    assert "(default: None)" not in text, "a None default teaches nothing"


@pytest.mark.parametrize("command", ["doctor", "repro", "promote", "report", "scenarios"])
def test_every_subcommand_has_examples(capsys: pytest.CaptureFixture[str], command: str) -> None:
    text = _help(capsys, command)
    assert "examples:" in text and f"bi-props {command}" in text, text


def test_doctor_and_repro_show_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    assert "(default: cpu)" in _help(capsys, "doctor")
    assert "(default: 0)" in _help(capsys, "repro")


def test_top_level_help_has_examples(capsys: pytest.CaptureFixture[str]) -> None:
    assert "bi-props fuzz --target cpu --budget 60" in _help(capsys)


def test_the_pytest_options_show_their_defaults(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest("--help", "-p", "no:cacheprovider")
    text = " ".join(result.stdout.str().split())
    for option, default in (
        ("--bi-target", "(default: the profile's, cpu for ci/cpu/dev)"),
        ("--bi-strategies", "(default: the profile's strategies/<profile>.toml)"),
        ("--bi-allow-missing", "(default: off"),
        ("--bi-report", "(default: none written)"),
        ("--bi-regressions", "(default: none)"),
    ):
        start = text.index(option)
        assert default in text[start : start + 300], f"{option} help lacks {default!r}"
