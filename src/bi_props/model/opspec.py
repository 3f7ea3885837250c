"""The op record: ``OpSpec``, ``Operand``, ``Reference`` (PyTorch's OpInfo idea, much leaner).

Each ``OpSpec`` says: which entry points exist, what a case's ``shape`` means, which operands are
per-sample (they get a batch axis and the sample's own seed) and which are shared (weights), how to
call an entry point, what the CPU float64 reference is, and when bit-exact comparison is sound.
The built-in ops are data of this record in ``bi_props.catalogue`` (one file per family); users'
ops are the same record, registered with ``register_op`` (``model/registry.py``).

Importing this module imports neither torch nor Hypothesis. References are numpy float64, so no
switched-on kernel can ever compute its own reference.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .case import LAYOUTS, Case, Companion

PRECISIONS = ("float32", "bfloat16", "float16", "output")
"""What a target may declare as an op's internal (accumulation) precision; "output" means the
output's own dtype (a 16-bit output computed in 16 bits, a float32 output in float32)."""


@dataclass(frozen=True)
class Operand:
    """One tensor argument: per-sample (``batch_axis`` set) or shared by the whole batch.

    ``tokens`` > 0 makes it an int64 tensor of token ids in [0, tokens) instead of floats."""

    name: str
    batch_axis: int | None
    tokens: int = 0


OP_PROPERTIES = ("routing", "reference", "batch_invariance", "determinism", "parity")
"""The built-in properties an op's ``OpSpec.properties`` lists by default (property_spec.py
declares each; a registered property may select ops itself through its ``ops``)."""


MODEL_PROPERTIES = ("logprobs", "decode", "determinism", "parity")


@dataclass(frozen=True)
class Reference:
    """Expected value of one output: float64 ``value``, and ``tolerance`` (None means bitwise)."""

    value: np.ndarray
    tolerance: np.ndarray | None
    dtype: str
    precision: str = "float32"
    """The internal precision the bound was computed for (the target's declaration, resolved)."""


ShapeFn = Callable[[Any, Any], tuple[tuple[int, ...], dict[str, Any]]]
"""``draw_shape(draw, ctx) -> (shape, options)``: ``draw`` is Hypothesis' draw function, ``ctx``
a ``strategies.ShapeContext``."""


@dataclass(frozen=True)
class ControlExample:
    """A case a negative control tries before its search, like Hypothesis' ``@example``: one
    known to show stock batch variance on some platform (the needle alone takes another kernel
    path than inside the batch: M = 1 against M past a tile; a strided operand reduced across
    rows once the batch fills a vector). Run in float32 with general values (``seed`` picks
    other fixed data where the variance is value-dependent); ``layouts`` name
    each operand's layout (empty: all contiguous); ``companions`` are the rows of each
    companion, the needle at ``position``. Stated in the op's data so that a control's first
    evidence never depends on the luck of a draw."""

    shape: tuple[int, ...]
    companions: tuple[int, ...]
    options: dict[str, Any] = field(default_factory=dict)
    position: int = 0
    layouts: tuple[str, ...] = ()
    seed: int = 0  # offsets the tensors' fixed seed: where variance shows only for some data

    def __post_init__(self) -> None:
        unknown = [name for name in self.layouts if name not in LAYOUTS]
        if unknown:
            raise ValueError(
                f"ControlExample{self.shape}: unknown layout(s) {unknown}; use {list(LAYOUTS)}"
            )


