"""Output and arguments: bad --out and non-finite budgets are usage errors
(exit 2, one line), a second campaign on a locked output directory is refused, a target that
cannot start still writes report.json with a status, and --bi-strategies PATH never moves pytest's
rootdir. The campaign itself is never reached for a refused run (Campaign.run would fail)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from bi_props import cli

PLANTED = Path(__file__).resolve().parent / "planted"


@pytest.fixture
def no_campaign(monkeypatch) -> None:
    from bi_props.campaigns import campaign

    def refuse(self) -> int:
        raise AssertionError("a refused run must not start a campaign")

    monkeypatch.setattr(campaign.Campaign, "run", refuse)


def _fuzz(capsys, *args: str) -> tuple[int, str]:
    code = cli.main(["fuzz", "--ops", "mm", *args])
    return code, capsys.readouterr().err


@pytest.mark.parametrize("budget", ["nan", "inf", "-5", "0"])
def test_a_non_finite_or_non_positive_budget_is_a_usage_error(
    budget: str, tmp_path: Path, capsys, no_campaign
) -> None:
    code, err = _fuzz(capsys, "--budget", budget, "--out", str(tmp_path / "out"))
    assert code == 2
    assert err.count("\n") == 1 and f"--budget {float(budget)}" in err, err


def test_out_naming_a_file_is_a_usage_error(tmp_path: Path, capsys, no_campaign) -> None:
    existing = tmp_path / "report.txt"
    existing.write_text("not a directory")
    code, err = _fuzz(capsys, "--out", str(existing))
    assert (code, err.count("\n")) == (2, 1), err
    assert "exists and is not a directory" in err and "Traceback" not in err


def test_out_that_cannot_be_created_is_a_usage_error(tmp_path: Path, capsys, no_campaign) -> None:
    (tmp_path / "file").write_text("")
    code, err = _fuzz(capsys, "--out", str(tmp_path / "file" / "out"))
    assert (code, err.count("\n")) == (2, 1), err
    assert "cannot create the directory" in err


def test_a_second_campaign_on_a_locked_directory_is_refused(
    tmp_path: Path, capsys, no_campaign
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    with cli.OutputLock(out):
        code, err = _fuzz(capsys, "--out", str(out))
        assert (code, err.count("\n")) == (2, 1), err
        assert f"another campaign (pid {os.getpid()}) is running" in err
    # Once the first has ended, the directory may be used (resumed) again.
    with cli.OutputLock(out):
        pass


def test_a_target_that_cannot_start_writes_a_report_with_its_status(tmp_path: Path) -> None:
    import subprocess

    out = tmp_path / "out"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(PLANTED), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [sys.executable, "-m", "bi_props.cli", "fuzz", "--target", "planted_bad_import",
         "--ops", "mm", "--budget", "30", "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    assert report["status"] in ("target missing", "target broken"), report.get("status")


def test_bi_strategies_never_moves_the_rootdir(pytester: pytest.Pytester, tmp_path_factory) -> None:
    elsewhere = tmp_path_factory.mktemp("elsewhere") / "space.toml"
    elsewhere.write_text('[ops]\ninclude = ["mm"]\n')
    pytester.makepyfile("def test_nothing():\n    pass\n")
    spaced = pytester.runpytest_subprocess("--bi-strategies", str(elsewhere))
    text = spaced.stdout.str() + spaced.stderr.str()
    assert f"rootdir: {elsewhere.parent}" not in text
    assert spaced.ret == pytest.ExitCode.USAGE_ERROR, text
    assert f"--bi-strategies={elsewhere}" in text
    joined = pytester.runpytest_subprocess(f"--bi-strategies={elsewhere}")
    assert joined.ret == pytest.ExitCode.OK
    assert f"rootdir: {pytester.path}" in joined.stdout.str()


@pytest.mark.parametrize(("kind", "outcome"), [("mismatch", "xfailed"), ("crash", "failed")])
def test_pytest_matches_known_failures_by_full_signature(
    pytester: pytest.Pytester, monkeypatch, kind: str, outcome: str
) -> None:
    """A known-failures entry of another kind does not hide the cell's failure (it was xfail)."""
    path = os.pathsep.join([str(PLANTED), os.environ.get("PYTHONPATH", "")])
    monkeypatch.setenv("PYTHONPATH", path)
    pytester.makefile(
        ".toml",
        space='[hypothesis]\nmax_examples = 5\n[ops]\ninclude = ["mm"]\n'
        "[batch]\ncompanion_rows = { min = 64, max = 128 }\n"
        '[shapes]\ndim = { min = 8, max = 16 }\n[dtypes]\nchoices = ["float32"]\n'
        '[values]\nchoices = ["general"]\n',
        known='[[known]]\ntarget = "planted_batch_variant"\nop = "mm"\n'
        f'property = "batch_invariance"\nswitch = "enabled"\nkind = "{kind}"\n',
    )
    pytester.makepyfile(test_props="from bi_props.suite.test_properties import test_property\n")
    result = pytester.runpytest_subprocess(
        "--bi-target", "planted_batch_variant", "--bi-strategies=space.toml",
        "--bi-known", "known.toml", "-p", "no:cacheprovider", "-k", "batch_invariance-enabled",
    )  # fmt: skip
    result.assert_outcomes(**{outcome: 1})


