"""The op catalogue, as data (PyTorch's OpInfo idea, much leaner).

Each ``OpSpec`` says: which entry points exist, what a case's ``shape`` means, which operands are
per-sample (they get a batch axis and the sample's own seed) and which are shared (weights), how to
call an entry point, what the CPU float64 reference is, and when bit-exact comparison is sound.

Importing this module imports neither torch nor Hypothesis: the controller and the strategies read
the data; only the worker calls ``call`` (which imports torch lazily). References are numpy float64,
so no switched-on kernel can ever compute its own reference.

Names (``OPS``) are stable: reports, known-failure files and third-party targets use them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .case import Case
from .compare import exact_integer_limit, smallest_normal, unit_roundoff

U32 = unit_roundoff("float32")

PRECISIONS = ("float32", "bfloat16", "float16", "output")
"""What a target may declare as an op's internal (accumulation) precision; "output" means the
output's own dtype (a 16-bit output computed in 16 bits, a float32 output in float32)."""

LAMBDA = 4.0
"""The confidence parameter of the probabilistic bounds below. Azuma-Hoeffding: a sum of
independent mean-zero rounding errors delta_k * s_k with |delta_k| <= u exceeds
LAMBDA * u * sqrt(sum s_k^2) with probability at most 2 exp(-LAMBDA^2 / 2) = 6.7e-4 per output
element (the inequality behind Higham & Mary's Theorem 2.4, for the worst distribution of
errors bounded by u). Round-to-nearest errors have a variance of at most u^2 / 3, so by the
variance form of the same inequality (Bernstein) the bound sits at 4 sqrt(3) = 6.9 standard
deviations: about 1e-11 per element. benchmarks/tightness.py measures what honest orders use
of it (at most a third, over every case it runs)."""

SIXTEEN_BIT_CAP_ULPS = 32
"""A sum computed in a 16-bit type is allowed at most this many of that type's ulps of
max(|sum|, sqrt(sum t^2)) (the typical size of a sum of random-sign terms): honest 16-bit
accumulation of 4096 random-sign terms shows about 6 (one standard deviation); without the cap the
probabilistic bound would accept an all-zero bf16 output at K = 4096."""

