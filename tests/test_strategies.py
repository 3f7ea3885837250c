"""strategies.py: drawn cases respect the space, round-trip through repr and pickle, only use the
exact value class where the catalogue allows it, and shrink to meaningful minimal examples."""

from __future__ import annotations

import pickle
import random
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, Phase, find, given, settings
from hypothesis import strategies as st

from bi_props.catalogue import OPS
from bi_props.catalogue.strategies import (
    _VALUES_FOR,
    BATCHED,
    PROPERTIES,
    boundary_values,
    cases,
)
from bi_props.model.case import Batch, Case, Companion
from bi_props.model.property_spec import properties_of
from bi_props.model.space import Extent, Space, load_profile, parse

# A space narrower than the defaults in every direction, so that "respects the space" can fail.
NARROW = parse(
    {
        "dtypes": {"choices": ["bfloat16", "float16"]},
        "layouts": {"choices": ["offset", "strided"]},
        "values": {"choices": ["exact", "general", "special"]},
        "shapes": {
            "rows": {"min": 2, "max": 40},
            "dim": {"min": 3, "max": 70},
            "boundaries": [16, 32],
        },
        "batch": {"max_companions": 3, "companion_rows": {"min": 2, "max": 30}},
        "attention": {"length": {"min": 2, "max": 20}, "head_dims": [8, 16]},
        "op": {"mm": {"dim": {"min": 5, "max": 9}}},
        "scale": {"every": 0},  # deployment-size draws leave the small limits on purpose
    },
    "narrow.toml",
    "narrow",
)
CPU = load_profile("cpu")
SMALL_CPU = replace(CPU, scale_every=0)
"""The cpu profile's small draws alone (tests/test_deployment_scale.py checks the others)."""

