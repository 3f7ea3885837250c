"""The Triton compat layer's pure parts (numpy only; no triton needed). The patches themselves are
tested against the real interpreter in the Triton lane (tests/triton_lane/lane_compat.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bi_props.targets import triton_compat as tc


def _torch_bf16_bits(values: np.ndarray) -> np.ndarray:
    return torch.from_numpy(values).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)


def test_f32_to_bf16_rounds_to_nearest_even_like_torch():
    rng = np.random.default_rng(0)
    specials = np.array(
        [0.0, -0.0, np.inf, -np.inf, 1.0, 3.4e38, -3.4e38, 1e-40, -1e-45, 1.17549435e-38],
        dtype=np.float32,
    )
    # Exact ties (low 16 bits 0x8000) with even and odd kept bits, and one ulp either side.
    base = (np.arange(64, dtype=np.uint32) << np.uint32(16)) + np.uint32(0x3F800000)
    ties = np.concatenate([base | 0x8000, (base | 0x8000) + 1, (base | 0x8000) - 1])
    values = np.concatenate(
        [specials, ties.view(np.float32), rng.standard_normal(4096).astype(np.float32) * 1e3]
    )
    got = tc.f32_to_bf16_bits(values)
    np.testing.assert_array_equal(got, _torch_bf16_bits(values))
    truncated = (values.view(np.uint32) >> 16).astype(np.uint16)
    assert (got != truncated).any(), "the test values must include cases where truncation differs"


def test_f32_to_bf16_keeps_nan_a_nan_with_its_sign():
    nans = np.array([0x7FC00000, 0xFFC00001, 0x7F800001, 0xFF80FFFF], dtype=np.uint32)
    bits = tc.f32_to_bf16_bits(nans.view(np.float32))
    widened = tc.bf16_bits_to_f32(bits)
    assert np.isnan(widened).all(), bits
    np.testing.assert_array_equal(bits >> 15, (nans >> 31).astype(np.uint16))


def test_bf16_widening_is_exact():
    bits = np.arange(0, 1 << 16, dtype=np.uint32).astype(np.uint16)
    ours = tc.bf16_bits_to_f32(bits)
    theirs = torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16).float().numpy()
    np.testing.assert_array_equal(ours.view(np.uint32), theirs.view(np.uint32))


def test_ordered_dot_row_does_not_depend_on_row_count():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((70, 64)).astype(np.float32)
    b = rng.standard_normal((64, 24)).astype(np.float32)
    full = tc.ordered_dot(a, b)
    for rows in (1, 3, 16, 17):
        np.testing.assert_array_equal(
            full[:rows].view(np.uint32), tc.ordered_dot(a[:rows], b).view(np.uint32)
        )
    # and it is a matmul: within fp32 summation error of the float64 product
    np.testing.assert_allclose(full, a.astype(np.float64) @ b, rtol=0, atol=1e-4)


def test_ordered_dot_batched():
    rng = np.random.default_rng(2)
    a = rng.standard_normal((3, 5, 8)).astype(np.float32)
    b = rng.standard_normal((3, 8, 4)).astype(np.float32)
    got = tc.ordered_dot(a, b)
    assert got.shape == (3, 5, 4)
    np.testing.assert_allclose(got, a.astype(np.float64) @ b, rtol=0, atol=1e-5)


@pytest.mark.parametrize("axis", [0, 1, -1, None])
def test_ordered_sum_is_independent_of_layout_and_other_rows(axis):
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((33, 40)) * 1e4).astype(np.float32)
    full = tc.ordered_sum(x, axis)
    again = tc.ordered_sum(np.asfortranarray(x), axis)
    np.testing.assert_array_equal(
        np.asarray(full).view(np.uint32), np.asarray(again).view(np.uint32)
    )
    if axis in (1, -1):
        np.testing.assert_array_equal(
            full[:5].view(np.uint32), tc.ordered_sum(x[:5], axis).view(np.uint32)
        )
    kept = tc.ordered_sum(x, axis, keepdims=True)
    assert kept.ndim == 2


def test_parse_spec():
    assert tc.parse_spec(None) == tc.DEFAULT
    assert tc.parse_spec("") == tc.DEFAULT
    assert tc.parse_spec("none") == ()
    assert tc.parse_spec("bf16_dot, rtne_cast,bf16_dot") == ("bf16_dot", "rtne_cast")
    assert "relaxed_block_shape" not in tc.DEFAULT
    with pytest.raises(ValueError, match=r"BI_PROPS_TRITON_COMPAT='bf16_dto'.*unknown.*bf16_dto"):
        tc.parse_spec("bf16_dto")


def test_every_patch_is_documented_with_its_reason():
    doc = tc.__doc__ or ""
    for name in tc.PATCHES:
        assert f"``{name}``" in doc, name
    assert "#11584" in doc and "#11604" in doc


def test_nothing_happens_without_the_interpreter(monkeypatch):
    monkeypatch.delenv(tc.INTERPRET_ENV, raising=False)
    assert tc.install_from_env() == ()
    assert tc.environment() == {}
    assert tc.active() == ()
    monkeypatch.setenv(tc.COMPAT_ENV, "nonsense")
    with pytest.raises(ValueError, match="nonsense"):
        tc.install_from_env()