FALSE_ALARM = 2 * math.exp(-(LAMBDA**2) / 2)


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
CONTROL_PROPERTIES = ("batch_invariance", "logprobs", "decode")
"""The built-in control properties (``PropertySpec.control``): promised only with the switch
on; with it off they are negative controls, never failures. Kept for reference: the cells and
controls read the registry (``property_spec.PROPERTIES``), users' properties included."""


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
      ``strategies.ShapeContext``; the built-in ops' are in ``bi_props.model.shapes``). Required to
      explore the op;
    - ``companion_rows(ctx) -> strategy``: rows of each companion sample of a batch (default: the
      space's ``companion_rows``, tile-edge biased); ``max_companions``: a cap on their number
      below the space's;
    - ``repro_call(case) -> (definitions, expression)``: source text computing the op from
      ``args`` and ``lengths`` in a standalone reproducer (``torch`` and ``F`` are imported);
      None: no reproducer script, the finding says to re-run the case with bi_props;
    - ``aten_names``: the profiler's names of aten ops that reach this op (``ATEN_TO_OP``);
    - ``batchable``, ``output_batch_axes``, ``inexact_outputs``, ``properties``,
      ``option_choices``, ``bound`` (the reference's error bound, in words), ``notes``,
      ``negative_control`` (False where stock kernels cannot be batch-variant: no control),
      ``output_rows`` (how many output rows a sample owns, where that is not its input rows).

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
    repro_call: Callable[[Case], tuple[str, str]] | None = None
    aten_names: tuple[str, ...] = ()
    negative_control: bool = True
    """Whether stock kernels can be batch-variant on this op, so that searching its control
    properties with the switch off can show variance (a negative control). False for ops with no
    arithmetic that a batch could reorder (a gather, an argmax over the inputs themselves): such a
    control could never see variance and would only ever be "blind", so the disabled state of
    those properties is neither a control nor a cell (the enabled state is judged as usual)."""
    output_rows: Callable[[Case, int], int] | None = None
    """``(case, rows) -> int``: the rows along ``output_batch_axes`` that a sample of ``rows``
    input rows owns in the output (None: ``rows``, one output row per input row). A decode op,
    whose sample is a whole sequence and whose output is that sequence's next token, owns 1.
    Batch invariance cuts the needle's output rows out of the batched result with it."""

    def owned_rows(self, case: Case, rows: int) -> int:
        """Output rows of a sample with ``rows`` input rows (``output_rows``, else ``rows``)."""
        return rows if self.output_rows is None else int(self.output_rows(case, rows))

    def needle_output(self, case: Case) -> tuple[int, int]:
        """(offset, rows) of the needle's output rows inside its batch's output (offset 0 and
        the needle's own rows without a batch)."""
        rows = self.owned_rows(case, case.shape[0])
        if case.batch is None:
            return 0, rows
        before = case.batch.companions[: case.batch.position]
        return sum(self.owned_rows(case, c.rows) for c in before), rows

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

    @property
    def controls(self) -> tuple[str, ...]:
        """The properties whose disabled state is a negative control for this op (none where
        stock kernels cannot be batch-variant: see ``negative_control``)."""
        from .property_spec import PROPERTIES, properties_of

        if not self.negative_control:
            return ()
        return tuple(p for p in properties_of(self) if PROPERTIES[p].control)


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


def _bounded_amplitude(terms: int, acc: str = "float32", scale: float = 1.0) -> int:
    """Largest integer a with ``terms * a * a * scale`` within the accumulator's exact-integer
    range (2^24 for float32; the output's own for a kernel that accumulates in 16 bits).

    Then every partial sum of products of integers in [-a, a] is an integer the accumulator holds
    exactly, whatever the order, and the result is rounded once to the output dtype: the
    reference rounded once (to nearest even) is the only right answer, bit for bit.
    """
    limit = exact_integer_limit(acc)
    if terms == 0:
        return 8
    a = math.isqrt(int(limit / (max(terms, 1) * scale)))
    return min(a, 8)


def _deterministic(n: int, u: float) -> float:
    """The worst-case relative bound of n chained roundings, (1 + u)^n - 1 (Higham's gamma_n
    without its n u < 1 restriction): finite for every n, used only as a cap."""
    return math.expm1(n * math.log1p(u))


def _gamma(n: int, u: float = U32) -> float:
    """Higham & Mary's probabilistic gamma~_n(lambda) = exp(lambda sqrt(n) u + n u^2 / (1 - u)) - 1
    (N. J. Higham and T. Mary, "A New Approach to Probabilistic Rounding Error Analysis", SIAM J.
    Sci. Comput. 41(5), 2019, Theorem 2.4: |theta_n| <= gamma~_n(lambda) with probability at
    least 1 - 2 exp(-lambda^2 (1 - u)^2 / 2); for an inner product of length n, Theorem 3.1, at
    least 1 - 2 n exp(-lambda^2 (1 - u)^2 / 2)), capped by the deterministic bound. Finite."""
    probabilistic = math.expm1(LAMBDA * math.sqrt(max(n, 0)) * u + n * u * u / (1 - u))
    return min(probabilistic, _deterministic(n, u))


def _sum_error(total: Any, squares: Any, absolute: Any, n: int, u: float) -> Any:
    """Allowed error of a sum of n terms (products already rounded or not) in any value-oblivious
    order and grouping (sequential, blocked, split, pairwise), accumulated with unit roundoff u.

    Every addition rounds its partial sum s: the error is sum(delta_k s_k) + sum(delta_i t_i)
    over the additions and the products. By Azuma-Hoeffding it is within
    LAMBDA * u * sqrt(sum s_k^2 + sum t_i^2) except with probability 2 exp(-LAMBDA^2 / 2). The
    partial sums depend on the order: the drawn terms are exchangeable (independent draws), and
    for a node summing m of them E[s^2] = m^2 mean^2 + m var (n - m) / (n - 1); a sequential
    chain (nodes of every size 2..n) has the largest total. Twice that expectation stands for
    the realized one (a single dominant term at the start of the chain doubles it). Hence

        LAMBDA * u * sqrt(sum t^2 + 2 (c2 mean^2 + c1 var)),
        c2 = sum_{m=2..n} m^2,  c1 = sum_{m=2..n} m (n - m) / (n - 1),

    capped by the deterministic (1 + u)^n - 1 times sum |t|. It grows like u n for cancelling
    terms and u n^1.5 |mean| for same-sign ones, as reordering errors really do. In a 16-bit
    accumulator it is also capped at SIXTEEN_BIT_CAP_ULPS ulps of max(|sum|, sqrt(sum t^2)).
    """
    n = max(int(n), 1)
    with np.errstate(invalid="ignore", over="ignore"):
        mean = np.asarray(total, dtype=np.float64) / n
        var = np.maximum(np.asarray(squares, dtype=np.float64) / n - mean * mean, 0.0)
        c2 = n * (n + 1) * (2 * n + 1) / 6 - 1
        c1 = n * (n + 1) / 6 - 1 if n > 1 else 0.0
        spread = squares + 2 * (c2 * mean * mean + c1 * var)
        probabilistic = LAMBDA * u * np.sqrt(spread)
        bound = np.minimum(probabilistic, _deterministic(n, u) * absolute)
        if u > U32:  # a 16-bit accumulator: 2 u is one ulp at the top of a binade
            typical = np.maximum(np.abs(total), np.sqrt(squares))
            bound = np.minimum(bound, SIXTEEN_BIT_CAP_ULPS * 2 * u * typical)
        return bound


def _output_rounding(
    value: np.ndarray,
    computed_error: np.ndarray,
    dtype: str,
    magnitude: Any = None,
    acc: str = "float32",
) -> np.ndarray:
    """The stated bound: ``computed_error`` (the internals, in ``acc``), one final rounding to
    ``dtype`` (u |value|), and an absolute slack of the smallest normal number (subnormal results
    may be flushed to zero). A kernel declaring 16-bit internals (``acc`` == the 16-bit output
    dtype) may also round up to two intermediates in that dtype (a product rounded before a bias is
    added, an exp stored in bf16): 2 u ``magnitude``, where ``magnitude`` bounds the intermediate
    (the sum of absolute terms; |value| if None). A float32-accumulating kernel gets no such
    slack: an intermediate rounded through a narrower type is exactly what the check must catch.
    """
    u = unit_roundoff(dtype)
    magnitude = np.abs(value) if magnitude is None else magnitude
    narrow = acc == dtype and dtype not in ("float32", "float64")
    intermediate = 2 * u * magnitude if narrow else 0.0
    return (1 + u) * computed_error + u * np.abs(value) + intermediate + smallest_normal(dtype)


# ---------------------------------------------------------------------------------------------
# Matrix products


PRODUCT_BOUND = (
    "LAMBDA u_acc sqrt(sum t^2 + 2 E[sum s^2]) over the K products t (the sum-of-terms bound,"
    " _sum_error), capped by ((1 + u_acc)^K - 1) |A| @ |B|; plus one rounding to the output"
    " dtype and the smallest normal"
)


def _product_reference(
    a: np.ndarray, b: np.ndarray, k: int, dtype: str, acc: str = "float32"
) -> Reference:
    """A product of K terms summed in ``acc`` in any value-oblivious order (_sum_error)."""
    with np.errstate(all="ignore"):
        value = a @ b
        magnitude = np.abs(a) @ np.abs(b)
        squares = (a * a) @ (b * b)
    error = _sum_error(value, squares, magnitude, k, unit_roundoff(acc))
    return Reference(value, _output_rounding(value, error, dtype, magnitude, acc), dtype, acc)


SUM_BOUND = (
    "a sum of n terms: LAMBDA u_acc sqrt(sum x^2 + 2 E[sum s^2]) (_sum_error), capped by"
    " ((1 + u_acc)^n - 1) sum |x|; mean: / n + 2 u_acc |mean|; plus one rounding to the output"
    " dtype and the smallest normal"
)
SOFTMAX_BOUND = (
    "relative u_acc (2 |x_i - max| + 8) + 2 u_acc sum_j |x_j - max| p_j + _sum_error(sum exp) /"
    " sum exp (log_softmax: absolute, + u_acc |value|); plus one rounding to the output dtype and"
    " the smallest normal"
)
RMS_NORM_BOUND = (
    "relative _sum_error(sum x^2) / (2 sum x^2) + 8 u_acc on each output; plus one rounding to the"
    " output dtype and the smallest normal"
)


def _mm_shapes(case: Case, rows: int) -> tuple[tuple[int, ...], ...]:
    _, k, n = case.shape
    return ((rows, k), (k, n))


def _mm_call(entry: str, args: Sequence[Any], case: Case, lengths: Sequence[int]) -> Any:
    import torch

    a, b = args
    return a.mm(b) if entry == "Tensor.mm" else torch.mm(a, b)


def _mm_reference(x: Sequence[np.ndarray], case: Case, lengths: Sequence[int], acc="float32"):
    return (_product_reference(x[0], x[1], case.shape[1], out_dtype(case), acc),)


MATMUL_FORMS = ("2d", "batched", "broadcast", "vector")


def _matmul_operands(case: Case) -> tuple[Operand, ...]:
    form = case.opt("form", "2d")
    shared_rhs = form in ("2d", "broadcast", "vector")
    return (Operand("input", 0), Operand("other", None if shared_rhs else 0))


def _matmul_shapes(case: Case, rows: int) -> tuple[tuple[int, ...], ...]:
    form = case.opt("form", "2d")
    if form == "2d":
        _, k, n = case.shape
        return ((rows, k), (k, n))
    if form == "vector":
        _, k = case.shape
        return ((rows, k), (k,))
    _, m, k, n = case.shape
    if form == "batched":
        return ((rows, m, k), (rows, k, n))
    return ((rows, m, k), (k, n))


def _matmul_call(entry: str, args: Sequence[Any], case: Case, lengths: Sequence[int]) -> Any:
    import torch

    a, b = args
    return a @ b if entry == "operator.matmul" else torch.matmul(a, b)


def _matmul_reference(
    x: Sequence[np.ndarray], case: Case, lengths: Sequence[int], acc: str = "float32"
):
    form = case.opt("form", "2d")
    k = case.shape[1] if form in ("2d", "vector") else case.shape[2]
    return (_product_reference(x[0], x[1], k, out_dtype(case), acc),)


def _matmul_amplitude(case: Case, acc: str = "float32") -> int:
    form = case.opt("form", "2d")
    k = case.shape[1] if form in ("2d", "vector") else case.shape[2]
    return _bounded_amplitude(k, acc)


def _bmm_shapes(case: Case, rows: int) -> tuple[tuple[int, ...], ...]:
    _, m, k, n = case.shape
    return ((rows, m, k), (rows, k, n))


def _bmm_call(entry: str, args: Sequence[Any], case: Case, lengths: Sequence[int]) -> Any:
    import torch

    return torch.bmm(*args)


def _bmm_reference(x: Sequence[np.ndarray], case: Case, lengths: Sequence[int], acc="float32"):
    return (_product_reference(x[0], x[1], case.shape[2], out_dtype(case), acc),)


def _addmm_operands(case: Case) -> tuple[Operand, ...]:
    bias_axis = 0 if case.opt("bias", "vector") == "matrix" else None
    return (Operand("self", bias_axis), Operand("mat1", 0), Operand("mat2", None))


def _addmm_shapes(case: Case, rows: int) -> tuple[tuple[int, ...], ...]:
    _, k, n = case.shape
    bias = (rows, n) if case.opt("bias", "vector") == "matrix" else (n,)
    return (bias, (rows, k), (k, n))


def _addmm_call(entry: str, args: Sequence[Any], case: Case, lengths: Sequence[int]) -> Any:
    import torch

    c, a, b = args
    return torch.addmm(c, a, b, beta=case.opt("beta", 1), alpha=case.opt("alpha", 1))


def _addmm_reference(
    x: Sequence[np.ndarray], case: Case, lengths: Sequence[int], acc: str = "float32"
):
    """beta*C + alpha*(A@B); beta and alpha are powers of two (or 0), so scaling is exact: a sum
    of K + 1 terms (the K scaled products and the bias)."""
    c, a, b = x
    beta, alpha = case.opt("beta", 1), case.opt("alpha", 1)
    k, dtype = case.shape[1], out_dtype(case)
    with np.errstate(all="ignore"):
        product = a @ b
        c_term = beta * c if beta != 0 else np.zeros_like(product)
        value = c_term + alpha * product
        magnitude = np.abs(c_term) + abs(alpha) * (np.abs(a) @ np.abs(b))
        squares = c_term * c_term + alpha * alpha * ((a * a) @ (b * b))
    error = _sum_error(value, squares, magnitude, k + 1, unit_roundoff(acc))
    return (Reference(value, _output_rounding(value, error, dtype, magnitude, acc), dtype, acc),)


def _addmm_amplitude(case: Case, acc: str = "float32") -> int:
    k = case.shape[1]
    scale = abs(case.opt("alpha", 1)) + abs(case.opt("beta", 1))
    # A power-of-two alpha of 0.5 could make an odd integer sum a half-integer: still exact in
    # binary floating point, so only the magnitude matters.
    return _bounded_amplitude(k + 1, acc, scale)


def _linear_operands(case: Case) -> tuple[Operand, ...]:
    ops = (Operand("input", 0), Operand("weight", None))
    return (*ops, Operand("bias", None)) if case.opt("bias", True) else ops


def _linear_shapes(case: Case, rows: int) -> tuple[tuple[int, ...], ...]:
    if case.opt("form", "2d") == "3d":
        _, s, k, n = case.shape
        x = (rows, s, k)
    else:
        _, k, n = case.shape
        x = (rows, k)
    shapes: tuple[tuple[int, ...], ...] = (x, (n, k))
    return (*shapes, (n,)) if case.opt("bias", True) else shapes


def _linear_call(entry: str, args: Sequence[Any], case: Case, lengths: Sequence[int]) -> Any:
    import torch

    return torch.nn.functional.linear(*args)


def _linear_reference(
    x: Sequence[np.ndarray], case: Case, lengths: Sequence[int], acc: str = "float32"
):
    k, dtype = case.shape[-2], out_dtype(case)
    with np.errstate(all="ignore"):
        value = x[0] @ x[1].T
        magnitude = np.abs(x[0]) @ np.abs(x[1]).T
        squares = (x[0] * x[0]) @ (x[1] * x[1]).T
        if len(x) == 3:
            value = value + x[2]
            magnitude = magnitude + np.abs(x[2])
            squares = squares + x[2] * x[2]
    error = _sum_error(value, squares, magnitude, k + 1, unit_roundoff(acc))
    return (Reference(value, _output_rounding(value, error, dtype, magnitude, acc), dtype, acc),)


def _linear_amplitude(case: Case, acc: str = "float32") -> int:
    return _bounded_amplitude(case.shape[-2] + 1, acc)


# ---------------------------------------------------------------------------------------------
# Reductions


def _dims(case: Case) -> tuple[int, ...]:
    """The reduced dimensions, normalised and sorted (all of them when ``dim`` is None)."""
    rank = len(case.shape)
    dim = case.opt("dim")
    if dim is None:
        return tuple(range(rank))
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    return tuple(sorted(d % rank for d in dims)) if dims else tuple(range(rank))


def _reduced_count(case: Case) -> int:
    return math.prod(case.shape[d] for d in _dims(case))


def _x_operand(case: Case) -> tuple[Operand, ...]:
    return (Operand("input", 0),)


def _x_shape(case: Case, rows: int) -> tuple[tuple[int, ...], ...]:
    return ((rows, *case.shape[1:]),)


def _reduction_kwargs(case: Case) -> dict[str, Any]:
    import torch

    kwargs: dict[str, Any] = {}
    if case.opt("dim") is not None:
        kwargs["dim"] = case.opt("dim")
        kwargs["keepdim"] = case.opt("keepdim", False)
    if case.opt("dtype") is not None:
        kwargs["dtype"] = getattr(torch, case.opt("dtype"))
    return kwargs


def _reduce_call(name: str) -> Callable[[str, Sequence[Any], Case, Sequence[int]], Any]:
    def call(entry: str, args: Sequence[Any], case: Case, lengths: Sequence[int]) -> Any:
        import torch

        (x,) = args
        kwargs = _reduction_kwargs(case)
        if entry.startswith("Tensor."):
            return getattr(x, name)(**kwargs)
        return getattr(torch, name)(x, **kwargs)

    return call


def _reduce_reference(mean: bool):
    def reference(
        x: Sequence[np.ndarray], case: Case, lengths: Sequence[int], acc: str = "float32"
    ):
        """A sum of n terms accumulated in ``acc`` in any value-oblivious order: _sum_error."""
        dims = _dims(case)
        keep = bool(case.opt("keepdim", False)) and case.opt("dim") is not None
        n, dtype, u = _reduced_count(case), out_dtype(case), unit_roundoff(acc)
        with np.errstate(all="ignore"):
            value = np.sum(x[0], axis=dims, keepdims=keep)
            magnitude = np.sum(np.abs(x[0]), axis=dims, keepdims=keep)
            squares = np.sum(x[0] * x[0], axis=dims, keepdims=keep)
            error = _sum_error(value, squares, magnitude, n, u)
            if mean:
                value = value / n if n else np.full_like(value, np.nan)
                # One more rounding for the division (or for a reciprocal multiply: two).
                error = error / max(n, 1) + 2 * u * np.abs(value)
        intermediate = magnitude / max(n, 1) if mean else magnitude
        bound = _output_rounding(value, error, dtype, intermediate, acc)
        return (Reference(np.asarray(value), bound, dtype, acc),)

    return reference


def _reduction_batchable(case: Case) -> bool:
    return case.opt("dim") is not None and 0 not in _dims(case) and len(case.shape) > 1


def _sum_amplitude(case: Case, acc: str = "float32") -> int:
    return min(8, exact_integer_limit(acc) // max(_reduced_count(case), 1))


def _mean_amplitude(case: Case, acc: str = "float32") -> int:
    """Exact only when the count is a power of two: then the division is exact too."""
    n = _reduced_count(case)
    if n == 0 or n & (n - 1):
        return 0
    return _sum_amplitude(case, acc)


# ---------------------------------------------------------------------------------------------
# Softmax family


def _softmax_call(name: str) -> Callable[[str, Sequence[Any], Case, Sequence[int]], Any]:
    def call(entry: str, args: Sequence[Any], case: Case, lengths: Sequence[int]) -> Any:
        import torch

        (x,) = args
        dim = case.opt("dim", -1)
        dtype = getattr(torch, case.opt("dtype")) if case.opt("dtype") else None
        if entry.startswith("Tensor."):
            return getattr(x, name)(dim, dtype=dtype)
        if entry.startswith("F."):
            return getattr(torch.nn.functional, name)(x, dim=dim, dtype=dtype)
        return getattr(torch, name)(x, dim, dtype=dtype)

    return call


def _softmax_reference(log: bool):
    def reference(
        x: Sequence[np.ndarray], case: Case, lengths: Sequence[int], acc: str = "float32"
    ):
        """Computed in ``acc``: x - max (one rounding: an argument error u |x - max|), exp (that
        error, relative, plus a few ulp), a sum of n positive terms (relative error
        e_s = _sum_error / sum, plus the terms' own errors weighted by their share), one division
        or log. Hence, with d_i = |x_i - max| and p_i the softmax:
        softmax relative error <= u (2 d_i + 8) + 2 u sum_j d_j p_j + e_s; log_softmax absolute
        error <= the same + u |log_softmax|."""
        dim, dtype, u = case.opt("dim", -1), out_dtype(case), unit_roundoff(acc)
        v = x[0]
        n = v.shape[dim] if v.ndim else 1
        with np.errstate(all="ignore"):
            m = np.max(v, axis=dim, keepdims=True) if v.size else v
            shifted = v - m
            e = np.exp(shifted)
            s = np.sum(e, axis=dim, keepdims=True)
            squares = np.sum(e * e, axis=dim, keepdims=True)
            d = np.abs(shifted)
            weighted = np.sum(np.where(e > 0, d * e, 0.0), axis=dim, keepdims=True) / s
            slack = u * (2 * d + 8) + 2 * u * weighted + _sum_error(s, squares, s, n, u) / s
            if log:
                value = shifted - np.log(s)
                error = slack + u * np.abs(value)
                magnitude = np.abs(shifted) + np.abs(np.log(s))
            else:
                value = e / s
                error = slack * value
                magnitude = value
        bound = _output_rounding(value, error, dtype, magnitude, acc)
        return (Reference(value, bound, dtype, acc),)

    return reference


def _softmax_batchable(case: Case) -> bool:
    return len(case.shape) > 1 and case.opt("dim", -1) % len(case.shape) != 0


# ---------------------------------------------------------------------------------------------
# Normalisation


def _rms_norm_operands(case: Case) -> tuple[Operand, ...]:
    return (Operand("input", 0), Operand("weight", None))


def _rms_norm_shapes(case: Case, rows: int) -> tuple[tuple[int, ...], ...]:
    _, h = case.shape
    return ((rows, h), (h,))


def _eps(case: Case) -> float:
    """PyTorch's default eps is the epsilon of the *computation* type: float32's for bf16 and fp16
    inputs too (ATen's opmath type), not the input dtype's."""
    eps = case.opt("eps")
    return 2.0**-23 if eps is None else float(eps)


def _rms_norm_value(
    x: np.ndarray, w: np.ndarray, eps: float, dtype: str, acc: str = "float32"
) -> Reference:
    """mean of squares (h positive terms, relative error e_s = _sum_error / sum), + eps, sqrt,
    divide, times weight, all in ``acc``: relative error <= e_s / 2 + 8 u on each output (sqrt
    halves the relative error of its argument; 8 u covers the six single roundings after it)."""
    h, u = x.shape[-1], unit_roundoff(acc)
    with np.errstate(all="ignore"):
        sq = x * x
        total = np.sum(sq, axis=-1, keepdims=True)
        ms = total / max(h, 1)
        value = x / np.sqrt(ms + eps) * w
        relative = _sum_error(total, np.sum(sq * sq, axis=-1, keepdims=True), total, h, u)
        relative = np.where(total > 0, relative / total / 2, 0.0) + 8 * u
        error = relative * np.abs(value)
    return Reference(value, _output_rounding(value, error, dtype, None, acc), dtype, acc)


def _rms_norm_call(entry: str, args: Sequence[Any], case: Case, lengths: Sequence[int]) -> Any:
    import torch

    x, w = args
    if entry != "F.rms_norm":  # a target's own entry point (e.g. vLLM's _C kernel): (x, w, eps)
        return _entry_function(entry)(x, w, case.opt("eps"))
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), w, eps=case.opt("eps"))


def _rms_norm_reference(
    x: Sequence[np.ndarray], case: Case, lengths: Sequence[int], acc: str = "float32"
):
    return (_rms_norm_value(x[0], x[1], _eps(case), case.dtype, acc),)


def _add_rms_norm_operands(case: Case) -> tuple[Operand, ...]:
    return (Operand("x", 0), Operand("residual", 0), Operand("weight", None))


def _add_rms_norm_shapes(case: Case, rows: int) -> tuple[tuple[int, ...], ...]:
    _, h = case.shape
    return ((rows, h), (rows, h), (h,))


def _add_rms_norm_call(entry: str, args: Sequence[Any], case: Case, lengths: Sequence[int]) -> Any:
    function = _entry_function(entry)  # looked up now: swaps show
    x, residual, weight = args
    y, *rest = function(x, residual, weight, _eps(case))
    # Upstream variants return (y, rstd, x + residual) or (y, x + residual): keep y and the sum.
    return (y, rest[-1])


def _add_rms_norm_reference(
    x: Sequence[np.ndarray], case: Case, lengths: Sequence[int], acc: str = "float32"
):
    """The residual output x + residual is one rounding of an exact sum: bitwise on exact inputs,
    within one rounding otherwise. y is rms_norm of the *rounded* sum, as kernels compute it."""
    from .compare import bits_to_float64, round_to_bits

    dtype = case.dtype
    total = x[0] + x[1]
    rounded = bits_to_float64(round_to_bits(total, dtype), dtype)
    resid_tol = unit_roundoff(dtype) * np.abs(total)
    return (
        _rms_norm_value(rounded, x[2], _eps(case), dtype, acc),
        Reference(total, resid_tol, dtype, acc),
    )


def _add_rms_norm_amplitude(case: Case, acc: str = "float32") -> int:
    """Only the residual output can be exact; y involves sqrt and division."""
    return 8


# ---------------------------------------------------------------------------------------------
# Attention over packed variable-length sequences


def _attention_operands(case: Case) -> tuple[Operand, ...]:
    return (Operand("q", 0), Operand("k", 0), Operand("v", 0))


def _attention_shapes(case: Case, rows: int) -> tuple[tuple[int, ...], ...]:
    _, heads, kv_heads, head_dim = case.shape
    return ((rows, heads, head_dim), (rows, kv_heads, head_dim), (rows, kv_heads, head_dim))


def _attention_call(entry: str, args: Sequence[Any], case: Case, lengths: Sequence[int]) -> Any:
    import torch

    function = _entry_function(entry)  # looked up now: swaps show
    q, k, v = args
    cu = torch.tensor([0, *np.cumsum(lengths).tolist()], dtype=torch.int64)
    return function(q, k, v, cu, 1.0 / math.sqrt(case.shape[3]), True)


def _attention_reference(
    x: Sequence[np.ndarray], case: Case, lengths: Sequence[int], acc: str = "float32"
):
    """Causal attention per sequence. The scores carry gamma_D * scale * sum|q||k| of error; softmax
    turns a score error d into a relative weight error of about 2d, and the weighted sum of L values
    adds gamma_L; all relative to sum_j p_j |v_j|."""
    q, k, v = x
    _, heads, kv_heads, head_dim = case.shape
    scale = 1.0 / math.sqrt(head_dim)
    group = heads // kv_heads
    u = unit_roundoff(acc)
    value = np.zeros_like(q)
    error = np.zeros_like(q)
    magnitude = np.zeros_like(q)
    start = 0
    for length in lengths:
        sl = slice(start, start + length)
        start += length
        if length == 0:
            continue
        qs, ks, vs = q[sl], np.repeat(k[sl], group, axis=1), np.repeat(v[sl], group, axis=1)
        with np.errstate(all="ignore"):
            scores = np.einsum("ihd,jhd->hij", qs, ks) * scale
            score_mag = np.einsum("ihd,jhd->hij", np.abs(qs), np.abs(ks)) * scale
            mask = np.triu(np.ones((length, length), dtype=bool), 1)
            scores = np.where(mask, -np.inf, scores)
            m = scores.max(-1, keepdims=True)
            p = np.exp(scores - m)
            p = p / p.sum(-1, keepdims=True)
            out = np.einsum("hij,jhd->ihd", p, vs)
            weighted = np.einsum("hij,jhd->ihd", p, np.abs(vs))
            # d: the error of each score, per (head, query).
            d = _gamma(head_dim + 2, u) * np.where(mask, 0, score_mag).max(-1)
            spread = np.where(mask, 0, np.abs(scores - m)).max(-1)
            rel = 2 * d + u * (2 * spread + 8) + 2 * _gamma(length + head_dim, u)
            value[sl] = out
            error[sl] = rel.T[:, :, None] * weighted
            magnitude[sl] = weighted
    bound = _output_rounding(value, error, case.dtype, magnitude, acc)
    return (Reference(value, bound, case.dtype, acc),)


def _never_exact(case: Case, acc: str = "float32") -> int:
    return 0


# ---------------------------------------------------------------------------------------------
# Activation


def _silu_call(entry: str, args: Sequence[Any], case: Case, lengths: Sequence[int]) -> Any:
    import torch

    return torch.nn.functional.silu(args[0])


def _silu_reference(
    x: Sequence[np.ndarray], case: Case, lengths: Sequence[int], acc: str = "float32"
):
    """x / (1 + exp(-x)) in float32: exp (1-2 ulp), one add, one division: relative error
    <= u (|x| + 4), the |x| from exp's argument scaling its own relative error. Where exp(-x)
    overflows float32 (x < -88.72) a float32 kernel returns -0.0 for a true value of magnitude
    below 3e-37: that flush is allowed (found in stock CPU silu by this very reference)."""
    dtype = case.dtype
    with np.errstate(all="ignore"):
        value = x[0] / (1.0 + np.exp(-x[0]))
        error = unit_roundoff(acc) * (np.abs(x[0]) + 4) * np.abs(value)
        error = np.where(x[0] < -88.72, np.abs(value), error)
    return (Reference(value, _output_rounding(value, error, dtype, None, acc), dtype, acc),)


# ---------------------------------------------------------------------------------------------
# Gated activations (SwiGLU / GeGLU: vLLM's silu_and_mul, gelu_and_mul)

GELU_APPROXIMATIONS = ("none", "tanh")


def _gated_operands(case: Case) -> tuple[Operand, ...]:
    return (Operand("x", 0),)


def _gated_shapes(case: Case, rows: int) -> tuple[tuple[int, ...], ...]:
    _, h = case.shape
    return ((rows, 2 * h),)


def _entry_function(entry: str) -> Callable[..., Any]:
    """The entry point ``module.attr`` looked up now (a swapped ``bi_props.ops`` attribute, or a
    target's own kernel named by its ``entries()``, shows)."""
    import importlib

    module_name, _, attr = entry.rpartition(".")
    return getattr(importlib.import_module(module_name), attr)


def _silu_and_mul_call(entry: str, args: Sequence[Any], case: Case, lengths: Sequence[int]):
    return _entry_function(entry)(args[0])


def _gelu_and_mul_call(entry: str, args: Sequence[Any], case: Case, lengths: Sequence[int]):
    return _entry_function(entry)(args[0], case.opt("approximate", "none"))


GATED_BOUND = (
    "silu: relative u_acc (|a| + 6) on silu(a) b (exp, one add, one division, the product; the"
    " flush to 0 where exp(-a) overflows); gelu: absolute u_acc (3 |a| + 4 |gelu(a)|) |b| (1 +"
    " erf or 1 + tanh rounds absolutely, then two products); plus one rounding to the output"
    " dtype and the smallest normal (16-bit internals: the activation rounded once more)"
)


def _erf(z: np.ndarray) -> np.ndarray:
    import math

    return np.vectorize(math.erf, otypes=[np.float64])(z) if z.size else z.copy()


def _gelu_value(a: np.ndarray, approximate: str) -> np.ndarray:
    if approximate == "tanh":
        inner = math.sqrt(2.0 / math.pi) * (a + 0.044715 * a * a * a)
        return 0.5 * a * (1.0 + np.tanh(inner))
    return 0.5 * a * (1.0 + _erf(a / math.sqrt(2.0)))


def _gated_reference(kind: str):
    def reference(
        x: Sequence[np.ndarray], case: Case, lengths: Sequence[int], acc: str = "float32"
    ):
        """act(a) * b in float64, a = x[:, :h], b = x[:, h:], for a kernel computing in ``acc``.

        silu: exp (a couple of ulps), 1 + e, a / (1 + e), times b: relative <= u (|a| + 6);
        where exp(-a) overflows float32 (a < -88.72) a signed zero is allowed. gelu: erf (or tanh
        of the cubic) within ~3 u absolute, 1 + that rounds absolutely (u), then 0.5 a (...) and
        the product with b: |error| <= u (3 |a| + 4 |gelu(a)|) |b| (absolute: 1 + erf cancels for
        a << 0, as every float32 kernel computes it). A 16-bit-internal kernel may round act(a)
        in the output dtype before the product (output_rounding's intermediate slack)."""
        (v,) = x
        h, u = case.shape[1], unit_roundoff(acc)
        a, b = v[:, :h], v[:, h:]
        with np.errstate(all="ignore"):
            if kind == "silu":
                act = a / (1.0 + np.exp(-a))
                value = act * b
                error = u * (np.abs(a) + 6) * np.abs(value)
                error = np.where(a < -88.72, np.abs(value), error)
            else:
                act = _gelu_value(a, case.opt("approximate", "none"))
                value = act * b
                error = u * (3 * np.abs(a) + 4 * np.abs(act)) * np.abs(b)
        bound = _output_rounding(value, error, out_dtype(case), None, acc)
        return (Reference(value, bound, out_dtype(case), acc),)

    return reference


_STOCK_SILU_AND_MUL = '''
def silu_and_mul(x):
    """Stock composite (vLLM's SiluAndMul.forward_native): silu(x[..., :h]) * x[..., h:]."""
    h = x.shape[-1] // 2
    return F.silu(x[..., :h]) * x[..., h:]
'''

_STOCK_GELU_AND_MUL = '''
def gelu_and_mul(x, approximate="none"):
    """Stock composite (vLLM's GeluAndMul.forward_native): gelu(x[..., :h]) * x[..., h:]."""
    h = x.shape[-1] // 2
    return F.gelu(x[..., :h], approximate=approximate) * x[..., h:]
'''


def _stock_or_import(case: Case, stock: str, name: str) -> str:
    module, _, attr = case.entry.rpartition(".")
    return stock if module == "bi_props.ops" else f"from {module} import {attr} as {name}\n"


def _silu_and_mul_repro(case: Case) -> tuple[str, str]:
    return _stock_or_import(case, _STOCK_SILU_AND_MUL, "silu_and_mul"), "silu_and_mul(args[0])"


def _gelu_and_mul_repro(case: Case) -> tuple[str, str]:
    definition = _stock_or_import(case, _STOCK_GELU_AND_MUL, "gelu_and_mul")
    return definition, f"gelu_and_mul(args[0], {case.opt('approximate', 'none')!r})"


# ---------------------------------------------------------------------------------------------
# vLLM's in-place fused_add_rms_norm, layer_norm, embedding


def _fused_add_rms_norm_call(
    entry: str, args: Sequence[Any], case: Case, lengths: Sequence[int]
) -> Any:
    """The op mutates x and residual: it runs on copies with the same shape and strides (so that
    determinism's second call and the reference see the drawn inputs), and the op's outputs are
    the two mutated copies (x <- rms_norm(x + residual) * weight, residual <- x + residual),
    whatever the entry point returns: the in-place semantics are what is tested."""
    import torch

    x, residual, weight = args

    def copy(t: Any) -> Any:
        out = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
        return out.copy_(t)

    xc, rc = copy(x), copy(residual)
    _entry_function(entry)(xc, rc, weight, float(case.opt("eps", 1e-6)))
    return (xc, rc)


def _fused_add_rms_norm_reference(
    x: Sequence[np.ndarray], case: Case, lengths: Sequence[int], acc: str = "float32"
):
    """As add_rms_norm's (x_out is rms_norm of the rounded sum times weight, residual_out the sum
    rounded once), with the case's eps."""
    from .compare import bits_to_float64, round_to_bits

    dtype = case.dtype
    total = x[0] + x[1]
    rounded = bits_to_float64(round_to_bits(total, dtype), dtype)
    resid_tol = unit_roundoff(dtype) * np.abs(total)
    eps = float(case.opt("eps", 1e-6))
    return (
        _rms_norm_value(rounded, x[2], eps, dtype, acc),
        Reference(total, resid_tol, dtype, acc),
    )


_STOCK_FUSED_ADD_RMS_NORM = '''
def fused_add_rms_norm(x, residual, weight, eps):
    """Stock composite, vLLM semantics, in place: residual += x; x = rms_norm(residual) * weight."""
    residual.add_(x)
    x.copy_(F.rms_norm(residual, tuple(weight.shape), weight, eps))
    return x, residual
'''


def _fused_add_rms_norm_repro(case: Case) -> tuple[str, str]:
    definition = _stock_or_import(case, _STOCK_FUSED_ADD_RMS_NORM, "fused_add_rms_norm")
    eps = float(case.opt("eps", 1e-6))
    expr = (
        f"(lambda x, r: (fused_add_rms_norm(x, r, args[2], {eps!r}), (x, r))[1])"
        "(args[0].clone(), args[1].clone())"
    )
    return definition, expr


def _layer_norm_operands(case: Case) -> tuple[Operand, ...]:
    ops = (Operand("input", 0),)
    return (*ops, Operand("weight", None), Operand("bias", None)) if case.opt("affine") else ops


def _layer_norm_shapes(case: Case, rows: int) -> tuple[tuple[int, ...], ...]:
    _, h = case.shape
    return ((rows, h), (h,), (h,)) if case.opt("affine") else ((rows, h),)


def _layer_norm_call(entry: str, args: Sequence[Any], case: Case, lengths: Sequence[int]) -> Any:
    import torch

    x, *affine = args
    w, b = affine if affine else (None, None)
    eps = float(case.opt("eps", 1e-5))
    if entry != "F.layer_norm":  # a target's own kernel: (x, weight, bias, eps)
        return _entry_function(entry)(x, w, b, eps)
    return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, eps)


