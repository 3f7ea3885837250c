"""The ``switching`` property is judged in every campaign of a two-way target, beside its
cells, and a failure reaches the exit status: `bi-props fuzz` and the pytest plugin exit 1 on a
disable that leaves ``aten::mm`` overridden (tests/planted/planted_leaky_disable.py), which no
cell can see (each worker turns the switch on, or never)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PLANTED = Path(__file__).parent / "planted"
SPACE = """
[hypothesis]
max_examples = 5
[runner]
min_judged = 1
power_examples = 5
control_examples = 10
[ops]
include = ["mm"]
[shapes]
rows = { min = 1, max = 16 }
dim = { min = 1, max = 8 }
[batch]
max_companions = 2
companion_rows = { min = 1, max = 16 }
[scale]
every = 0  # deployment sizes: tests/test_fuzz_deployment.py; this budget was measured without them
"""


def _env() -> dict[str, str]:
    env = dict(os.environ, BI_PROPS_SWITCHING="1")  # tests/conftest.py turns it off elsewhere
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PLANTED), env.get("PYTHONPATH")]))
    return env


@pytest.mark.campaign
def test_fuzz_judges_switching_and_a_leaky_disable_exits_1(tmp_path: Path) -> None:
    (tmp_path / "space.toml").write_text(SPACE)
    out = tmp_path / "out"
    command = [
        sys.executable, "-m", "bi_props.cli", "fuzz", "--target", "planted_leaky_disable",
        "--strategies", str(tmp_path / "space.toml"), "--budget", "30", "--out", str(out),
        "--examples-per-cell", "5",
    ]  # fmt: skip
    done = subprocess.run(command, env=_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    assert report["switching"]["ok"] is False, report["switching"]
    [finding] = [f for f in report["findings"] if f["property"] == "switching"]
    assert [f for f in report["findings"] if f["property"] != "switching"] == []
    md = (out / "report.md").read_text()
    assert "Switching: FAILS" in md.split("\n\n", 2)[1], md[:1500]
    assert finding["kind"] in ("mismatch", "error")


@pytest.mark.slow
def test_the_pytest_plugin_exits_1_on_a_leaky_disable(pytester: pytest.Pytester) -> None:
    pytester.makefile(".toml", space=SPACE)
    pytester.makepyfile(test_props="from bi_props.suite.test_properties import test_property\n")
    for name, value in _env().items():
        pytester._monkeypatch.setenv(name, value)
    result = pytester.runpytest_subprocess(
        "--bi-target", "planted_leaky_disable", "--bi-strategies=space.toml", "-p",
        "no:cacheprovider", "-k", "mm-routing",
    )  # fmt: skip
    out = result.stdout.str()
    assert "switching: FAILS" in out, out
    assert result.ret == 1, out


@pytest.mark.campaign
def test_an_unclaimed_op_changed_by_the_switch_is_a_leak_finding(tmp_path: Path) -> None:
    """tests/planted/planted_unclaimed_leak.py claims mm only; its switch also scales
    aten::_softmax: softmax's enabled reference cell is a `leak` finding (exit 1), never a pass."""
    space = SPACE.replace('include = ["mm"]', 'include = ["mm", "softmax"]')
    (tmp_path / "space.toml").write_text(space)
    out = tmp_path / "out"
    command = [
        sys.executable, "-m", "bi_props.cli", "fuzz", "--target", "planted_unclaimed_leak",
        "--strategies", str(tmp_path / "space.toml"), "--budget", "40", "--out", str(out),
        "--examples-per-cell", "5",
    ]  # fmt: skip
    done = subprocess.run(command, env=_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    leaks = [f for f in report["findings"] if f["kind"] == "leak"]
    assert leaks and {f["op"] for f in leaks} == {"softmax"}, report["findings"]
    assert "differs from stock's" in leaks[0]["message"], leaks[0]["message"]
    assert not [f for f in report["findings"] if f["op"] == "mm"], report["findings"]


@pytest.mark.campaign
def test_a_known_mismatch_does_not_hide_a_second_one_in_another_class(tmp_path: Path) -> None:
    """tests/planted/planted_second_class.py: two mismatches of mm reference [enabled], one in
    float32 (listed as known, its case naming its class), one in bfloat16: the second is a new
    finding (exit 1); the known one is reported known."""
    from bi_props.model.case import Case

    space = SPACE.replace('include = ["mm"]', 'include = ["mm"]\n[dtypes]\nchoices = '
                          '["float32", "bfloat16"]\nparity = []')  # fmt: skip
    (tmp_path / "space.toml").write_text(space)
    known_case = Case("mm", "torch.mm", "float32", (1, 4, 1), ("contiguous",) * 2, "general", 0)
    (tmp_path / "known.toml").write_text(
        '[[known]]\ntarget = "planted_second_class"\nop = "mm"\nproperty = "reference"\n'
        f'switch = "enabled"\nkind = "mismatch"\ncase = "{known_case!r}"\n'
    )
    out = tmp_path / "out"
    command = [
        sys.executable, "-m", "bi_props.cli", "fuzz", "--target", "planted_second_class",
        "--strategies", str(tmp_path / "space.toml"), "--budget", "40", "--out", str(out),
        "--known", str(tmp_path / "known.toml"), "--examples-per-cell", "20", "--seed", "1",
    ]  # fmt: skip
    done = subprocess.run(command, env=_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    cell = [f for f in report["findings"] if (f["property"], f["switch"]) == ("reference",
            "enabled")]  # fmt: skip
    new = [f for f in cell if f["status"] != "known"]
    assert new and all("dtype='bfloat16'" in f["case"] for f in new), cell
    assert new[0]["case_class"].startswith("bfloat16/"), new[0]