FAST = settings(
    max_examples=12, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
# find() without the explain phase (which costs seconds per call and adds nothing here).
FIND = settings(
    max_examples=2000, deadline=None, database=None, phases=(Phase.generate, Phase.shrink)
)


def _within(value: int, extent: Extent) -> bool:
    return extent.min <= value <= extent.max


def _clip_high(extent: Extent, high: int) -> Extent:
    return Extent(extent.min, max(extent.min, min(extent.max, high)))


def check_shape(case: Case, space: Space, prop: str) -> None:
    """Every shape entry within the extent that the space gives it."""
    op, shape = case.op, case.shape
    dim = space.dim_for(op)
    small = _clip_high(dim, 64)
    assert all(isinstance(x, int) and x >= 0 for x in shape), case
    if op == "probe_model":
        length, layers, heads, kv_heads, head_dim, vocab, inter = shape
        assert 1 <= length <= max(2, min(space.attention_length.max, 12)), case
        assert length >= 2 or prop != "decode"
        assert layers in (1, 2) and kv_heads in (1, 2) and heads // kv_heads in (1, 2)
        assert head_dim in (8, 16) and vocab in (16, 64, 257) and inter in (16, 48)
        return
    if op == "attention":
        length, heads, kv_heads, head_dim = shape
        assert _within(length, space.attention_length)  # long needles too
        assert kv_heads in (1, 2) and heads % kv_heads == 0 and heads // kv_heads in (1, 2, 4)
        assert head_dim in space.head_dims
        return
    if op == "mixed_attention":
        keys, queries, heads, kv_heads, head_dim = shape
        assert _within(keys, space.attention_length)  # long needles too
        assert 1 <= queries <= keys or queries == keys == 0, case
        assert kv_heads in (1, 2) and heads % kv_heads == 0 and heads // kv_heads in (1, 2, 4)
        assert head_dim in space.head_dims
        return
    if op == "paged_decode_attention":
        # the needle's context is long for batch invariance too (split-KV splits only past a
        # length; shapes.paged_decode_attention says why)
        context, heads, kv_heads, head_dim, block_size = shape
        assert _within(context, _clip_high(space.rows, 512)) and context >= 1, case
        assert kv_heads in (1, 2) and heads // kv_heads in (1, 2, 4) and heads % kv_heads == 0
        assert head_dim in space.head_dims and 1 <= block_size <= 16, case
        return
    assert _within(shape[0], space.rows), case
    if prop == "batch_invariance":
        assert shape[0] <= 4, case
    if op in ("mm", "addmm") or (op in ("matmul", "linear") and case.opt("form") == "2d"):
        assert len(shape) == 3 and all(_within(x, dim) for x in shape[1:]), case
    elif op == "matmul" and case.opt("form") == "vector":
        assert len(shape) == 2 and _within(shape[1], dim), case
    elif op in ("matmul", "linear"):
        assert len(shape) == 4 and 1 <= shape[1] <= 8, case
        assert all(_within(x, dim) for x in shape[2:]), case
    elif op == "bmm":
        assert len(shape) == 4 and _within(shape[1], small), case
        assert all(_within(x, dim) for x in shape[2:]), case
    elif op in ("sum", "mean", "softmax", "log_softmax"):
        assert 1 <= len(shape) <= 3
        if len(shape) == 3:
            assert all(_within(x, small) for x in shape[1:]), case
        elif len(shape) == 2:
            assert _within(shape[1], dim), case
        if op in ("softmax", "log_softmax") or prop in ("batch_invariance", "row_permutation"):
            assert len(shape) >= 2, case
    elif op in ("rms_norm", "add_rms_norm"):
        assert len(shape) == 2 and _within(shape[1], Extent(max(dim.min, 1), dim.max)), case
    elif op == "silu":
        assert len(shape) == 2 and _within(shape[1], dim), case
    # (an op added to the catalogue later gets the generic checks only)


def check_case(case: Case, space: Space, op: str, prop: str) -> None:
    info = OPS[op]
    assert isinstance(case, Case)
    assert case.op == op
    assert case.entry in info.entries
    # parity alone also draws the space's extra dtypes (float64, integers, complex)
    assert case.dtype in space.dtypes or (prop == "parity" and case.dtype in space.parity_dtypes)
    assert len(case.layouts) == len(info.operands(case)), case
    assert len(info.operand_shapes(case, case.shape[0])) == len(case.layouts)
    assert set(case.layouts) <= set(space.layouts)
    assert 0 <= case.seed < 2**32
    for name, choices in info.option_choices.items():
        if case.opt(name) is not None:
            assert case.opt(name) in choices, (name, case)
    check_shape(case, space, prop)
    # Value classes: the property's, within the space, and exact only where it is sound.
    allowed = [v for v in _VALUES_FOR[prop] if v in space.values] or ["general"]
    assert case.values in allowed, case
    if case.values == "exact":
        assert info.exact_amplitude(case) >= 1, case
    # Batches: exactly for the properties that compare against a batch.
    if prop in BATCHED:
        batch = case.batch
        most = space.max_companions
        if info.sequences:  # many short sequences, within the token cap
            most = max(most, space.max_sequences - 1)
            if len(batch.companions) > space.max_companions:
                assert sum(c.rows for c in batch.companions) <= space.max_batch_tokens, case
        assert isinstance(batch, Batch) and 1 <= len(batch.companions) <= most, case
        assert 0 <= batch.position <= len(batch.companions)
        for companion in batch.companions:
            assert isinstance(companion, Companion) and 0 <= companion.seed < 2**32
            # only mixed_attention's companions have query tokens of their own
            assert companion.queries == 0 or op == "mixed_attention", case
            if op in ("attention", "mixed_attention"):
                assert _within(companion.rows, space.attention_length)
                assert 0 <= companion.queries <= space.attention_length.max, case
            elif op == "probe_model":
                assert 1 <= companion.rows <= max(1, min(space.attention_length.max, 24))
            elif op in ("bmm", "matmul"):
                assert 1 <= companion.rows <= min(space.companion_rows.max, 16)
            else:
                assert _within(companion.rows, space.companion_rows)
        if prop in ("batch_invariance", "row_permutation"):
            assert info.batchable(case), case
    else:
        assert case.batch is None
    # repr is a line of Python that rebuilds an equal case; cases pickle.
    rebuilt = eval(repr(case), {"Case": Case, "Batch": Batch, "Companion": Companion})
    assert rebuilt == case and hash(rebuilt) == hash(case)
    assert repr(rebuilt) == repr(case)
    clone = pickle.loads(pickle.dumps(case))
    assert clone == case and hash(clone) == hash(case)


# Every (op, property) pair the catalogue declares (an op lists the properties it supports, and
# a property may select ops itself: row permutation, every op with batch invariance).
PAIRS = [(op, prop) for op, info in OPS.items() for prop in properties_of(info)]


def test_catalogue_properties_are_known():
    for info in OPS.values():
        assert info.properties and set(info.properties) <= set(PROPERTIES), info.name
    assert {prop for _, prop in PAIRS} == set(PROPERTIES)


@pytest.mark.parametrize(("op", "prop"), PAIRS)
def test_cases_respect_the_narrow_space(op, prop):
    @FAST
    @given(st.data())
    def run(data):
        check_case(data.draw(cases(NARROW, op, prop)), NARROW, op, prop)

    run()


@pytest.mark.parametrize("op", list(OPS))
def test_cases_respect_the_cpu_profile(op):
    @settings(max_examples=20, deadline=None, database=None)
    @given(st.sampled_from(OPS[op].properties), st.data())
    def run(prop, data):
        check_case(data.draw(cases(SMALL_CPU, op, prop)), SMALL_CPU, op, prop)

    run()


def test_entries_override():
    @FAST
    @given(cases(NARROW, "mm", "reference", entries=("torch_npu.npu_mm",)))
    def run(case):
        assert case.entry == "torch_npu.npu_mm"

    run()


def test_every_option_choice_is_reachable():
    """The options in the catalogue's option_choices are all drawn (so the checks above bite)."""
    for op, name in [
        ("matmul", "form"),
        ("addmm", "beta"),
        ("addmm", "alpha"),
        ("addmm", "bias"),
        ("linear", "bias"),
        ("linear", "form"),
    ]:
        for choice in OPS[op].option_choices[name]:
            found = find(
                cases(NARROW, op, "reference"),
                lambda c, n=name, v=choice: c.opt(n) == v,
                settings=FIND,
            )
            assert found.opt(name) == choice


def test_exact_values_are_drawn_where_sound():
    found = find(cases(NARROW, "mm", "reference"), lambda c: c.values == "exact", settings=FIND)
    assert OPS["mm"].exact_amplitude(found) >= 1
    # The simplest exact case: the smallest extents of the space.
    assert found.shape == (NARROW.rows.min, 5, 5)


def test_exact_falls_back_to_general_when_unsound():
    """An op whose result is never exact (softmax: an exp and a division) cannot draw the exact
    class: it falls back to general, for every dtype."""
    space = parse(
        {
            "dtypes": {"choices": ["bfloat16", "float32"]},
            "values": {"choices": ["exact"]},
            "shapes": {"dim": {"min": 1, "max": 40}, "rows": {"min": 1, "max": 3}},
        },
        "never_exact.toml",
        "never_exact",
    )

    @FAST
    @given(cases(space, "softmax", "reference"))
    def run(case):
        assert OPS["softmax"].exact_amplitude(case) == 0
        assert case.values == "general"

    run()


def test_exact_bf16_products_stay_exact_at_realistic_k():
    """bfloat16 products of a kernel that accumulates in float32 are exact at K in the hundreds:
    the partial sums are integers within 2^24 and the output is rounded once, so the class is
    drawn (it used to fall back to general from K = 300, when only 8-bit values counted)."""
    space = parse(
        {
            "dtypes": {"choices": ["bfloat16"]},
            "values": {"choices": ["exact"]},
            "shapes": {"dim": {"min": 300, "max": 320}, "rows": {"min": 1, "max": 3}},
        },
        "wide_k.toml",
        "wide_k",
    )

    @FAST
    @given(cases(space, "mm", "reference"))
    def run(case):
        assert OPS["mm"].exact_amplitude(case) >= 1
        assert case.values == "exact"

    run()


# ---------------------------------------------------------------------------------------------
# Boundaries


def test_boundary_values_contain_each_boundary_and_its_neighbours():
    extent = Extent(0, 256)
    boundaries = (16, 32, 64, 128, 256)
    marks = boundary_values(extent, boundaries)
    for b in boundaries:
        for v in (b - 1, b, b + 1):
            if _within(v, extent):
                assert v in marks, v
    assert 257 not in marks  # outside the extent
    for m in range(16, 257, 16):
        assert m - 1 in marks and (m + 1 in marks or m + 1 > extent.max)
    assert marks == sorted(set(marks))
    assert all(_within(v, extent) for v in marks)


def test_boundary_values_clipped_to_the_extent():
    marks = boundary_values(Extent(30, 40), (32, 64))
    assert {31, 32, 33} <= set(marks)
    assert all(30 <= v <= 40 for v in marks)
    assert 64 not in marks and 63 not in marks
    assert boundary_values(Extent(1, 10), (16, 32)) == []
    assert boundary_values(Extent(2, 5), ()) == []


def test_extents_hit_boundaries():
    """Half the draws come from the boundary list: a boundary value is easy to find."""
    found = find(cases(CPU, "mm", "reference"), lambda c: c.shape[1] == 129, settings=FIND)
    assert found.shape[1] == 129


# ---------------------------------------------------------------------------------------------
# Shrinking


SHRINK = FIND


@pytest.mark.parametrize(("space", "op"), [(CPU, "mm"), (NARROW, "bmm")], ids=["cpu", "narrow"])
def test_shrinks_k_to_a_tile_edge_at_most(space, op):
    """K shrinks to the threshold or to the nearest tile edge above it; the rest to the minimum."""
    axis = 1 if op == "mm" else 2
    case = find(
        cases(space, op, "reference"),
        lambda c: c.shape[axis] >= 20,
        settings=SHRINK,
        random=random.Random(0),
    )
    edges = [v for v in boundary_values(space.dim, space.boundaries) if v >= 20]
    assert case.shape[axis] in (20, edges[0])
    assert case.shape[0] == space.rows.min
    assert case.shape[-1] == space.dim.min


def test_shrinks_k_to_the_threshold_exactly():
    for seed in range(6):
        case = find(
            cases(CPU, "mm", "reference"),
            lambda c: c.shape[1] >= 20,
            settings=SHRINK,
            random=random.Random(seed),
        )
        assert case.shape[1] == 20, (seed, case)
    for seed in range(6):  # companion rows are extents too
        case = find(
            cases(CPU, "rms_norm", "determinism"),
            lambda c: max(x.rows for x in c.batch.companions) >= 50,
            settings=SHRINK,
            random=random.Random(seed),
        )
        assert [x.rows for x in case.batch.companions] == [50], (seed, case)


def test_shrinks_to_the_simplest_choices():
    case = find(cases(NARROW, "mm", "reference"), lambda c: c.shape[0] >= 7, settings=SHRINK)
    assert case.shape == (7, 5, 5)
    assert case.dtype == NARROW.dtypes[0]
    assert case.layouts == (NARROW.layouts[0],) * 2
    assert case.values == "exact"
    assert case.entry == OPS["mm"].entries[0]
    assert case.seed == 0


@pytest.mark.parametrize("companions", [1, 2, 3])
def test_shrinks_to_the_fewest_companions(companions):
    case = find(
        cases(NARROW, "mm", "batch_invariance"),
        lambda c: c.batch.size >= companions + 1,
        settings=SHRINK,
    )
    assert len(case.batch.companions) == companions
    assert all(c.rows == NARROW.companion_rows.min and c.seed == 0 for c in case.batch.companions)
    assert case.batch.position == 0


def test_shrinks_batch_rows():
    """bmm's companions have plain integer rows (1..16): their total shrinks to the threshold."""
    case = find(
        cases(CPU, "bmm", "determinism"),
        lambda c: sum(x.rows for x in c.batch.companions) >= 20,
        settings=SHRINK,
        random=random.Random(0),
    )
    assert sum(x.rows for x in case.batch.companions) == 20
    assert len(case.batch.companions) <= 5
    # a property comparing a batch's values draws no zero extents: its shrink stops at 1
    assert case.shape == (CPU.rows.min, 1, 1, 1) and case.batch.position == 0