LAYER_NORM_BOUND = (
    "mean: _sum_error / h + u_acc |mean|; d = x - mean: that + u_acc |d|; var: (2 sum |d| e_d +"
    " sum e_d^2 + _sum_error(sum d^2) + 4 u_acc sum x^2) / h + u_acc var (two-pass, Welford or"
    " one-pass E[x^2] - mean^2 alike); rstd relative e_var / (2 (var + eps)) + 4 u_acc; y = d rstd"
    " w + b: (e_d + (rel_rstd + 2 u_acc) |d|) rstd |w| + u_acc |y|; plus one rounding to the"
    " output dtype and the smallest normal"
)


def _layer_norm_reference(
    x: Sequence[np.ndarray], case: Case, lengths: Sequence[int], acc: str = "float32"
):
    """(x - mean) / sqrt(var + eps) * w + b over the last dim (biased variance), in float64,
    with the error of a kernel computing in ``acc`` (LAYER_NORM_BOUND, in words)."""
    v, *affine = x
    h, u, eps = case.shape[1], unit_roundoff(acc), float(case.opt("eps", 1e-5))
    n = max(h, 1)
    with np.errstate(all="ignore"):
        total = np.sum(v, axis=-1, keepdims=True)
        mean = total / n
        e_mean = _sum_error(
            total, np.sum(v * v, axis=-1, keepdims=True), np.sum(np.abs(v), -1, keepdims=True), n, u
        )
        e_mean = e_mean / n + u * np.abs(mean)
        d = v - mean
        e_d = e_mean + u * np.abs(d)
        sq = d * d
        ssq = np.sum(sq, axis=-1, keepdims=True)
        var = ssq / n
        e_var = 2 * np.sum(np.abs(d) * e_d, -1, keepdims=True) + np.sum(
            e_d * e_d, -1, keepdims=True
        )
        e_var = e_var + _sum_error(ssq, np.sum(sq * sq, -1, keepdims=True), ssq, n, u)
        e_var = (e_var + 4 * u * np.sum(v * v, -1, keepdims=True)) / n + u * var
        rstd = 1.0 / np.sqrt(var + eps)
        rel_rstd = e_var / (2 * (var + eps)) + 4 * u
        y = d * rstd
        error = (e_d + (rel_rstd + 2 * u) * np.abs(d)) * rstd
        if affine:
            w, b = affine
            y = y * w + b
            error = error * np.abs(w) + u * np.abs(y)
    bound = _output_rounding(y, error, case.dtype, None, acc)
    return (Reference(y, bound, case.dtype, acc),)