def _blind_campaign(monkeypatch, variance_seen: bool) -> None:
    """A campaign that ends cleanly (exit 0) with one control whose variance_seen is given."""

    def run(args, space, known, targets) -> int:
        control = {"op": "mm", "property": "batch_invariance", "variance_seen": variance_seen}
        (args.out / "report.json").write_text(
            json.dumps({"target": "cpu", "status": "complete", "controls": [control]})
        )
        return 0

    monkeypatch.setattr(cli, "_run_fuzz", run)


@pytest.mark.parametrize("strict", [False, True])
def test_strict_controls_fail_a_campaign_with_a_blind_control(
    strict: bool, tmp_path: Path, capsys, monkeypatch
) -> None:
    _blind_campaign(monkeypatch, variance_seen=False)
    flag = ["--strict-controls"] if strict else []
    code, err = _fuzz(capsys, "--budget", "5", "--out", str(tmp_path / "out"), *flag)
    if not strict:
        assert code == 0, err
        return
    assert code == 1, err
    assert "--strict-controls: 1 negative control(s) saw no batch variance" in err
    assert "cpu mm batch_invariance" in err


def test_strict_controls_pass_when_every_control_saw_variance(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    _blind_campaign(monkeypatch, variance_seen=True)
    code, err = _fuzz(capsys, "--budget", "5", "--out", str(tmp_path / "out"), "--strict-controls")
    assert code == 0, err


@pytest.mark.parametrize("strict", [False, True])
def test_the_suites_control_test_fails_a_blind_control_only_when_strict(strict: bool) -> None:
    """The property suite's negative-control test (what --bi-strict-controls turns on)."""
    from types import SimpleNamespace

    from bi_props.suite.test_properties import test_batch_variance_control

    blind = SimpleNamespace(variance_seen=False, message="no violation seen in 200 examples")
    session = SimpleNamespace(strict_controls=strict, control=lambda op, prop: blind)
    if not strict:
        test_batch_variance_control(session, "mm", "batch_invariance", "disabled")
        return
    with pytest.raises(pytest.fail.Exception, match=r"blind negative control \(mm batch_inv"):
        test_batch_variance_control(session, "mm", "batch_invariance", "disabled")


@pytest.mark.parametrize(
    "line, key",
    [
        ("example_timeout_s = nan", "runner.example_timeout_s"),
        ("start_timeout_s = inf", "runner.start_timeout_s"),
        ("control_examples = -5", "runner.control_examples"),
    ],
)
def test_a_space_file_with_a_bad_number_is_a_usage_error(
    line: str, key: str, tmp_path: Path, capsys, no_campaign
) -> None:
    """Every number of a space file finite and in range; one line naming the file,
    the key and the allowed range; exit 2, before any campaign starts."""
    space = tmp_path / "space.toml"
    space.write_text(f"[runner]\n{line}\n")
    try:
        code, err = _fuzz(capsys, "--strategies", str(space), "--out", str(tmp_path / "out"))
    except SystemExit as exc:
        code, err = exc.code, capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1, err
    assert str(space) in err and f"key '{key}'" in err and "allowed: " in err, err
