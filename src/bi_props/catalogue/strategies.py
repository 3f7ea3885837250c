"""Hypothesis strategies for cases, built from a validated Space.

Hypothesis draws only small integers and choices (shapes, dtype, layouts, a value class, seeds, a
batch composition); tensors are materialised from seeds in the worker. So drawing is cheap and
shrinking works on meaningful knobs: fewer rows, smaller dims, fewer companions, the first choice of
each list. Extents are biased toward tile boundaries (powers of two and their neighbours, multiples
of 16 +- 1), where batch-variant kernels switch algorithms.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from hypothesis import strategies as st

from ..model.case import PARITY_EXTRA_EVERY, Batch, Case, Companion
from ..model.op_registry import OPS
from ..model.opspec import OpSpec, out_dtype
from ..model.property_spec import get as get_property
from ..model.space import Extent, Space
from .models import ENGINE_MAX_COMPANIONS, ENGINE_MAX_TOKENS
from .scale import (
    deployment_space,
    largest_rows,
    scale_flag,
    sizes,
    vocabulary,
    within_budget,
)


def __getattr__(name: str) -> Any:
    """``PROPERTIES`` (every property's name), ``BATCHED`` (those whose cases carry a batch) and
    ``_VALUES_FOR`` ({property: value classes}), derived from the registry on each access, so a
    property registered later (a target's EXTRA_PROPERTIES) is in them."""
    from ..model.property_spec import PROPERTIES as SPECS

    if name == "PROPERTIES":
        return tuple(SPECS)
    if name == "BATCHED":
        return tuple(p for p, spec in SPECS.items() if spec.batched)
    if name == "_VALUES_FOR":
        return {p: tuple(spec.values) for p, spec in SPECS.items()}
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


SEEDS = st.integers(min_value=0, max_value=2**32 - 1)
ROW_WISE = ("batch_invariance", "row_permutation")
"""Properties that compare a batch's rows one by one: their cases are drawn batchable."""


def boundary_values(extent: Extent, boundaries: tuple[int, ...]) -> list[int]:
    """Tile edges inside the extent: each boundary b and b +- 1, and multiples of 16 +- 1."""
    marks: set[int] = set()
    for b in boundaries:
        marks.update((b - 1, b, b + 1))
    top = max(boundaries, default=16)
    for m in range(16, top + 1, 16):
        marks.update((m - 1, m + 1))
    return sorted(v for v in marks if extent.min <= v <= extent.max)


@lru_cache(maxsize=4096)
def choice(options: tuple) -> st.SearchStrategy:
    """``sampled_from``, built once per option tuple: drawing a case must cost microseconds, and
    Hypothesis validates every new strategy object."""
    return st.sampled_from(options)


@lru_cache(maxsize=4096)
def integers(low: int, high: int) -> st.SearchStrategy[int]:
    return st.integers(low, high)


@lru_cache(maxsize=4096)
def extents(extent: Extent, boundaries: tuple[int, ...]) -> st.SearchStrategy[int]:
    """An integer in the extent, half of the time snapped onto a tile edge; shrinks toward ``min``.

    Drawn as (v, snap, offset): with ``snap`` the value is the largest tile centre <= v (a
    boundary or a multiple of 16) plus ``offset`` in {0, -1, +1}. Shrinking ``snap`` to False
    leaves plain v, so a failure at "K >= 20" shrinks to exactly 20, not to the edge 31."""
    plain = integers(extent.min, extent.max)
    centres = sorted({b for b in boundaries} | set(range(16, max(boundaries, default=16) + 1, 16)))
    centres = [c for c in centres if extent.min - 1 <= c <= extent.max + 1]
    if not centres:
        return plain

    def place(drawn: tuple[int, bool, int]) -> int:
        v, snap, offset = drawn
        below = [c for c in centres if c <= v]
        if not snap or not below:
            return v
        return min(max(below[-1] + offset, extent.min), extent.max)

    return st.tuples(plain, st.booleans(), st.sampled_from((0, -1, 1))).map(place)


def _clip(extent: Extent, low: int | None = None, high: int | None = None) -> Extent:
    lo = extent.min if low is None else max(extent.min, low)
    hi = extent.max if high is None else min(extent.max, high)
    return Extent(lo, max(lo, hi))


@dataclass(frozen=True)
class ShapeContext:
    """What an op's ``draw_shape(draw, ctx)`` and ``companion_rows(ctx)`` get from the space.

    ``rows``: the needle's rows (a few for batch invariance: the companions supply the large M);
    ``dim``: the op's extent strategy (``Space.dim_for``), biased toward tile edges; ``small``:
    the same clipped to 64 (inner dims of rank-3 inputs); ``dim_extent``: the extent itself.
    ``choice``, ``integers``, ``extents`` (tile-edge biased, shrinks toward min), ``clip`` and
    ``booleans`` build strategies; ``option(name)`` samples the spec's ``option_choices[name]``.
    ``scaled``: this example is drawn at deployment size along the op's axis (``OpSpec.scale``;
    the space's limits are raised already), ``sizes(low, high)`` draws a named deployment size
    there. Strategies are cached: building one costs nothing and draws nothing."""

    space: Space
    spec: OpSpec
    prop: str
    rows: st.SearchStrategy[int]
    dim: st.SearchStrategy[int]
    small: st.SearchStrategy[int]
    dim_extent: Extent
    scaled: bool = False

    def sizes(self, low: int, high: int) -> st.SearchStrategy[int]:
        """A size in [low, high], half of the time a named deployment size or one off it."""
        return sizes(self.space, low, high)

    def vocabulary(self) -> st.SearchStrategy[int]:
        """A deployment-size last dimension of logits: a vocabulary size half of the time, else
        a size past the op's small extent."""
        return vocabulary(self.space, self.dim_extent.max + 1)

    @property
    def row_wise(self) -> bool:
        """Whether the property compares the batch's rows one by one (batch invariance, row
        permutation): then the drawn case must have rows (``OpSpec.batchable``: no full sum)."""
        return self.prop in ROW_WISE

    @property
    def boundaries(self) -> tuple[int, ...]:
        return self.space.boundaries

    @staticmethod
    def choice(options: tuple) -> st.SearchStrategy:
        return choice(tuple(options))

    @staticmethod
    def integers(low: int, high: int) -> st.SearchStrategy[int]:
        return integers(low, high)

    @staticmethod
    def booleans() -> st.SearchStrategy[bool]:
        return st.booleans()

    @staticmethod
    def clip(extent: Extent, low: int | None = None, high: int | None = None) -> Extent:
        return _clip(extent, low, high)

    def extents(
        self, extent: Extent, boundaries: tuple[int, ...] | None = None
    ) -> st.SearchStrategy[int]:
        return extents(extent, self.space.boundaries if boundaries is None else boundaries)

    def option(self, name: str) -> st.SearchStrategy:
        return choice(tuple(self.spec.option_choices[name]))


def _lift(extent: Extent, low: int) -> Extent:
    return Extent(max(extent.min, low), max(extent.max, low))


def value_space(space: Space) -> Space:
    """The space of a property that compares a batch's values (``PropertySpec.batched``): no
    zero extents (an empty output compares nothing: a degenerate example, never evidence); the
    space's upper limits stay."""
    if space.dim.min >= 1 and all(e.min >= 1 for e in space.op_dim.values()):
        return space
    return replace(
        space,
        dim=_lift(space.dim, 1),
        op_dim={op: _lift(extent, 1) for op, extent in space.op_dim.items()},
    )


def shape_context(space: Space, op: OpSpec, prop: str, scaled: bool = False) -> ShapeContext:
    if get_property(prop).batched:
        space = value_space(space)
    dim = space.dim_for(op.name)
    b = space.boundaries
    rows = extents(space.rows, b)
    if prop == "batch_invariance":
        # A needle is a few rows; the batch's companions supply the large M.
        rows = integers(space.rows.min, min(space.rows.max, max(space.rows.min, 4)))
    small = extents(_clip(dim, high=64), b)
    return ShapeContext(space, op, prop, rows, extents(dim, b), small, dim, scaled)


def _op_shape_and_options(
    draw: st.DrawFn, space: Space, op: OpSpec, prop: str, scaled: bool = False
) -> tuple:
    """Draw ``(shape, options)`` for one op: its spec's ``draw_shape``."""
    if op.draw_shape is None:
        raise ValueError(f"op {op.name!r} has no draw_shape: its spec cannot be explored")
    shape, options = op.draw_shape(draw, shape_context(space, op, prop, scaled))
    return tuple(shape), dict(options)


def _companion(rows: st.SearchStrategy[int], queries: st.SearchStrategy[int] | None):
    """One companion; ``queries`` (an op's ``companion_queries``) draws its query tokens."""
    if queries is None:  # no draw at all: other ops' choice sequences stay as they were
        return st.builds(Companion, seed=SEEDS, rows=rows)
    return st.builds(Companion, seed=SEEDS, rows=rows, queries=queries)


@lru_cache(maxsize=1024)
def _companions(
    rows: st.SearchStrategy[int],
    max_companions: int,
    queries: st.SearchStrategy[int] | None = None,
) -> st.SearchStrategy:
    return st.lists(_companion(rows, queries), min_size=1, max_size=max_companions)


REPLICA_STEP = 0x9E3779B1
"""Seed step between copies of one companion in a many-sequence batch (their values differ)."""


def _replicated(companions: list[Companion], count: int, most_rows: int) -> list[Companion]:
    """``count`` companions cycled from ``companions`` (the distinct ones drawn), each at most
    ``most_rows`` rows (the token cap) and with a seed of its own.

    Why copies, not ``count`` independent draws: the batch-wide quantities a kernel keys on (the
    number of sequences, the longest, the total) need no more than a few distinct lengths, and a
    failure on a batch of 60 sequences then shrinks by one choice (the many-sequence flag: the
    distinct companions alone stay) instead of by minimising 60 companions' rows one example at a
    time (minutes on a slow kernel)."""
    out = []
    for i in range(count):
        base = companions[i % len(companions)]
        seed = (base.seed + (i // len(companions)) * REPLICA_STEP) % 2**32
        out.append(replace(base, seed=seed, rows=min(base.rows, most_rows)))
    return out


def _aim_total(
    draw: st.DrawFn, companions: list[Companion], needle_rows: int, space: Space
) -> list[Companion]:
    """Half of the time, land the batch's total rows on a switch point (or one off it): the
    last companion takes the rows that make up the difference, when that stays within the rows
    the op's own strategy drew (so within its extent). Random totals cross 256 often enough,
    but a kernel that changes exactly at a tile edge needs the edge itself."""
    if not draw(st.booleans()):  # shrinks to no aim
        return companions
    others = needle_rows + sum(c.rows for c in companions[:-1])
    drawn = [c.rows for c in companions]
    reachable = [t for t in space.switch_points if min(drawn) <= t - others <= max(drawn)]
    if not reachable:
        return companions
    total = draw(choice(tuple(reachable))) + draw(choice((0, -1, 1)))
    rows = total - others
    if not min(drawn) <= rows <= max(drawn):
        return companions
    return [*companions[:-1], replace(companions[-1], rows=rows)]


def _batch(
    draw: st.DrawFn,
    space: Space,
    op: OpSpec,
    prop: str = "batch_invariance",
    needle_rows: int = 1,
    scaled: Case | None = None,
) -> Batch:
    """Companions of the needle: the spec's ``companion_rows(ctx)`` (default: the space's
    companion rows, tile-edge biased), at most ``max_companions`` (the space's, capped by the
    spec's). A sequence op (``OpSpec.sequences``) holds, a third of the time, many sequences:
    those companions copied (``_replicated``) up to a number aimed at the space's switch points
    up to ``max_sequences``, each short enough that all companions stay within
    ``max_batch_tokens``. The total rows are aimed at a switch point half of the time
    (``_aim_total``). ``scaled``: a deployment-size example's needle case, whose companions
    are cut to the space's ``max_elements`` (``scale.within_budget``)."""
    queries = None
    ctx = shape_context(space, op, prop, scaled is not None)
    if op.companion_queries is not None:
        queries = op.companion_queries(ctx)
    if op.companion_rows is not None:
        rows = op.companion_rows(ctx)
    else:
        rows = extents(space.companion_rows, space.boundaries)
    most = space.max_companions
    if op.max_companions is not None:
        most = min(most, op.max_companions)
    companions = draw(_companions(rows, most, queries))
    # A third of the batches of a sequence op hold many sequences: the companions drawn, copied
    # up to a count aimed at the switch points (the draw shrinks to 0: the few alone). A third,
    # not a half: such a batch costs several times a few-sequence one, and most bugs need no more.
    if op.sequences and space.max_sequences - 1 > most and draw(integers(0, 2)) == 2:
        marks = tuple(t - 1 for t in space.switch_points if t > 1)  # sequences -> companions
        count = draw(extents(Extent(most + 1, space.max_sequences - 1), marks))
        most_rows = max(1, space.max_batch_tokens // count)
        companions = _replicated(companions, count, most_rows)
    if scaled is not None:
        companions = within_budget(op, scaled, companions, needle_rows, space.max_elements)
    companions = _aim_total(draw, companions, needle_rows, space)
    companions = _with_contents(draw, companions, space)
    position = draw(integers(0, len(companions)))
    return Batch(position=position, companions=tuple(companions))


PLAIN_WEIGHT = 10
"""A companion is plain about ``PLAIN_WEIGHT`` times in ``PLAIN_WEIGHT`` + 5 (two in three);
otherwise one of the space's other contents (outliers, ties, -inf, huge, tiny values)."""


def _with_contents(draw: st.DrawFn, companions: list, space: Space) -> list:
    """Each distinct companion's content (``Companion.content``), drawn on its own; copies of
    a companion (``_replicated``) share its draw. Shrinks to plain."""
    others = tuple(c for c in space.companion_contents if c != "plain")
    if not others:
        return list(companions)
    pool = ("plain",) * PLAIN_WEIGHT + others
    drawn: dict[tuple[int, int, int], str] = {}
    out = []
    for c in companions:
        key = (c.seed, c.rows, c.queries)
        if key not in drawn:
            drawn[key] = draw(st.sampled_from(pool))
        out.append(replace(c, content=drawn[key]) if drawn[key] != "plain" else c)
    return out


PADDINGS = ("longest", "switch point", "beyond")
"""How a padded case's length is drawn: the batch's longest sample (padding only the shorter
ones), a switch point at or above it (a CUDA-graph bucket: 16, 32, 64...), or a few rows beyond."""


def _padded(draw: st.DrawFn, space: Space, case: Case) -> int:
    """Half of the time, where the op allows it (``OpSpec.padded``), the padded layout: every
    sample padded to one length (``Case.padded``; 0 packed, where shrinking goes). The cost stays
    bounded: samples x length <= max(samples x longest, the space's ``max_batch_tokens``)."""
    if not draw(st.booleans()):
        return 0
    rows = [case.shape[0], *(c.rows for c in (case.batch.companions if case.batch else ()))]
    longest = max(rows)
    cap = max(longest, space.max_batch_tokens // len(rows))
    how = draw(choice(PADDINGS))
    points = tuple(t for t in space.switch_points if longest <= t <= cap)
    if how == "switch point" and points:
        return int(draw(choice(points)))
    if how == "beyond":
        return min(longest + draw(integers(1, 16)), cap)
    return longest


EXACT_SHARE = 16
"""Properties that compare a batch's values (``PropertySpec.batched``) draw order-exact values
(the ``exact`` class: every partial sum exact, so no summation order can show) in one example
in this many: such an example still checks which rows a kernel reads, but it is counted apart
as order-blind, never as evidence of invariance."""
_EXACT_FLAG = (False,) * (EXACT_SHARE - 1) + (True,)

_EXTRA_DTYPE = (False,) * (PARITY_EXTRA_EVERY - 1) + (True,)
"""sampled_from draws an index about uniformly (integers() favours small values) and shrinks
toward False."""


@st.composite
def cases(
    draw: st.DrawFn,
    space: Space,
    op: str,
    prop: str,
    entries: tuple[str, ...] | None = None,
) -> Case:
    """One Case for ``op`` under property ``prop``; ``entries`` may replace the op's entry points
    (a target whose users call another function, e.g. torch_npu's)."""
    info = OPS[op]
    spec = get_property(prop)
    # One example in the space's scale_every at deployment size along the op's axis, twice as
    # often where the property compares a batch (a kernel chosen by the batch's size shows
    # there); the flag shrinks toward the small draw; an op without an axis draws nothing here.
    # A batch of thousands of tokens (the tokens axis) is a batch's size: only the properties
    # comparing a batch draw it; a vocabulary, a context or positions are a sample's own.
    every = space.scale_every if not spec.batched else max(1, space.scale_every // 2)
    axis = info.scale if (info.scale != "tokens" or spec.batched) else ""
    scaled = bool(axis) and space.scale_every > 0 and draw(scale_flag(every))
    if scaled:
        space = deployment_space(space, info.scale)
    shape, options = _op_shape_and_options(draw, space, info, prop, scaled)
    provisional = Case(op, "", space.dtypes[0], shape, (), "general", 0, options)
    if scaled and shape:  # the needle itself within the budget (its companions: _batch)
        most = largest_rows(info, provisional, space.max_elements)
        if shape[0] > most:
            shape = (most, *shape[1:])
            provisional = Case(op, "", space.dtypes[0], shape, (), "general", 0, options)
    n_operands = len(info.operands(provisional))
    entry = draw(choice(tuple(entries or info.entries)))
    dtype = draw(choice(tuple(space.dtypes)))
    # Parity, one example in PARITY_EXTRA_EVERY: a dtype beyond the space's (float64, integer,
    # complex). The flag shrinks toward False: a float failure stays on its dtype.
    if prop == "parity" and space.parity_dtypes and draw(choice(_EXTRA_DTYPE)):
        dtype = draw(choice(tuple(space.parity_dtypes)))
    layouts = tuple(draw(choice(tuple(space.layouts))) for _ in range(n_operands))
    allowed = [v for v in spec.values if v in space.values] or ["general"]
    if spec.batched and len(allowed) > 1 and "exact" in allowed:
        # Order-exact values cannot show a reduction order: a small, stated share only
        # (``EXACT_SHARE``), counted apart as order-blind. The flag shrinks toward "not exact".
        exact = draw(choice(_EXACT_FLAG))
        allowed = ["exact"] if exact else [v for v in allowed if v != "exact"]
    values = draw(choice(tuple(allowed)))
    seed = draw(SEEDS)
    case = Case(op, entry, dtype, shape, layouts, values, seed, options)
    if values == "exact" and info.exact_amplitude(case) < 1:
        # No integer range keeps every partial result exact here: fall back, deterministically.
        case = Case(op, entry, dtype, shape, layouts, "general", seed, options)
    if spec.batched:
        needle_rows = int(shape[0]) if shape else 0
        batch = _batch(draw, space, info, prop, needle_rows, case if scaled else None)
        case = case.with_batch(batch)
    if space.padded and info.padded is not None and shape and info.padded(case):
        case = case.with_padded(_padded(draw, space, case))
    modes = tuple(getattr(space, "modes", ("eager",)))  # Case.mode; drawn last, shrinks to eager
    if modes != ("eager",):  # an eager-only space draws nothing: its choice sequences stay
        mode = draw(choice(modes)) if len(modes) > 1 else modes[0]
        case = replace(case, mode=mode, options=dict(case.options))
    return case


KNOWN_SHARE = 3
"""One draw in this many of a cell given known batch-variant cases (``cases_near_known``) is a
neighbour of one of them: its structure (shape, layouts, options, companions' rows) kept, its
data, the needle's place and its dtype drawn anew."""
_KNOWN_FLAG = (False,) * (KNOWN_SHARE - 1) + (True,)
_OTHER_FLAG = (False, False, False, True)
"""A neighbour keeps its base's dtype and value class three times in four."""


@lru_cache(maxsize=256)
def _shift() -> st.SearchStrategy[int]:
    return st.integers(0, 2**32 - 1)


@st.composite
def near(draw: st.DrawFn, base: Case, space: Space) -> Case:
    """A neighbour of ``base``: the same op, entry, shape, layouts, options and companions'
    rows; other data (every sample's seed moved by one drawn shift), the needle at another
    place, and another dtype or order-sensitive value class (or, where the space draws several,
    another mode). Every draw shrinks toward ``base`` itself (shift 0, the same place, its own
    dtype, values and mode)."""
    shift = draw(_shift())
    dtype, values = base.dtype, base.values
    others = tuple(d for d in space.dtypes if d != base.dtype)
    if others and draw(choice(_OTHER_FLAG)):  # mostly its own dtype: where the variance was seen
        dtype = draw(choice(others))
    kinds = tuple(v for v in ORDER_SENSITIVE if v != base.values and v in space.values)
    if kinds and draw(choice(_OTHER_FLAG)):
        values = draw(choice(kinds))
    batch = base.batch
    if batch is not None and draw(st.booleans()):  # half of the time, the needle elsewhere
        slots = len(batch.companions) + 1
        position = (batch.position + draw(integers(1, max(slots - 1, 1)))) % slots
        batch = Batch(position, batch.companions)
    if batch is not None:
        position = batch.position
        companions = tuple(replace(c, seed=(c.seed + shift) % 2**32) for c in batch.companions)
        batch = Batch(position, companions)
    mode, modes = base.mode, tuple(getattr(space, "modes", ("eager",)))
    if len(modes) > 1 and draw(st.booleans()):  # half of the time another mode (Case.mode)
        mode = draw(choice(tuple(m for m in modes if m != base.mode) or modes))
    return replace(
        base,
        dtype=dtype,
        values=values,
        seed=(base.seed + shift) % 2**32,
        batch=batch,
        options=dict(base.options),
        mode=mode,
    )


@st.composite
def cases_near_known(
    draw: st.DrawFn,
    space: Space,
    op: str,
    prop: str,
    entries: tuple[str, ...] | None,
    known: tuple[Case, ...],
) -> Case:
    """``cases``, and in one draw of ``KNOWN_SHARE`` a neighbour (``near``) of a known
    batch-variant case (smallest first: the choice shrinks toward it). The flag shrinks toward
    the plain draw, so a failure that needs no known structure shrinks out of it."""
    if known and draw(choice(_KNOWN_FLAG)):
        return draw(near(draw(choice(known)), space))
    return draw(cases(space, op, prop, entries))


ORDER_SENSITIVE = ("general", "wide")
"""Value classes whose sums depend on their order (``exact`` is order-exact by construction,
``special`` compares NaN and infinities that hide rounding)."""


def control_space(space: Space) -> Space:
    """The space a negative control searches: only where reduction order can show. Every extent
    at least 2 (K and N above 1: a one-term sum has no order) and order-sensitive values only;
    the space's upper limits stay (they bound memory and time on the user's machine)."""

    def lift(extent: Extent) -> Extent:
        return Extent(max(extent.min, 2), max(extent.max, 2))

    values = tuple(v for v in space.values if v in ORDER_SENSITIVE) or ("general",)
    return replace(
        space,
        values=values,
        dim=lift(space.dim),
        op_dim={op: lift(extent) for op, extent in space.op_dim.items()},
    )


def control_cases(
    space: Space, op: str, prop: str, entries: tuple[str, ...] | None = None
) -> st.SearchStrategy[Case]:
    """The cases of a negative control of ``op``: ``cases`` over ``control_space(space)``."""
    return cases(control_space(space), op, prop, entries)


__all__ = [
    "ENGINE_MAX_COMPANIONS",
    "ENGINE_MAX_TOKENS",
    "ORDER_SENSITIVE",
    "PADDINGS",
    "ShapeContext",
    "boundary_values",
    "cases",
    "cases_near_known",
    "control_cases",
    "control_space",
    "extents",
    "near",
    "out_dtype",
]