def _layer_norm_repro(case: Case) -> tuple[str, str]:
    eps = float(case.opt("eps", 1e-5))
    if case.opt("affine"):
        return "", f"F.layer_norm(args[0], (args[0].shape[-1],), args[1], args[2], {eps!r})"
    return "", f"F.layer_norm(args[0], (args[0].shape[-1],), None, None, {eps!r})"


def _embedding_operands(case: Case) -> tuple[Operand, ...]:
    return (Operand("input", 0, tokens=case.shape[1]), Operand("weight", None))


def _embedding_shapes(case: Case, rows: int) -> tuple[tuple[int, ...], ...]:
    _, vocab, h = case.shape
    return ((rows,), (vocab, h))


def _embedding_call(entry: str, args: Sequence[Any], case: Case, lengths: Sequence[int]) -> Any:
    import torch

    if entry != "F.embedding":  # a target's own kernel: (ids, weight)
        return _entry_function(entry)(args[0], args[1])
    return torch.nn.functional.embedding(args[0], args[1])


def _embedding_reference(
    x: Sequence[np.ndarray], case: Case, lengths: Sequence[int], acc: str = "float32"
):
    """A gather: weight[ids], bit for bit, always (no arithmetic)."""
    ids, weight = x
    value = weight[np.asarray(ids, dtype=np.int64)]
    return (Reference(value, None, case.dtype, acc),)


# ---------------------------------------------------------------------------------------------
# The probe model (model-level properties)

MODEL_LAYOUTS = ("packed", "padded")


def _model_operands(case: Case) -> tuple[Operand, ...]:
    return (Operand("tokens", 0, tokens=case.shape[5]), Operand("weights", None))


def _model_shapes(case: Case, rows: int) -> tuple[tuple[int, ...], ...]:
    _, layers, heads, kv_heads, head_dim, vocab, inter = case.shape
    hidden = heads * head_dim
    per_layer = 2 * hidden + (heads + 2 * kv_heads) * head_dim * hidden
    per_layer += hidden * heads * head_dim + 3 * inter * hidden
    count = 2 * vocab * hidden + hidden + layers * per_layer
    return ((rows,), (count,))


def _model_call(entry: str, args: Sequence[Any], case: Case, lengths: Sequence[int]) -> Any:
    from ..execution.probe_model import ProbeModel, config_of, prefill_then_decode, run_batch

    tokens, weights = args
    model = ProbeModel(weights, config_of(case.shape), dict(case.opt("entries", ()) or ()))
    if case.opt("mode") == "decode":
        return prefill_then_decode(model, tokens)
    return run_batch(model, tokens, list(lengths), entry)


def _no_reference(x: Sequence[np.ndarray], case: Case, lengths: Sequence[int], acc="float32"):
    raise NotImplementedError("the probe model has no float64 reference; use logprobs/decode")


# ---------------------------------------------------------------------------------------------
# A real inference engine (vLLM's LLM on a tiny random model: the vllm-engine target)

ENGINE_VOCAB = 512
"""The tiny model's vocabulary
(bi_props.integrations.engine.write_tiny_model(vocab=ENGINE_VOCAB))."""
ENGINE_SPECIAL_TOKENS = 4
"""Token ids below this are the tokenizer's specials (unk, bos, eos, pad): prompts avoid them."""
ENGINE_MAX_TOKENS = 24
ENGINE_MAX_COMPANIONS = 7
"""Prompts of 1..24 tokens, a needle and at most 7 companion prompts (the engine is built with
max_num_seqs=16 and max_model_len=128)."""


def _engine_operands(case: Case) -> tuple[Operand, ...]:
    """Token ids drawn in [0, vocab - 4); the call shifts them to [4, vocab)."""
    return (Operand("tokens", 0, tokens=case.shape[1] - ENGINE_SPECIAL_TOKENS),)


def _engine_shapes(case: Case, rows: int) -> tuple[tuple[int, ...], ...]:
    return ((rows,),)


def _engine_call(entry: str, args: Sequence[Any], case: Case, lengths: Sequence[int]) -> Any:
    function = _entry_function(entry)  # looked up now: swaps show
    (tokens,) = args
    return function(tokens + ENGINE_SPECIAL_TOKENS, list(lengths))


def _engine_no_reference(
    x: Sequence[np.ndarray], case: Case, lengths: Sequence[int], acc: str = "float32"
):
    raise NotImplementedError("the engine has no float64 reference; use logprobs/determinism")


# ---------------------------------------------------------------------------------------------
# Shape strategies (bi_props.model.shapes, imported lazily: it imports Hypothesis) and reproducer
# text


def _shapes(name: str) -> ShapeFn:
    """``bi_props.model.shapes.<name>``, imported on the first draw (this module imports no
    Hypothesis)."""

    def draw_shape(draw: Any, ctx: Any) -> tuple[tuple[int, ...], dict[str, Any]]:
        from . import shapes

        return getattr(shapes, name)(draw, ctx)

    draw_shape.__qualname__ = draw_shape.__name__ = f"shapes.{name}"
    return draw_shape


def _companions(name: str) -> Callable[[Any], Any]:
    def companion_rows(ctx: Any) -> Any:
        from . import shapes

        return getattr(shapes, name)(ctx)

    companion_rows.__qualname__ = companion_rows.__name__ = f"shapes.{name}"
    return companion_rows


def _dtype_kw(case: Case) -> str:
    dtype = case.opt("dtype")
    return f"torch.{dtype}" if dtype else "None"


def _fixed_repro(expression: str) -> Callable[[Case], tuple[str, str]]:
    def repro_call(case: Case) -> tuple[str, str]:
        return "", expression

    return repro_call


def _mm_repro(case: Case) -> tuple[str, str]:
    return "", "args[0].mm(args[1])" if case.entry == "Tensor.mm" else "torch.mm(args[0], args[1])"


def _matmul_repro(case: Case) -> tuple[str, str]:
    return "", "args[0] @ args[1]" if case.entry == "operator.matmul" else "torch.matmul(*args)"


def _addmm_repro(case: Case) -> tuple[str, str]:
    beta, alpha = case.opt("beta", 1), case.opt("alpha", 1)
    return "", f"torch.addmm(args[0], args[1], args[2], beta={beta!r}, alpha={alpha!r})"


def _reduce_repro(case: Case) -> tuple[str, str]:
    op, entry = case.op, case.entry
    kwargs = []
    if case.opt("dim") is not None:
        kwargs += [f"dim={case.opt('dim')!r}", f"keepdim={case.opt('keepdim', False)!r}"]
    if case.opt("dtype"):
        kwargs.append(f"dtype={_dtype_kw(case)}")
    joined = ", ".join(kwargs)
    if entry.startswith("Tensor."):
        return "", f"args[0].{op}({joined})"
    return "", f"torch.{op}(args[0]{', ' if joined else ''}{joined})"