@dataclass(frozen=True)
class OpSpec:
    """Everything bi_props knows about one op; ``register_op`` adds a user's to ``OPS``.

    Required:

    - ``name``: stable name (reports, known-failure files, ``OPS`` of targets, ``--ops``);
    - ``entries``: entry-point names; ``call`` receives the drawn one (a target's ``entries()``
      may replace them);
    - ``shape_doc``: what ``case.shape`` means, in words (``shape[0]`` is the needle's rows);
    - ``operands(case) -> (Operand, ...)``: the tensor arguments, per-sample (``batch_axis``) or
      shared;
    - ``operand_shapes(case, rows) -> (shape, ...)``: each operand's shape for ``rows`` rows (the
      batch's total for a batched call);
    - ``call(entry, args, case, lengths)``: runs the op on torch tensors in the worker (import
      torch inside it); ``lengths`` are the rows per sample; returns a tensor or a tuple;
    - ``reference(inputs, case, lengths, acc="float32") -> (Reference, ...)``: float64 numpy
      values and allowed errors (None: bitwise) for a kernel computing internally in ``acc``;

    Optional:

    - ``exact_amplitude(case, acc="float32") -> int``: largest integer magnitude for the
      ``exact`` value class (0, the default: exactness is never claimed);
    - ``draw_shape(draw, ctx) -> (shape, options)``: the shape-and-option strategy (see
      ``strategies.ShapeContext``; the built-in ops' sit beside their specs in
      ``bi_props.catalogue``). Required to explore the op;
    - ``companion_rows(ctx) -> strategy``: rows of each companion sample of a batch (default: the
      space's ``companion_rows``, tile-edge biased); ``max_companions``: a cap on their number
      below the space's; ``sequences``: each sample is a sequence of its own (attention, paged
      decode), so a batch may also hold many short ones (the space's ``max_sequences``);
    - ``repro_call(case) -> (definitions, expression)``: source text computing the op from
      ``args`` and ``lengths`` in a standalone reproducer (``torch`` and ``F`` are imported);
      None: no reproducer script, the finding says to re-run the case with bi_props;
    - ``aten_names``: the profiler's names of aten ops that reach this op (``ATEN_TO_OP``);
    - ``padded``: which cases may take the padded layout (``Case.padded``);
    - ``sweep``: an elementwise op's exhaustive 16-bit operand (``BIT_PATTERNS``);
    - ``batchable``, ``output_batch_axes``, ``inexact_outputs``, ``properties``,
      ``option_choices``, ``bound`` (the reference's error bound, in words), ``notes``,
      ``negative_control`` (False where stock kernels cannot be batch-variant: no control),
      ``output_rows`` (how many output rows a sample owns, where that is not its input rows),
      ``companion_queries`` and ``companion_output_rows`` (a sample that is a cached prefix plus
      new query tokens: ``Companion.queries``, drawn, and the output rows they own).

    A spec never crosses a process boundary (cases name their op): every process that needs it
    (the controller, each worker, each Ray actor) registers it itself, by importing the module
    that declares it (a target's ``EXTRA_OPS``), so lambdas and closures are fine.
    """

    name: str
    entries: tuple[str, ...]
    shape_doc: str
    operands: Callable[[Case], tuple[Operand, ...]]
    operand_shapes: Callable[[Case, int], tuple[tuple[int, ...], ...]]
    call: Callable[[str, Sequence[Any], Case, Sequence[int]], Any]
    reference: Callable[[Sequence[np.ndarray], Case, Sequence[int]], tuple[Reference, ...]]
    exact_amplitude: Callable[..., int] = lambda case, acc="float32": 0
    """``(case, acc="float32")``: largest integer magnitude for the ``exact`` value class when the
    kernel accumulates in ``acc`` (0: exactness is never sound). Values are drawn with the float32
    amplitude; a target declaring a narrower precision gets the bounded reference instead."""
    batchable: Callable[[Case], bool] = lambda case: True
    """Whether 'row alone == row in a batch' means anything for this case (not for full sums)."""
    output_batch_axes: tuple[int, ...] = (0,)
    notes: str = ""
    bound: str = ""
    """The reference's error bound, in words (reports and the README quote it)."""
    option_choices: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    properties: tuple[str, ...] = OP_PROPERTIES
    inexact_outputs: tuple[int, ...] = ()
    """Outputs never exact even on exact inputs (add_rms_norm's y: a sqrt and a division)."""
    draw_shape: ShapeFn | None = None
    companion_rows: Callable[[Any], Any] | None = None
    max_companions: int | None = None
    sequences: bool = False
    """Whether each sample is a sequence of its own, the kernel seeing their count (varlen or
    paged attention: split-KV heuristics on batch x heads, a sampler's co-resident sequences):
    then a third of the batches hold many short companions, up to the space's ``max_sequences``."""
    repro_call: Callable[[Case], tuple[str, str]] | None = None
    aten_names: tuple[str, ...] = ()
    negative_control: bool = True
    """Whether stock kernels can be batch-variant on this op, so that searching its control
    properties with the switch off can show variance (a negative control). False for ops with no
    arithmetic that a batch could reorder (a gather, an argmax over the inputs themselves): such a
    control could never see variance and would only ever be "blind", so the disabled state of
    those properties is neither a control nor a cell (the enabled state is judged as usual)."""
    control_examples: tuple[ControlExample, ...] = ()
    """Cases the op's negative controls try first (see ``ControlExample``)."""
    padded: Callable[[Case], bool] | None = None
    """``(case) -> bool``: whether the case may take the padded layout (``Case.padded``): its
    per-sample operands laid out ``(samples, padded length, ...)`` with poisoned padding rows,
    the output cut back to each sample's real rows. Only for ops whose rows are independent per
    token (norms, activations, the rows of a product) and whose entry accepts leading dims; None:
    never (attention, whose contract here is packed sequences, and ops reducing across rows)."""
    sweep: Callable[[Case, np.ndarray], np.ndarray] | None = None
    """``(case, patterns) -> bits``: an elementwise op's swept operand (the first) from a
    (rows, cols) uint16 array of bit patterns, as uint16 bits of its shape (silu: the patterns;
    a gated activation: the patterns as its activation half, 1.0 as the other). Set: every
    campaign checks all 65,536 bf16 and fp16 patterns against the reference once per switch
    state (``Case.values == BIT_PATTERNS``, ``campaigns/sweep.py``)."""
    output_rows: Callable[[Case, int], int] | None = None
    """``(case, rows) -> int``: the rows along ``output_batch_axes`` that a sample of ``rows``
    input rows owns in the output (None: ``rows``, one output row per input row). A decode op,
    whose sample is a whole sequence and whose output is that sequence's next token, owns 1.
    Batch invariance cuts the needle's output rows out of the batched result with it."""

    companion_output_rows: Callable[[Case, Companion], int] | None = None
    """``(case, companion) -> int``: the output rows a companion owns where they depend on more
    than its rows (mixed attention: its query tokens, ``Companion.queries``); None:
    ``owned_rows(case, companion.rows)``."""
    companion_queries: Callable[[Any], Any] | None = None
    """``(ctx) -> strategy``: draws each companion's ``Companion.queries`` (None: never drawn,
    0)."""
    scale: str = ""
    """The axis along which the op meets deployment sizes (``deployment.AXES``: "tokens",
    "vocab", "context", "positions"; "" none): one example in the space's ``scale_every`` is
    drawn there (``ShapeContext.scaled``), within the space's ``max_elements``."""
    small_size: Callable[[Any], int] | None = None
    """``(space) -> int``: the largest size the space's small draws reach along ``scale`` for
    this op, where the axis' default does not say it (a paged sequence's context is the
    space's ``paged_context``, not its attention length); an example past it is counted as
    drawn at deployment size."""
    cost: Callable[[Case, int], int] | None = None
    """``(case, rows) -> int``: what a sample of ``rows`` rows costs, in the unit of the
    space's ``max_elements`` (None: the elements of its per-sample operands). Attention's is
    quadratic: its scores."""

    def sample_cost(self, case: Case, rows: int) -> int:
        """What a sample of ``rows`` rows costs (``cost``, else its per-sample elements)."""
        if self.cost is not None:
            return int(self.cost(case, rows))
        total = 0
        for operand, shape in zip(
            self.operands(case), self.operand_shapes(case, rows), strict=False
        ):
            if operand.batch_axis is not None:
                total += int(np.prod(shape, dtype=np.int64))
        return total

    def owned_rows(self, case: Case, rows: int) -> int:
        """Output rows of a sample with ``rows`` input rows (``output_rows``, else ``rows``)."""
        return rows if self.output_rows is None else int(self.output_rows(case, rows))

    def companion_owned_rows(self, case: Case, companion: Companion) -> int:
        """Output rows a companion owns (``companion_output_rows``, else ``owned_rows``)."""
        if self.companion_output_rows is not None:
            return int(self.companion_output_rows(case, companion))
        return self.owned_rows(case, companion.rows)

    def needle_output(self, case: Case) -> tuple[int, int]:
        """(offset, rows) of the needle's output rows inside its batch's output (offset 0 and
        the needle's own rows without a batch)."""
        rows = self.owned_rows(case, case.shape[0])
        if case.batch is None:
            return 0, rows
        before = case.batch.companions[: case.batch.position]
        return sum(self.companion_owned_rows(case, c) for c in before), rows

    def references(
        self,
        inputs: Sequence[np.ndarray],
        case: Case,
        lengths: Sequence[int],
        precision: str = "float32",
    ) -> tuple[Reference, ...]:
        """The reference with the exactness rule applied, for a kernel computing internally in the
        declared ``precision``: on the ``exact`` value class (drawn with the float32 amplitude)
        outputs are compared bit for bit against the reference rounded once to the output dtype
        where the accumulator's exact-integer range holds every partial result; elsewhere within
        the reference's stated bound, computed for that precision."""
        acc = accumulation(precision, out_dtype(case))
        refs = self.reference(inputs, case, lengths, acc)
        drawn = self.exact_amplitude(case)
        if case.values != "exact" or drawn < 1 or self.exact_amplitude(case, acc) < drawn:
            return refs
        return tuple(
            r if i in self.inexact_outputs else Reference(r.value, None, r.dtype, r.precision)
            for i, r in enumerate(refs)
        )


def out_dtype(case: Case) -> str:
    return case.opt("dtype") or case.dtype


def accumulation(precision: str, out: str) -> str:
    """The dtype a kernel's internals round in: the declared precision, "output" resolved to the
    output dtype. Unknown names are a usage error with the list of valid ones."""
    if precision not in PRECISIONS:
        raise ValueError(
            f"unknown internal precision {precision!r}; declare one of {', '.join(PRECISIONS)}"
        )
    return out if precision == "output" else precision
