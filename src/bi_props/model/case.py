"""The Case: what one example asks a worker to run.

A case never holds tensors. It holds shapes, dtype, layouts, a value class and integer seeds, and
the worker materialises the tensors from them deterministically. So a case is cheap to draw and to
shrink, picklable, and its ``repr`` is a line of Python that can be pasted into a reproducer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

DTYPES = ("float32", "bfloat16", "float16")
PARITY_DTYPES = ("float64", "int64", "int32", "complex64")
"""Dtypes a stock op may accept beyond the three every property draws. Only parity draws them
(one example in ``PARITY_EXTRA_EVERY``): a batch-invariant kernel that handles fewer dtypes than
the stock op it replaces breaks the contract there, raising or changing the output's dtype."""
PARITY_EXTRA_EVERY = 8
LAYOUTS = ("contiguous", "transposed", "offset", "strided")
VALUE_CLASSES = ("exact", "general", "wide", "special")
BIT_PATTERNS = "bit_patterns"
"""The value class of the exhaustive 16-bit sweep (never drawn): element i of the swept operand
holds the bit pattern ``(seed + i) mod 65536`` of the case's 16-bit dtype, every NaN payload,
infinity and subnormal included. A (256, 256) case at seed 0 holds all 65,536 patterns; a (1, 1)
case at seed p holds pattern p alone (what a sweep's finding shrinks to)."""
SWEEP_DTYPES = ("bfloat16", "float16")
PATTERNS = 1 << 16
COMPANION_CONTENTS = ("plain", "outlier", "ties", "neg_inf", "huge", "tiny")
"""What a companion's values hold (``Companion.content``), the needle's always plain: ``plain``
(the needle's value class), ``outlier`` (10^2 to 10^4 times larger: a per-tensor dynamic scale
taken over the batch moves every row), ``ties`` (small integers, half of them moved by one ulp
of the dtype: exact ties and 1-ulp near-ties, where a selection's tie rule shows), ``neg_inf``
(a row or a tile of 16 of -inf: masked logits, an all -inf tile), ``huge`` (a quarter of the
dtype's largest finite value: overflow in the batch's sums) and ``tiny`` (subnormal scale).
Shrinking goes to ``plain``."""
SWITCH_STATES = ("enabled", "disabled")
MODES = ("eager", "compiled")
"""How the worker calls a case's entry point: ``eager`` (the op's call as written) or
``compiled`` (a ``torch.compile``d wrapper of that call: Inductor, dynamic shapes, the whole call
one graph, as serving engines run a model; ``execution/compiled.py``). Eager first: shrinking
goes there."""


@dataclass(frozen=True)
class Companion:
    """Another sample sharing the batch: its own seed and its own extent along the batch axis.

    ``queries``: for ops whose samples are a cached prefix plus new query tokens (mixed
    attention), how many of its ``rows`` are new queries; 0 (the default, left out of the repr)
    means all of them (a prefill). Other ops never read it."""

    seed: int
    rows: int
    queries: int = 0
    content: str = "plain"
    """What its values hold (``COMPANION_CONTENTS``; "plain", the default, left out of the
    repr)."""

    def __repr__(self) -> str:
        tail = f", queries={self.queries!r}" if self.queries else ""
        if self.content != "plain":
            tail += f", content={self.content!r}"
        return f"Companion(seed={self.seed!r}, rows={self.rows!r}{tail})"

    @property
    def sample_seed(self) -> int:
        """Its seed as the worker draws its values from: the seed itself, or for a companion
        of another content a ``SampleSeed`` carrying it."""
        return self.seed if self.content == "plain" else SampleSeed(self.seed, self.content)


class SampleSeed(int):
    """A sample's seed with the content its values are drawn in (``COMPANION_CONTENTS``): the
    (seed, rows) pairs the worker materialises stay pairs, and a plain sample is a plain int."""

    content: str

    def __new__(cls, seed: int, content: str = "plain") -> SampleSeed:
        made = super().__new__(cls, seed)
        made.content = content
        return made

    def __reduce__(self):
        return (SampleSeed, (int(self), self.content))


@dataclass(frozen=True)
class Batch:
    """Where the needle sits in a batch of ``1 + len(companions)`` samples."""

    position: int
    companions: tuple[Companion, ...]

    @property
    def size(self) -> int:
        return 1 + len(self.companions)

    def samples(self, needle_seed: int, needle_rows: int) -> list[tuple[int, int]]:
        """(seed, rows) of every sample in batch order, the needle at ``position``."""
        order = [(c.sample_seed, c.rows) for c in self.companions]
        order.insert(self.position, (needle_seed, needle_rows))
        return order

    def needle_offset(self, needle_rows: int) -> int:
        """Index of the needle's first row along the batch axis."""
        return sum(c.rows for c in self.companions[: self.position])