def _softmax_repro(case: Case) -> tuple[str, str]:
    op, entry = case.op, case.entry
    dim, dtype = case.opt("dim", -1), _dtype_kw(case)
    if entry.startswith("Tensor."):
        return "", f"args[0].{op}({dim!r}, dtype={dtype})"
    if entry.startswith("F."):
        return "", f"F.{op}(args[0], dim={dim!r}, dtype={dtype})"
    return "", f"torch.{op}(args[0], {dim!r}, dtype={dtype})"


def _rms_norm_repro(case: Case) -> tuple[str, str]:
    if case.entry != "F.rms_norm":
        module, _, attr = case.entry.rpartition(".")
        return f"from {module} import {attr} as rms_norm\n", (
            f"rms_norm(args[0], args[1], {case.opt('eps')!r})"
        )
    return "", f"F.rms_norm(args[0], (args[0].shape[-1],), args[1], eps={case.opt('eps')!r})"


_STOCK_ADD_RMS_NORM = '''
def add_rms_norm(x, residual, weight, eps=None):
    """Stock composite: (rms_norm(x + residual) * weight, x + residual)."""
    total = x + residual
    return F.rms_norm(total, tuple(weight.shape), weight, eps), total
'''


def _add_rms_norm_repro(case: Case) -> tuple[str, str]:
    module, _, attr = case.entry.rpartition(".")
    if module == "bi_props.ops":
        definition = _STOCK_ADD_RMS_NORM
    else:
        definition = f"from {module} import {attr} as add_rms_norm\n"
    expr = f"(lambda y, *rest: (y, rest[-1]))(*add_rms_norm(*args, {_eps(case)!r}))"
    return definition, expr


# ---------------------------------------------------------------------------------------------
# Inference ops: rotary_embedding, greedy_argmax, top_k

ROTARY_BOUND = (
    "each rotated element is x1 cos - x2 sin (or x2 cos + x1 sin): two products and one add,"
    " 2 u_acc (|x1 cos| + |x2 sin|); the pass-through part exact; plus one rounding to the output"
    " dtype and the smallest normal"
)


def _rotary_operands(case: Case) -> tuple[Operand, ...]:
    """positions (int64 in [0, max_position)), query and key per token; the cache shared."""
    max_position = case.shape[5]
    return (
        Operand("positions", 0, tokens=max_position),
        Operand("query", 0),
        Operand("key", 0),
        Operand("cos_sin_cache", None),
    )


def _rotary_shapes(case: Case, rows: int) -> tuple[tuple[int, ...], ...]:
    _, heads, kv_heads, head_size, rot_dim, max_position = case.shape
    query, key = (rows, heads * head_size), (rows, kv_heads * head_size)
    return ((rows,), query, key, (max_position, rot_dim))


def _rotary_call(entry: str, args: Sequence[Any], case: Case, lengths: Sequence[int]) -> Any:
    function = _entry_function(entry)  # looked up now: swaps show
    positions, query, key, cache = args
    return tuple(function(positions, query, key, case.shape[3], cache, case.opt("is_neox", True)))


def _rotary_value(
    x: np.ndarray, cos: np.ndarray, sin: np.ndarray, head_size: int, rot_dim: int, neox: bool
) -> tuple[np.ndarray, np.ndarray]:
    """(value, magnitude) of x (tokens, heads * head_size) rotated, in float64; magnitude is
    |x1 cos| + |x2 sin| on rotated elements (what the products' roundings scale with), |x| on
    the pass-through part."""
    tokens = x.shape[0]
    h = x.reshape(tokens, x.shape[1] // head_size, head_size)
    value, magnitude = h.copy(), np.abs(h)
    c, s = cos[:, None, :], sin[:, None, :]
    half = rot_dim // 2
    if neox:
        first, second = slice(0, half), slice(half, rot_dim)
    else:
        first, second = slice(0, rot_dim, 2), slice(1, rot_dim, 2)
    x1, x2 = h[..., first], h[..., second]
    with np.errstate(all="ignore"):
        value[..., first] = x1 * c - x2 * s
        value[..., second] = x2 * c + x1 * s
        magnitude[..., first] = np.abs(x1 * c) + np.abs(x2 * s)
        magnitude[..., second] = np.abs(x2 * c) + np.abs(x1 * s)
    return value.reshape(x.shape), magnitude.reshape(x.shape)


def _rotary_reference(
    x: Sequence[np.ndarray], case: Case, lengths: Sequence[int], acc: str = "float32"
):
    """vLLM's rotary embedding in float64 from the same cache values: cos = cache[p, :rot/2],
    sin = cache[p, rot/2:]; neox rotates the halves of the first rot_dim elements of each head,
    gpt-j the interleaved pairs; the rest of the head passes through. Each rotated element is two
    products and one add in ``acc``: error <= 2 u_acc (|x1 cos| + |x2 sin|) (an FMA rounds less)."""
    positions, query, key, cache = x
    _, _, _, head_size, rot_dim, _ = case.shape
    neox = bool(case.opt("is_neox", True))
    picked = cache[np.asarray(positions, dtype=np.int64)]
    cos, sin = picked[:, : rot_dim // 2], picked[:, rot_dim // 2 :]
    u, dtype = unit_roundoff(acc), case.dtype
    refs = []
    for operand in (query, key):
        value, magnitude = _rotary_value(operand, cos, sin, head_size, rot_dim, neox)
        rotated = np.zeros(value.shape, dtype=bool)
        heads = value.shape[1] // head_size
        rotated.reshape(value.shape[0], heads, head_size)[..., :rot_dim] = True
        error = np.where(rotated, 2 * u * magnitude, 0.0)
        bound = _output_rounding(value, error, dtype, np.where(rotated, magnitude, 0.0), acc)
        refs.append(Reference(value, bound, dtype, acc))
    return tuple(refs)


def _rotary_repro(case: Case) -> tuple[str, str]:
    module, _, attr = case.entry.rpartition(".")
    head_size, neox = case.shape[3], bool(case.opt("is_neox", True))
    definition = f"import {module} as _rope_module  # looked up at call time (a target swaps it)\n"
    expr = f"_rope_module.{attr}(args[0], args[1], args[2], {head_size}, args[3], {neox!r})"
    return definition, expr


TIE_AMPLITUDE = 2
"""The ``exact`` value class of the selection ops (greedy_argmax, top_k): integers in [-2, 2], so
a row of more than five logits always has ties (the tie rule is what gets tested)."""


def _logits_operand(case: Case) -> tuple[Operand, ...]:
    return (Operand("logits", 0),)


def _argmax_call(entry: str, args: Sequence[Any], case: Case, lengths: Sequence[int]) -> Any:
    import torch

    (logits,) = args
    if entry == "Tensor.argmax":
        return logits.argmax(dim=-1)
    if entry == "torch.argmax":
        return torch.argmax(logits, dim=-1)
    return _entry_function(entry)(logits)  # a target's own kernel (e.g. vLLM's _C greedy_argmax)


def _argmax_reference(
    x: Sequence[np.ndarray], case: Case, lengths: Sequence[int], acc: str = "float32"
):
    """The index of each row's largest logit, ties to the lowest index (vLLM's greedy sampling):
    numpy's argmax of the float64 values, which are the inputs exactly. Exact in every dtype."""
    (logits,) = x
    if logits.shape[-1] == 0:
        value = np.zeros(logits.shape[:-1], dtype=np.float64)
    else:
        value = np.argmax(logits, axis=-1).astype(np.float64)
    return (Reference(value, None, "int64", acc),)


def _selection_amplitude(case: Case, acc: str = "float32") -> int:
    """A selection compares inputs and never rounds: exact whatever the accumulator."""
    return TIE_AMPLITUDE


def _argmax_repro(case: Case) -> tuple[str, str]:
    if case.entry == "Tensor.argmax":
        return "", "args[0].argmax(dim=-1)"
    return "", "torch.argmax(args[0], dim=-1)"


def _top_k_call(entry: str, args: Sequence[Any], case: Case, lengths: Sequence[int]) -> Any:
    function = _entry_function(entry)  # looked up now: swaps show
    return tuple(function(args[0], case.opt("k", 1)))


def _top_k_reference(
    x: Sequence[np.ndarray], case: Case, lengths: Sequence[int], acc: str = "float32"
):
    """The k largest logits of each row in descending order and their indices, ties to the
    lowest index (a stable descending sort): both exact in every dtype (a selection of inputs)."""
    (logits,) = x
    k = case.opt("k", 1)
    order = np.argsort(-logits, axis=-1, kind="stable")[..., :k]
    values = np.take_along_axis(logits, order, axis=-1)
    return (
        Reference(values, None, case.dtype, acc),
        Reference(order.astype(np.float64), None, "int64", acc),
    )


def _top_k_repro(case: Case) -> tuple[str, str]:
    module, _, attr = case.entry.rpartition(".")
    definition = f"import {module} as _top_k_module  # looked up at call time (a target swaps it)\n"
    return definition, f"_top_k_module.{attr}(args[0], {case.opt('k', 1)!r})"


# ---------------------------------------------------------------------------------------------
# A fused MoE block (vLLM's fused_moe: router top-k, per-expert SiLU-gated GEMMs, weighted sum)

FUSED_MOE_BOUND = (
    "selection exact (the topk largest logits, ties to the lowest expert index); routing weights"
    " within softmax's bound (over the k selected logits, or all E without renormalize); per"
    " selected expert: h = w1 x within the sum-of-terms bound over H (+ u_acc |h|), silu(g) v"
    " within |silu'(g) v| e_g + |silu(g)| e_v + u_acc ((1 - sigmoid(g)) |g| + 7) |act|, y = w2"
    " act within the"
    " sum-of-terms bound over I + min(|w2| e_act, LAMBDA sqrt(w2^2 e_act^2)) (+ u_acc |y|); the"
    " weighted sum within sum_j"
    " (e_p |y| + p e_y) + the sum-of-terms bound over k; plus one rounding to the output dtype and"
    " the smallest normal"
)


def _fused_moe_operands(case: Case) -> tuple[Operand, ...]:
    """hidden_states and the router logits per token; the experts' weights shared."""
    return (
        Operand("hidden_states", 0),
        Operand("w1", None),
        Operand("w2", None),
        Operand("gating_output", 0),
    )


def _fused_moe_shapes(case: Case, rows: int) -> tuple[tuple[int, ...], ...]:
    _, hidden, inter, experts, _ = case.shape
    return ((rows, hidden), (experts, 2 * inter, hidden), (experts, hidden, inter), (rows, experts))


def _fused_moe_call(entry: str, args: Sequence[Any], case: Case, lengths: Sequence[int]) -> Any:
    hidden_states, w1, w2, gating_output = args
    topk, renormalize = case.shape[4], bool(case.opt("renormalize", True))
    return _entry_function(entry)(hidden_states, w1, w2, gating_output, topk, renormalize)


def _fused_moe_selection(gating: np.ndarray, topk: int) -> np.ndarray:
    """The topk experts of each token by logit, descending, ties to the lowest index (a stable
    sort of the logits themselves: the float64 values are the operands exactly)."""
    return np.argsort(-gating, axis=-1, kind="stable")[:, :topk]


def _fused_moe_weights(
    gating: np.ndarray, ids: np.ndarray, renormalize: bool, u: float
) -> tuple[np.ndarray, np.ndarray]:
    """(p, error of p): the softmax of the selected logits (renormalize) or of all logits,
    picked; its error as softmax's reference states it (relative u (2 d_j + 8) + 2 u sum_s d_s
    p_s + the normaliser's sum error over its n terms)."""
    selected = np.take_along_axis(gating, ids, axis=-1)
    pool = selected if renormalize else gating
    n = pool.shape[-1]
    with np.errstate(all="ignore"):
        top = np.max(pool, axis=-1, keepdims=True)
        e = np.exp(pool - top)
        s = np.sum(e, axis=-1, keepdims=True)
        squares = np.sum(e * e, axis=-1, keepdims=True)
        weighted = np.sum(np.where(e > 0, np.abs(pool - top) * e, 0.0), axis=-1, keepdims=True) / s
        d = np.abs(selected - top)
        p = np.exp(selected - top) / s
        relative = u * (2 * d + 8) + 2 * u * weighted + _sum_error(s, squares, s, n, u) / s
    return p, relative * p


def _fused_moe_expert(
    x: np.ndarray, w1: np.ndarray, w2: np.ndarray, u: float
) -> tuple[np.ndarray, np.ndarray]:
    """(y, error of y) of one expert for the rows x (n, H): y = w2 silu_and_mul(w1 x)."""
    inter = w2.shape[-1]
    hidden = x.shape[-1]
    with np.errstate(all="ignore"):
        h = x @ w1.T
        h_error = _sum_error(h, (x * x) @ (w1 * w1).T, np.abs(x) @ np.abs(w1).T, hidden, u)
        h_error = h_error + u * np.abs(h)
        g, v = h[:, :inter], h[:, inter:]
        eg, ev = h_error[:, :inter], h_error[:, inter:]
        sigmoid = 1.0 / (1.0 + np.exp(-g))
        silu = g * sigmoid
        slope = np.abs(sigmoid * (1.0 + g * (1.0 - sigmoid)))  # |silu'(g)| <= 1.1
        act = silu * v
        # exp(-g)'s relative error (u (|g| + c) in float32 kernels) reaches silu(g) scaled by
        # exp(-g) / (1 + exp(-g)) = 1 - sigmoid(g): nothing where g >> 0 (silu(g) = g)
        own = u * ((1.0 - sigmoid) * np.abs(g) + 7) * np.abs(act)
        act_error = slope * np.abs(v) * eg + np.abs(silu) * ev + own
        # where exp(-g) overflows float32 (g < -88.72) a float32 kernel's silu is a signed zero
        act_error = np.where(g - eg < -88.72, act_error + np.abs(act), act_error)
        y = act @ w2.T
        y_error = _sum_error(y, (act * act) @ (w2 * w2).T, np.abs(act) @ np.abs(w2).T, inter, u)
        # act's errors are independent sums of roundings, each within act_error: their weighted
        # sum is within LAMBDA sqrt(sum (w2 e_act)^2) (Azuma-Hoeffding, as in _sum_error),
        # capped by the worst case |w2| e_act
        worst = act_error @ np.abs(w2).T
        likely = LAMBDA * np.sqrt((act_error * act_error) @ (w2 * w2).T)
        y_error = y_error + np.minimum(worst, likely) + u * np.abs(y)
    return y, y_error


def _fused_moe_reference(
    x: Sequence[np.ndarray], case: Case, lengths: Sequence[int], acc: str = "float32"
):
    """vLLM's fused_moe in float64, for a kernel computing in ``acc``.

    The selection is exact: the topk largest logits (ties to the lowest expert index), chosen on
    the operand values themselves, as vLLM's CPU router selects (torch.topk on the logits, then
    softmax). A kernel that selects on softmax values it rounded may break a near-tie the other
    way (two different logits whose rounded softmax is equal): that disagrees with this op's
    semantics and is reported. The rest is bounded: the routing weights as softmax's reference
    bounds them, each expert's two GEMMs by the sum-of-terms bound with the first one's error
    propagated through silu_and_mul and w2 (as independent errors: LAMBDA sqrt(sum (w2 e_act)^2),
    capped by the worst case |w2| e_act), the weighted sum over the k selected experts in the
    worst case (FUSED_MOE_BOUND)."""
    hidden, w1, w2, gating = x
    topk, renormalize = case.shape[4], bool(case.opt("renormalize", True))
    u, dtype = unit_roundoff(acc), case.dtype
    tokens, size = hidden.shape
    ids = _fused_moe_selection(gating, topk)
    p, p_error = _fused_moe_weights(gating, ids, renormalize, u)
    y = np.zeros((tokens, topk, size))
    y_error = np.zeros((tokens, topk, size))
    for expert in np.unique(ids):
        token, slot = np.nonzero(ids == expert)
        y[token, slot], y_error[token, slot] = _fused_moe_expert(
            hidden[token], w1[expert], w2[expert], u
        )
    with np.errstate(all="ignore"):
        terms = p[..., None] * y
        value = np.sum(terms, axis=1)
        magnitude = np.sum(np.abs(terms), axis=1)
        propagated = np.sum(p_error[..., None] * np.abs(y) + p[..., None] * y_error, axis=1)
        error = propagated + _sum_error(value, np.sum(terms * terms, axis=1), magnitude, topk, u)
    bound = _output_rounding(value, error, dtype, magnitude, acc)
    return (Reference(value, bound, dtype, acc),)


def _fused_moe_amplitude(case: Case, acc: str = "float32") -> int:
    """The exact class draws integers in [-2, 2] so that router logits tie often (the tie rule is
    what gets tested); the output is never exact (softmax, SiLU): ``inexact_outputs``."""
    return TIE_AMPLITUDE


def _fused_moe_repro(case: Case) -> tuple[str, str]:
    module, _, attr = case.entry.rpartition(".")
    topk, renormalize = case.shape[4], bool(case.opt("renormalize", True))
    definition = f"import {module} as _moe_module  # looked up at call time (a target swaps it)\n"
    return definition, f"_moe_module.{attr}(*args, {topk}, {renormalize!r})"


# Paged KV-cache decode attention

PAGED_STALE_SCALE = 256.0
"""The pool's slots that no sequence owns (spare blocks, the tail of each sequence's last block)
hold finite stale values of this scale, as a reused vLLM cache does: a kernel that reads past a
sequence's length shows in the reference and in batch invariance. Not NaN: a real cache never
holds NaN, and a kernel that masks a score to -inf but still multiplies its (finite) value by the
zero weight is correct (vLLM's CPU kernel does: tests/vllm_lane/lane_vllm_ops.py)."""

PAGED_SPARE_BLOCKS = 2
"""Blocks in the pool beyond those the batch's sequences need (never referenced)."""

PAGED_DECODE_BOUND = (
    "per sequence and head, with L keys and scores s_j = scale q.k_j: each score is off by at most"
    " d = gamma~_{D+2} scale max_j (|q|.|k_j|); softmax turns that into a relative weight error of"
    " 2 d, plus u_acc (2 max_j |s_j - max s| + 8) for x - max, exp and the normalising division;"
    " the normaliser and P @ V are sums of L terms: 2 gamma~_{L+D}; a split-KV kernel's combine"
    " (rescaling each split by exp(m_split - m), one product and one division) adds 4 u_acc; all"
    " relative to sum_j p_j |v_j|; plus one rounding to the output dtype and the smallest normal"
)


def _paged_operands(case: Case) -> tuple[Operand, ...]:
    """query, k, v per sample: one row per KV token of the sequence (the query's last row is the
    decode token's query; the others stand for the prefill's and are unused)."""
    return (Operand("query", 0), Operand("k", 0), Operand("v", 0))


def _paged_shapes(case: Case, rows: int) -> tuple[tuple[int, ...], ...]:
    _, heads, kv_heads, head_dim, _ = case.shape
    return ((rows, heads, head_dim), (rows, kv_heads, head_dim), (rows, kv_heads, head_dim))


def paged_layout(
    lengths: Sequence[int], block_size: int, placement: int
) -> tuple[np.ndarray, np.ndarray, int]:
    """Where the batch's KV tokens live in the paged pool: (block_table, slots, num_blocks).

    Sequence b owns ceil(L_b / block_size) blocks; the pool has those plus PAGED_SPARE_BLOCKS.
    Placement 0 puts the blocks in batch order (the spares last); any other value permutes the
    whole pool with numpy's PCG64 seeded by (placement, pool size): Hypothesis draws it, so each
    sequence's blocks sit at positions it chose (and shrinks toward the plain order).
    ``block_table`` is (B, max blocks) int32, unused entries 0; ``slots`` is each packed token's
    slot, block * block_size + offset (int64)."""
    counts = [-(-int(n) // block_size) for n in lengths]
    total = sum(counts)
    num_blocks = total + PAGED_SPARE_BLOCKS
    order = np.arange(num_blocks)
    if placement:
        order = np.random.default_rng([int(placement), num_blocks]).permutation(num_blocks)
    table = np.zeros((len(lengths), max(counts, default=0) or 1), dtype=np.int32)
    slots = []
    first = 0
    for b, (n, count) in enumerate(zip(lengths, counts, strict=True)):
        blocks = order[first : first + count]
        first += count
        table[b, :count] = blocks
        t = np.arange(int(n))
        slots.append(blocks[t // block_size] * block_size + t % block_size)
    packed = np.concatenate(slots) if slots else np.zeros(0, dtype=np.int64)
    return table, packed.astype(np.int64), num_blocks


def paged_cache(
    k: Any, v: Any, lengths: Sequence[int], block_size: int, placement: int
) -> tuple[Any, Any, Any, Any]:
    """Page packed k, v (tokens, Hkv, D) into pools of blocks: (k_cache, v_cache (num_blocks,
    block_size, Hkv, D), block_table (B, max_blocks) int32, seq_lens (B,) int32), the blocks at
    ``paged_layout``'s positions. Slots no sequence owns hold finite stale values (numpy's PCG64
    seeded by (placement, num_blocks, 1), times PAGED_STALE_SCALE). Data movement only."""
    import torch

    table, slots, num_blocks = paged_layout(lengths, block_size, placement)
    kv_heads, head_dim = k.shape[1], k.shape[2]
    rng = np.random.default_rng([int(placement), num_blocks, 1])
    stale = rng.standard_normal((2, num_blocks * block_size, kv_heads, head_dim))
    pools = torch.from_numpy(stale * PAGED_STALE_SCALE).to(k.dtype)
    index = torch.from_numpy(slots)
    shape = (num_blocks, block_size, kv_heads, head_dim)
    k_cache = pools[0].index_copy(0, index, k).reshape(shape)
    v_cache = pools[1].index_copy(0, index, v).reshape(shape)
    seq_lens = torch.tensor([int(n) for n in lengths], dtype=torch.int32)
    return k_cache, v_cache, torch.from_numpy(table), seq_lens


def paged_decode_call(
    function: Callable[..., Any], args: Sequence[Any], case: Case, lengths: Sequence[int]
) -> Any:
    """Page the packed k, v (``paged_cache``), take each sequence's last query row and call
    ``function`` with vLLM's decode arguments: (query (B, H, D), k_cache, v_cache, block_table,
    seq_lens, scale = 1 / sqrt(D)). The operands' layouts reach only the copies into the cache
    (the cache is what a kernel reads)."""
    import torch

    query, k, v = args
    block_size, head_dim = case.shape[4], case.shape[3]
    caches = paged_cache(k, v, lengths, block_size, case.opt("placement", 0))
    last = torch.from_numpy(np.cumsum(np.asarray(lengths, dtype=np.int64)) - 1)
    return function(query.index_select(0, last), *caches, 1.0 / math.sqrt(head_dim))


def _paged_call(entry: str, args: Sequence[Any], case: Case, lengths: Sequence[int]) -> Any:
    return paged_decode_call(_entry_function(entry), args, case, lengths)


def _paged_reference(
    x: Sequence[np.ndarray], case: Case, lengths: Sequence[int], acc: str = "float32"
):
    """softmax(scale q k^T) v per sequence and query head in float64, q the sequence's last query
    row, over all its L keys (decode: no causal mask); query head h reads kv head h // (H / Hkv).
    The bound is PAGED_DECODE_BOUND (the ``attention`` op's, plus a split-KV combine)."""
    query, k, v = x
    _, heads, kv_heads, head_dim, _ = case.shape
    scale, group, u = 1.0 / math.sqrt(head_dim), heads // kv_heads, unit_roundoff(acc)
    count = len(lengths)
    value = np.zeros((count, heads, head_dim))
    error = np.zeros_like(value)
    magnitude = np.zeros_like(value)
    start = 0
    for b, length in enumerate(lengths):
        sl = slice(start, start + length)
        start += length
        q = query[start - 1]  # (H, D)
        ks, vs = np.repeat(k[sl], group, axis=1), np.repeat(v[sl], group, axis=1)  # (L, H, D)
        with np.errstate(all="ignore"):
            scores = np.einsum("hd,lhd->hl", q, ks) * scale
            score_mag = np.einsum("hd,lhd->hl", np.abs(q), np.abs(ks)) * scale
            m = scores.max(-1, keepdims=True)
            p = np.exp(scores - m)
            p = p / p.sum(-1, keepdims=True)
            value[b] = np.einsum("hl,lhd->hd", p, vs)
            weighted = np.einsum("hl,lhd->hd", p, np.abs(vs))
            d = _gamma(head_dim + 2, u) * score_mag.max(-1)
            spread = np.abs(scores - m).max(-1)
            rel = 2 * d + u * (2 * spread + 12) + 2 * _gamma(length + head_dim, u)
            error[b] = rel[:, None] * weighted
            magnitude[b] = weighted
    bound = _output_rounding(value, error, case.dtype, magnitude, acc)
    return (Reference(value, bound, case.dtype, acc),)


def _paged_output_rows(case: Case, rows: int) -> int:
    """A sample is one sequence; its output is its decode token's: one row."""
    return 1


def _paged_repro(case: Case) -> tuple[str, str]:
    """The reproducer pages the cache exactly as the call does: the source of ``paged_layout``,
    ``paged_cache`` and ``paged_decode_call`` is copied into the script (one definition, and the
    script needs no bi_props for it), then the entry point is called."""
    import inspect

    module, _, attr = case.entry.rpartition(".")
    shape, placement = case.shape, int(case.opt("placement", 0))
    sources = "\n\n".join(
        inspect.getsource(f) for f in (paged_layout, paged_cache, paged_decode_call)
    )
    definition = (
        "import math\nfrom collections.abc import Callable, Sequence\nfrom typing import Any\n"
        "import numpy as np\n"
        f"import {module} as _paged_module  # looked up at call time (a target swaps it)\n"
        "Case = Any\n"
        f"PAGED_SPARE_BLOCKS = {PAGED_SPARE_BLOCKS!r}\nPAGED_STALE_SCALE = {PAGED_STALE_SCALE!r}\n"
        f"\n\n{sources}\n\n"
        "class _Case:  # what paged_decode_call reads of the case\n"
        f"    shape = {tuple(shape)!r}\n"
        "    def opt(self, name, default=None):\n"
        f"        return {placement!r} if name == 'placement' else default\n"
    )
    expr = f"paged_decode_call(_paged_module.{attr}, args, _Case(), lengths)"
    return definition, expr


OPS: dict[str, OpSpec] = {
    op.name: op
    for op in (
        OpSpec(
            name="mm",
            entries=("torch.mm", "Tensor.mm"),
            shape_doc="(m, k, n): input (m, k) per sample, mat2 (k, n) shared",
            operands=lambda case: (Operand("input", 0), Operand("mat2", None)),
            operand_shapes=_mm_shapes,
            call=_mm_call,
            reference=_mm_reference,
            exact_amplitude=lambda case, acc="float32": _bounded_amplitude(case.shape[1], acc),
            bound=PRODUCT_BOUND,
            draw_shape=_shapes("mm"),
            repro_call=_mm_repro,
            aten_names=("aten::mm",),
        ),
        OpSpec(
            name="matmul",
            entries=("torch.matmul", "operator.matmul"),
            shape_doc="form 2d: (m, k, n); vector: (m, k) @ (k,); batched: (b, m, k, n) both per"
            " sample; broadcast: (b, m, k) per sample @ (k, n) shared",
            operands=_matmul_operands,
            operand_shapes=_matmul_shapes,
            call=_matmul_call,
            reference=_matmul_reference,
            exact_amplitude=_matmul_amplitude,
            option_choices={"form": MATMUL_FORMS},
            bound=PRODUCT_BOUND,
            draw_shape=_shapes("matmul"),
            companion_rows=_companions("small_companions"),
            repro_call=_matmul_repro,
            aten_names=("aten::mv", "aten::dot", "aten::matmul"),
        ),
        OpSpec(
            name="bmm",
            entries=("torch.bmm",),
            shape_doc="(b, m, k, n): both operands per sample along b",
            operands=lambda case: (Operand("input", 0), Operand("mat2", 0)),
            operand_shapes=_bmm_shapes,
            call=_bmm_call,
            reference=_bmm_reference,
            exact_amplitude=lambda case, acc="float32": _bounded_amplitude(case.shape[2], acc),
            bound=PRODUCT_BOUND,
            draw_shape=_shapes("bmm"),
            companion_rows=_companions("small_companions"),
            repro_call=_fixed_repro("torch.bmm(args[0], args[1])"),
            aten_names=("aten::bmm",),
        ),
        OpSpec(
            name="addmm",
            entries=("torch.addmm",),
            shape_doc="(m, k, n): self (n,) shared or (m, n) per sample, mat1 (m, k), mat2 (k, n)",
            operands=_addmm_operands,
            operand_shapes=_addmm_shapes,
            call=_addmm_call,
            reference=_addmm_reference,
            exact_amplitude=_addmm_amplitude,
            option_choices={
                "beta": (1, 0, 2, 0.5),
                "alpha": (1, 2, 0.5, -1),
                "bias": ("vector", "matrix"),
            },
            bound=PRODUCT_BOUND + " (K + 1 terms: the bias is one)",
            draw_shape=_shapes("addmm"),
            repro_call=_addmm_repro,
            aten_names=("aten::addmm",),
        ),
        OpSpec(
            name="linear",
            entries=("F.linear",),
            shape_doc="form 2d: (m, k, n); 3d: (m, s, k, n); weight (n, k), bias (n,) shared",
            operands=_linear_operands,
            operand_shapes=_linear_shapes,
            call=_linear_call,
            reference=_linear_reference,
            exact_amplitude=_linear_amplitude,
            option_choices={"bias": (True, False), "form": ("2d", "3d")},
            bound=PRODUCT_BOUND + " (K + 1 terms with a bias)",
            draw_shape=_shapes("linear"),
            repro_call=_fixed_repro("F.linear(*args)"),
            aten_names=("aten::linear",),
        ),
        OpSpec(
            name="sum",
            entries=("torch.sum", "Tensor.sum"),
            shape_doc="the input's shape (rank 1-3), rows first",
            operands=_x_operand,
            operand_shapes=_x_shape,
            call=_reduce_call("sum"),
            reference=_reduce_reference(mean=False),
            exact_amplitude=_sum_amplitude,
            batchable=_reduction_batchable,
            bound=SUM_BOUND,
            draw_shape=_shapes("reduction"),
            repro_call=_reduce_repro,
            aten_names=("aten::sum",),
        ),
        OpSpec(
            name="mean",
            entries=("torch.mean", "Tensor.mean"),
            shape_doc="the input's shape (rank 1-3), rows first",
            operands=_x_operand,
            operand_shapes=_x_shape,
            call=_reduce_call("mean"),
            reference=_reduce_reference(mean=True),
            exact_amplitude=_mean_amplitude,
            batchable=_reduction_batchable,
            bound=SUM_BOUND,
            draw_shape=_shapes("reduction"),
            repro_call=_reduce_repro,
            aten_names=("aten::mean",),
        ),
        OpSpec(
            name="softmax",
            entries=("torch.softmax", "Tensor.softmax", "F.softmax"),
            shape_doc="the input's shape (rank 2-3), rows first",
            operands=_x_operand,
            operand_shapes=_x_shape,
            call=_softmax_call("softmax"),
            reference=_softmax_reference(log=False),
            exact_amplitude=_never_exact,
            batchable=_softmax_batchable,
            bound=SOFTMAX_BOUND,
            draw_shape=_shapes("softmax"),
            repro_call=_softmax_repro,
            aten_names=("aten::_softmax", "aten::softmax"),
        ),
        OpSpec(
            name="log_softmax",
            entries=("torch.log_softmax", "Tensor.log_softmax", "F.log_softmax"),
            shape_doc="the input's shape (rank 2-3), rows first",
            operands=_x_operand,
            operand_shapes=_x_shape,
            call=_softmax_call("log_softmax"),
            reference=_softmax_reference(log=True),
            exact_amplitude=_never_exact,
            batchable=_softmax_batchable,
            bound=SOFTMAX_BOUND,
            draw_shape=_shapes("softmax"),
            repro_call=_softmax_repro,
            aten_names=("aten::_log_softmax", "aten::log_softmax"),
        ),
        OpSpec(
            name="rms_norm",
            entries=("F.rms_norm",),
            shape_doc="(m, h): input (m, h) per sample, weight (h,) shared",
            operands=_rms_norm_operands,
            operand_shapes=_rms_norm_shapes,
            call=_rms_norm_call,
            reference=_rms_norm_reference,
            exact_amplitude=_never_exact,
            bound=RMS_NORM_BOUND,
            draw_shape=_shapes("rms_norm"),
            repro_call=_rms_norm_repro,
            aten_names=("aten::rms_norm",),
        ),
        OpSpec(
            name="add_rms_norm",
            entries=("bi_props.ops.add_rms_norm",),
            shape_doc="(m, h): x and residual (m, h) per sample, weight (h,) shared; returns"
            " (rms_norm(x + residual) * weight, x + residual)",
            operands=_add_rms_norm_operands,
            operand_shapes=_add_rms_norm_shapes,
            call=_add_rms_norm_call,
            reference=_add_rms_norm_reference,
            exact_amplitude=_add_rms_norm_amplitude,
            output_batch_axes=(0, 0),
            inexact_outputs=(0,),
            bound=RMS_NORM_BOUND + "; the residual x + residual: one rounding",
            draw_shape=_shapes("add_rms_norm"),
            repro_call=_add_rms_norm_repro,
        ),
        OpSpec(
            name="attention",
            entries=("bi_props.ops.varlen_attention",),
            shape_doc="(length, heads, kv_heads, head_dim): q, k, v packed per sequence (causal)",
            operands=_attention_operands,
            operand_shapes=_attention_shapes,
            call=_attention_call,
            reference=_attention_reference,
            exact_amplitude=_never_exact,
            bound="Higham & Mary's gamma~ for the score dot products and the two length sums,"
            " softmax's exp terms as above; relative to sum p |v|",
            draw_shape=_shapes("attention"),
            companion_rows=_companions("attention_companions"),
        ),
        OpSpec(
            name="silu",
            entries=("F.silu",),
            shape_doc="(m, n): input (m, n) per sample; SwiGLU's activation",
            operands=_x_operand,
            operand_shapes=_x_shape,
            call=_silu_call,
            reference=_silu_reference,
            exact_amplitude=_never_exact,
            bound="relative u_acc (|x| + 4) (exp, one add, one division); the flush to -0.0"
            " where exp(-x) overflows",
            draw_shape=_shapes("rows_by_dim"),
            repro_call=_fixed_repro("F.silu(args[0])"),
            aten_names=("aten::silu",),
        ),
        OpSpec(
            name="silu_and_mul",
            entries=("bi_props.ops.silu_and_mul",),
            shape_doc="(m, h): x (m, 2h) per sample; returns silu(x[:, :h]) * x[:, h:], (m, h)"
            " (vLLM's SwiGLU activation)",
            operands=_gated_operands,
            operand_shapes=_gated_shapes,
            call=_silu_and_mul_call,
            reference=_gated_reference("silu"),
            exact_amplitude=_never_exact,
            bound=GATED_BOUND,
            draw_shape=_shapes("gated"),
            repro_call=_silu_and_mul_repro,
        ),
        OpSpec(
            name="gelu_and_mul",
            entries=("bi_props.ops.gelu_and_mul",),
            shape_doc="(m, h): x (m, 2h) per sample; returns gelu(x[:, :h], approximate) *"
            " x[:, h:], (m, h) (vLLM's GeGLU activation)",
            operands=_gated_operands,
            operand_shapes=_gated_shapes,
            call=_gelu_and_mul_call,
            reference=_gated_reference("gelu"),
            exact_amplitude=_never_exact,
            option_choices={"approximate": GELU_APPROXIMATIONS},
            bound=GATED_BOUND,
            draw_shape=_shapes("gelu_and_mul"),
            repro_call=_gelu_and_mul_repro,
        ),
        OpSpec(
            name="fused_add_rms_norm",
            entries=("bi_props.ops.fused_add_rms_norm",),
            shape_doc="(m, h): x and residual (m, h) per sample, weight (h,) shared; vLLM's"
            " in-place op: residual <- x + residual, x <- rms_norm(residual) * weight; the"
            " outputs are the two mutated inputs (x, residual)",
            operands=_add_rms_norm_operands,
            operand_shapes=_add_rms_norm_shapes,
            call=_fused_add_rms_norm_call,
            reference=_fused_add_rms_norm_reference,
            exact_amplitude=_add_rms_norm_amplitude,
            output_batch_axes=(0, 0),
            inexact_outputs=(0,),
            bound=RMS_NORM_BOUND + "; the residual x + residual: one rounding",
            notes="in place: the call runs on copies of x and residual (same strides) and returns"
            " them mutated",
            draw_shape=_shapes("fused_add_rms_norm"),
            repro_call=_fused_add_rms_norm_repro,
        ),
        OpSpec(
            name="layer_norm",
            entries=("F.layer_norm",),
            shape_doc="(m, h): input (m, h) per sample; with affine, weight and bias (h,) shared;"
            " normalised over the last dim",
            operands=_layer_norm_operands,
            operand_shapes=_layer_norm_shapes,
            call=_layer_norm_call,
            reference=_layer_norm_reference,
            exact_amplitude=_never_exact,
            option_choices={"affine": (True, False), "eps": (1e-5, 1e-6)},
            bound=LAYER_NORM_BOUND,
            draw_shape=_shapes("layer_norm"),
            repro_call=_layer_norm_repro,
            aten_names=("aten::layer_norm", "aten::native_layer_norm"),
        ),
        OpSpec(
            name="embedding",
            entries=("F.embedding",),
            shape_doc="(m, vocab, h): token ids (m,) per sample in [0, vocab), weight (vocab, h)"
            " shared; returns weight[ids], (m, h)",
            operands=_embedding_operands,
            operand_shapes=_embedding_shapes,
            call=_embedding_call,
            reference=_embedding_reference,
            exact_amplitude=lambda case, acc="float32": 8,
            bound="bitwise: a gather (no arithmetic)",
            negative_control=False,  # a stock gather is batch-invariant too: a control is blind
            draw_shape=_shapes("embedding"),
            repro_call=_fixed_repro("F.embedding(args[0], args[1])"),
            aten_names=("aten::embedding",),
        ),
        OpSpec(
            name="probe_model",
            entries=MODEL_LAYOUTS,
            shape_doc="(length, layers, heads, kv_heads, head_dim, vocab, intermediate); entry is"
            " the batch layout (packed or padded); tokens per sample, one flat weight vector",
            operands=_model_operands,
            operand_shapes=_model_shapes,
            call=_model_call,
            reference=_no_reference,
            exact_amplitude=_never_exact,
            properties=MODEL_PROPERTIES,
            notes="logprobs (T, vocab) float32; the mismatch's first index is the first diverging"
            " token",
            draw_shape=_shapes("probe_model"),
            companion_rows=_companions("probe_model_companions"),
        ),
        OpSpec(
            name="engine",
            entries=("bi_props.targets.vllm_engine.prompt_logprobs",),
            shape_doc="(length, vocab): the needle prompt's token ids (length,) per sample, in"
            " [4, vocab); each sample is one prompt; output: the logprob of each prompt token"
            " given its prefix (0.0 for the first), packed",
            operands=_engine_operands,
            operand_shapes=_engine_shapes,
            call=_engine_call,
            reference=_engine_no_reference,
            exact_amplitude=_never_exact,
            properties=("logprobs", "determinism"),
            notes="a real engine (the vllm-engine target); explored only where a space lists it"
            " in [ops] include",
            draw_shape=_shapes("engine"),
            companion_rows=_companions("engine_companions"),
            max_companions=ENGINE_MAX_COMPANIONS,
        ),
        # -- inference ops ------------------------------------------------------------
        OpSpec(
            name="rotary_embedding",
            entries=("bi_props.ops.rotary_embedding",),
            shape_doc="(tokens, heads, kv_heads, head_size, rot_dim, max_position): positions"
            " (tokens,) int64, query (tokens, heads * head_size) and key (tokens, kv_heads *"
            " head_size) per token, cos_sin_cache (max_position, rot_dim) shared; option is_neox;"
            " returns the rotated (query, key) (vLLM's semantics, not in place)",
            operands=_rotary_operands,
            operand_shapes=_rotary_shapes,
            call=_rotary_call,
            reference=_rotary_reference,
            exact_amplitude=_never_exact,
            output_batch_axes=(0, 0),
            option_choices={"is_neox": (True, False)},
            bound=ROTARY_BOUND,
            draw_shape=_shapes("rotary_embedding"),
            repro_call=_rotary_repro,
        ),
        OpSpec(
            name="greedy_argmax",
            entries=("torch.argmax", "Tensor.argmax"),
            shape_doc="(m, vocab): logits (m, vocab) per sample; returns the argmax of each row"
            " (int64), ties to the lowest index (vLLM's greedy sampling)",
            operands=_logits_operand,
            operand_shapes=_x_shape,
            call=_argmax_call,
            reference=_argmax_reference,
            exact_amplitude=_selection_amplitude,
            bound="exact (a selection: the index itself, ties to the lowest index)",
            negative_control=False,  # comparisons only, no rounding: stock cannot drift with M
            draw_shape=_shapes("logits"),
            repro_call=_argmax_repro,
            aten_names=("aten::argmax",),
        ),
        OpSpec(
            name="top_k",
            entries=("bi_props.ops.top_k",),
            shape_doc="(m, vocab): logits (m, vocab) per sample, option k (1..vocab); returns"
            " (values, indices) of each row's k largest, descending (torch.topk, sorted=True),"
            " ties to the lowest index",
            operands=_logits_operand,
            operand_shapes=_x_shape,
            call=_top_k_call,
            reference=_top_k_reference,
            exact_amplitude=_selection_amplitude,
            output_batch_axes=(0, 0),
            bound="exact: values bit for bit (a selection of inputs), indices exactly, ties to"
            " the lowest index",
            negative_control=False,  # a selection of inputs: no rounding a batch could reorder
            draw_shape=_shapes("top_k"),
            repro_call=_top_k_repro,
            aten_names=("aten::topk",),
        ),
        OpSpec(
            name="fused_moe",
            entries=("bi_props.ops.fused_moe",),
            shape_doc="(tokens, hidden, intermediate, experts, topk): hidden_states (tokens,"
            " hidden) and gating_output (tokens, experts) per token, w1 (experts, 2 intermediate,"
            " hidden) and w2 (experts, hidden, intermediate) shared; option renormalize; returns"
            " (tokens, hidden): each token's topk experts by logit (ties to the lowest index),"
            " w2 silu_and_mul(w1 x) each, summed with softmax routing weights (vLLM's fused_moe)",
            operands=_fused_moe_operands,
            operand_shapes=_fused_moe_shapes,
            call=_fused_moe_call,
            reference=_fused_moe_reference,
            exact_amplitude=_fused_moe_amplitude,
            inexact_outputs=(0,),
            option_choices={"renormalize": (True, False)},
            bound=FUSED_MOE_BOUND,
            draw_shape=_shapes("fused_moe"),
            repro_call=_fused_moe_repro,
        ),
        OpSpec(
            name="paged_decode_attention",
            entries=("bi_props.ops.paged_decode_attention",),
            shape_doc="(context, heads, kv_heads, head_dim, block_size): a sample is one sequence"
            " of `context` KV tokens, query (context, heads, head_dim) and k, v (context,"
            " kv_heads, head_dim) per token, of which the query's last row decodes; the call pages"
            " k, v into a pool of blocks of block_size at positions drawn by Hypothesis (option"
            " placement) and passes (query (B, heads, head_dim), k_cache, v_cache (num_blocks,"
            " block_size, kv_heads, head_dim), block_table (B, max_blocks) int32, seq_lens (B,)"
            " int32, scale); returns (B, heads, head_dim): one output row per sequence",
            operands=_paged_operands,
            operand_shapes=_paged_shapes,
            call=_paged_call,
            reference=_paged_reference,
            exact_amplitude=_never_exact,
            output_rows=_paged_output_rows,
            bound=PAGED_DECODE_BOUND,
            notes="the operands' layouts reach only the copy into the cache; unowned cache slots"
            " hold finite stale values (PAGED_STALE_SCALE)",
            draw_shape=_shapes("paged_decode_attention"),
            companion_rows=_companions("paged_decode_companions"),
            repro_call=_paged_repro,
        ),
    )
}


# The aten ops (as the profiler names them) through which the catalogue's ops are reached: each
# spec's ``aten_names`` (register_op adds a user op's).
ATEN_TO_OP = {aten: op.name for op in OPS.values() for aten in op.aten_names}
# Data movement and exactly rounded elementwise ops: they cannot make a row depend on the batch.
ATEN_BENIGN = (
    "aten::add",
    "aten::sub",
    "aten::mul",
    "aten::div",
    "aten::cat",
    "aten::index",
    "aten::embedding",
    "aten::reshape",
    "aten::view",
    "aten::slice",
    "aten::select",
    "aten::zeros",
    "aten::zeros_like",
    "aten::empty",
    "aten::to",
    "aten::_to_copy",
    "aten::copy_",
    "aten::as_strided",
    "aten::t",
    "aten::transpose",
    "aten::expand",
    "aten::contiguous",
    "aten::clone",
    "aten::chunk",
    "aten::split",
    "aten::unsqueeze",
    "aten::squeeze",
    "aten::repeat_interleave",
    "aten::lift_fresh",
    "aten::detach",
    "aten::fill_",
    "aten::zero_",
    "aten::resolve_conj",
    "aten::_unsafe_view",
    "aten::empty_like",
    "aten::empty_strided",
    "aten::scalar_tensor",
    "aten::item",
    "aten::neg",
)


def cells(ops: Sequence[str]) -> list[tuple[str, str, str]]:
    """Every (op, property, switch state) the suite and ``fuzz`` run: each property the op has
    (``property_spec.properties_of``) in each of its ``switches``. A property judging both states
    (parity) is one cell, "both"; the disabled state of a control property is a negative control
    (see ``controls``), not a cell."""
    from .property_spec import PROPERTIES, properties_of

    result = []
    for op in ops:
        for prop in properties_of(OPS[op]):
            spec = PROPERTIES[prop]
            for switch in spec.switches:
                if spec.control and switch == "disabled":
                    continue  # a negative control (``controls``), or nothing stock could break
                result.append((op, prop, switch))
    return result


def controls(ops: Sequence[str]) -> list[tuple[str, str]]:
    """Every (op, property) negative control: the property searched with the switch off."""
    return [(op, prop) for op in ops for prop in OPS[op].controls]


def get(name: str) -> OpSpec:
    try:
        return OPS[name]
    except KeyError:
        known = ", ".join(OPS)
        raise KeyError(f"unknown op {name!r}; the catalogue has: {known}") from None


# ---------------------------------------------------------------------------------------------
# The registry: users' ops

# Public names of the bound helpers, for users' references (docs/ops.md).
sum_error = _sum_error
output_rounding = _output_rounding
product_reference = _product_reference
bounded_amplitude = _bounded_amplitude

BUILTIN_OPS = tuple(OPS)
"""The ops bi_props ships; ``register_op`` adds others to ``OPS``."""
_ORIGINS: dict[str, str] = {}
"""Where each registered (non-built-in) op came from: the module of its ``call``."""


def _origin(spec: OpSpec) -> str:
    if spec.name in BUILTIN_OPS:
        return "built into bi_props (bi_props.model.catalogue)"
    return _ORIGINS.get(spec.name, "registered earlier")


def register_op(spec: OpSpec) -> OpSpec:
    """Add a user's op to the catalogue (``OPS``) of this process; returns the registered spec.

    Registering the identical spec again is a no-op. Another spec under a taken name, a spec
    without what exploring it needs, or an aten name another op already claims raises one
    ``ValueError`` saying what, where and how to fix it. A third-party target's ``EXTRA_OPS`` are
    registered this way in the controller and in every worker when the target module loads; an
    op registered by hand must be registered in the workers too (put it in a target's
    ``EXTRA_OPS``)."""
    if not isinstance(spec, OpSpec):
        raise TypeError(f"register_op needs a bi_props.OpSpec, got {type(spec).__name__}")
    existing = OPS.get(spec.name)
    if existing is not None:
        if existing is spec or existing == spec:
            return existing
        raise ValueError(
            f"register_op: op name {spec.name!r} is taken: {_origin(existing)} defines a different "
            f"spec under it (this one comes from {spec.call.__module__!r}). Rename yours "
            f"(OpSpec(name=...), and the target's OPS) or register the same OpSpec object "
            f"(import it instead of redefining it)"
        )
    problems = []
    if not isinstance(spec.name, str) or not spec.name.strip() or "|" in spec.name:
        problems.append(f"name {spec.name!r} must be a non-empty string without '|'")
    if not spec.entries or not all(isinstance(e, str) for e in spec.entries):
        problems.append("entries must be a non-empty tuple of entry-point names")
    if not callable(spec.draw_shape):
        problems.append("draw_shape(draw, ctx) -> (shape, options) is missing")
    from .property_spec import PROPERTIES

    unknown = [p for p in spec.properties if p not in PROPERTIES]
    if unknown:
        problems.append(
            f"properties {unknown} are unknown; choose from {list(PROPERTIES)} (a property of "
            f"your own: register it first, e.g. in the target's EXTRA_PROPERTIES)"
        )
    claimed = {
        a: ATEN_TO_OP[a] for a in spec.aten_names if ATEN_TO_OP.get(a, spec.name) != spec.name
    }
    if claimed:
        problems.append(
            f"aten_names {sorted(claimed)} already map to {sorted(set(claimed.values()))}"
        )
    if problems:
        raise ValueError(
            f"register_op: OpSpec {spec.name!r} (from {spec.call.__module__!r}) cannot be "
            f"registered: {'; '.join(problems)}. See bi_props.OpSpec's docstring and docs/ops.md"
        )
    OPS[spec.name] = spec
    _ORIGINS[spec.name] = f"module {spec.call.__module__!r}"
    for aten in spec.aten_names:
        ATEN_TO_OP[aten] = spec.name
    return spec


def registered_ops() -> tuple[str, ...]:
    """The ops registered beyond the built-in ones, in registration order."""
    return tuple(op for op in OPS if op not in BUILTIN_OPS)