@dataclass(frozen=True)
class Case:
    """One example for one catalogue op.

    ``shape`` is op-specific and documented by the op's catalogue entry (for mm: ``(m, k, n)``);
    the first entry is always the extent along the batch axis. ``options`` carries the op's keyword
    choices (``dim``, ``keepdim``, ``beta``...). ``layouts`` has one entry per tensor operand.
    """

    op: str
    entry: str
    dtype: str
    shape: tuple[int, ...]
    layouts: tuple[str, ...]
    values: str
    seed: int
    options: Mapping[str, Any] = field(default_factory=dict)
    batch: Batch | None = None
    padded: int = 0
    """Padded layout (0: packed): every sample's rows padded to this length, the per-sample
    operands laid out ``(samples, padded, ...)`` as HF models and CUDA-graph buckets pad a batch
    (``OpSpec.padded`` says which cases may be); padding rows hold poison values. Materialised
    as at least the longest sample's rows."""
    mode: str = "eager"
    """How the entry point is called (``MODES``): "eager", or "compiled" (``torch.compile``,
    Inductor, ``dynamic=True``, ``fullgraph=True``). Left out of the repr when eager."""

    def __post_init__(self) -> None:
        # Freeze options as sorted pairs so that equal cases compare and hash equal.
        items = self.options.items() if isinstance(self.options, Mapping) else self.options
        object.__setattr__(self, "options", tuple(sorted(items)))

    def opt(self, name: str, default: Any = None) -> Any:
        return dict(self.options).get(name, default)

    def with_batch(self, batch: Batch | None) -> Case:
        return replace(self, batch=batch, options=dict(self.options))

    def with_padded(self, padded: int) -> Case:
        return replace(self, padded=padded, options=dict(self.options))

    def __repr__(self) -> str:
        parts = [
            f"op={self.op!r}",
            f"entry={self.entry!r}",
            f"dtype={self.dtype!r}",
            f"shape={self.shape!r}",
            f"layouts={self.layouts!r}",
            f"values={self.values!r}",
            f"seed={self.seed!r}",
        ]
        if self.options:
            parts.append(f"options={dict(self.options)!r}")
        if self.batch is not None:
            parts.append(f"batch={self.batch!r}")
        if self.padded:
            parts.append(f"padded={self.padded!r}")
        if self.mode != "eager":
            parts.append(f"mode={self.mode!r}")
        return f"Case({', '.join(parts)})"

    def _repr_pretty_(self, printer, cycle: bool) -> None:
        """Hypothesis prints falsifying examples with this: keep our one-line, pasteable repr."""
        printer.text(repr(self))

    def __hash__(self) -> int:
        return hash(
            (
                self.op,
                self.entry,
                self.dtype,
                self.shape,
                self.layouts,
                self.values,
                self.seed,
                self.options,
                self.batch,
                self.padded,
                self.mode,
            )
        )


SIZE_CLASSES = ((16, "small"), (256, "medium"))
"""A case's size class by its largest extent (the batch's rows included): <= 16, <= 256,
else "large"."""


def case_class(case: Case) -> str:
    """The class of a failing case within its cell: dtype, layout kind (contiguous, strided,
    padded), value kind (finite, special) and size class (``SIZE_CLASSES``), as
    ``"bfloat16/strided/finite/medium"``; a compiled case's ends in ``"/compiled"`` (another
    program: Inductor's, not the eager kernels). A new bug in another dtype, layout or size is
    another class, so a known or recorded failure of one class does not hide it; shrinking keeps
    what a failure needs (a bf16-only bug shrinks within bf16), so one bug shrinks to one class."""
    if case.padded:
        layout = "padded"
    else:
        layout = "contiguous" if all(x == "contiguous" for x in case.layouts) else "strided"
    values = "special" if case.values == "special" else "finite"
    rows = case.shape[0] if case.shape else 0
    if case.batch is not None:
        rows += sum(c.rows for c in case.batch.companions)
    largest = max([rows, *case.shape[1:]], default=0)
    size = next((name for top, name in SIZE_CLASSES if largest <= top), "large")
    mode = "" if case.mode == "eager" else f"/{case.mode}"
    return f"{case.dtype}/{layout}/{values}/{size}{mode}"


def class_of(text: str | None) -> str:
    """``case_class`` of a case's repr; "" where it is no Case (a switching step sequence)."""
    try:
        return case_class(parse_case(text or ""))
    except (ValueError, TypeError):
        return ""


def case_size(case: Case) -> tuple:
    """An order on cases, smallest first: elements across the batch, then extents, companions
    and the repr (to break ties). Used to keep the smallest failing case seen while shrinking."""
    rows = case.shape[0] if case.shape else 0
    if case.batch is not None:
        rows += sum(c.rows for c in case.batch.companions)
    per_row = 1
    for extent in case.shape[1:]:
        per_row *= max(extent, 1)
    companions = 0 if case.batch is None else len(case.batch.companions)
    return (rows * per_row, sum(case.shape), companions, len(repr(case)), repr(case))


def eval_record_repr(text: str, allowed: dict[str, type], kind: str) -> object:
    """Evaluate a record's repr (a report entry, a regressions file) without executing arbitrary
    code: only calls of the ``allowed`` record types with literal arguments are accepted, and the
    result must be a ``kind`` (the name of one of them)."""
    import ast

    names = ", ".join(allowed)
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as exc:
        raise ValueError(f"not a {kind} repr: {exc}") from None
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name) or node.func.id not in allowed:
                raise ValueError(f"not a {kind} repr: call of {ast.unparse(node.func)!r}")
        elif isinstance(node, ast.Name) and node.id not in allowed and node.id != "None":
            raise ValueError(f"not a {kind} repr: name {node.id!r}")
        elif isinstance(node, (ast.Attribute, ast.Lambda, ast.Subscript, ast.NamedExpr)):
            raise ValueError(f"not a {kind} repr: only literals and {names} calls")
    value = eval(compile(tree, f"<{kind}>", "eval"), {"__builtins__": {}}, dict(allowed))
    if not isinstance(value, allowed[kind]):
        raise ValueError(f"not a {kind} repr: evaluates to {type(value).__name__}")
    return value


def parse_case(text: str) -> Case:
    """A Case from its repr (a report entry, a regressions file), without executing arbitrary code:
    only calls of Case/Batch/Companion with literal arguments are accepted."""
    allowed = {"Case": Case, "Batch": Batch, "Companion": Companion}
    return eval_record_repr(text, allowed, "Case")  # type: ignore[return-value]
