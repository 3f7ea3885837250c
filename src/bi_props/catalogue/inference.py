"""Inference ops: embedding, rotary_embedding, greedy_argmax, top_k and a fused MoE block
(vLLM's fused_moe: router top-k, per-expert SiLU-gated GEMMs, weighted sum).

One op's helpers, shape strategy and OpSpec (in ``OPS``) side by side (``bi_props.catalogue``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..model.bounds import (
    LAMBDA,
    _output_rounding,
    _sum_error,
    _sum_error_parts,
)
from ..model.case import Case
from ..model.compare import smallest_normal, unit_roundoff
from ..model.opspec import (
    ControlExample,
    Operand,
    OpSpec,
    Reference,
)
from ._shared import (
    Shape,
    _entry_function,
    _fixed_repro,
    _never_exact,
    _x_shape,
)


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
    head_size, rot_dim = case.shape[3], case.shape[4]
    if rot_dim > head_size or rot_dim % 2:  # the strategy never draws it; a shrink may reduce
        # one extent alone: refused here, alone and in a batch alike, so it fails like nothing
        raise ValueError(
            f"rotary_embedding: rot_dim {rot_dim} must be even and at most head_size {head_size}"
        )
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


FUSED_MOE_BOUND = (
    "selection exact (the topk largest logits, ties to the lowest expert index); routing weights"
    " within softmax's bound (over the k selected logits, or all E without renormalize); per"
    " selected expert: h = w1 x within the sum-of-terms bound over H (+ u_acc |h|), silu(g) v"
    " within |silu'(g) v| e_g + |silu(g)| e_v + u_acc ((1 - sigmoid(g)) |g| + 7) |act|, y = w2"
    " act within the"
    " sum-of-terms bound over I + min(|w2| e_act, LAMBDA sqrt(w2^2 e_act^2)) (+ u_acc |y|); the"
    " weighted sum within sum_j"
    " (e_p |y| + p e_y) + the sum-of-terms bound over k; underflow: the accumulator's smallest"
    " normal per operation (2H in h, 3 in act, 2I in y, 2 in each weight, 2k in the sum),"
    " propagated like the roundings; plus one rounding to the output dtype and the smallest normal"
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
    x: np.ndarray, w1: np.ndarray, w2: np.ndarray, u: float, tiny: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(y, its probabilistic error, its other error) of one expert for the rows x (n, H):
    y = w2 silu_and_mul(w1 x). The probabilistic part is an Azuma-Hoeffding bound over
    independent roundings (LAMBDA u sqrt(spread)), so such parts of different experts add in
    quadrature; the other part (caps, underflows, single roundings) adds linearly.

    ``tiny`` (the accumulator's smallest normal) is the absolute error of one operation whose
    result underflows (flushed to zero, or subnormal): with wide values the first GEMM's products
    and the gate's product can underflow, and w2 then scales that loss up (CI found it: a kernel's
    -0.0 against 4e-34 after w2), so each operation adds ``tiny`` and it is propagated."""
    inter = w2.shape[-1]
    hidden = x.shape[-1]
    with np.errstate(all="ignore"):
        h = x @ w1.T
        h_abs = np.abs(x) @ np.abs(w1).T
        h_sum, h_likely = _sum_error_parts(h, (x * x) @ (w1 * w1).T, h_abs, hidden, u)
        # the sum error's scale of one standard deviation where the probabilistic bound holds
        # (LAMBDA of it), the worst case itself where a cap decided
        h_sigma = np.where(h_likely, h_sum / LAMBDA, h_sum)
        h_error = h_sum + u * np.abs(h) + 2 * hidden * tiny
        g, v = h[:, :inter], h[:, inter:]
        eg, ev = h_error[:, :inter], h_error[:, inter:]
        sg, sv = h_sigma[:, :inter], h_sigma[:, inter:]
        sigmoid = 1.0 / (1.0 + np.exp(-g))
        silu = g * sigmoid
        slope = np.abs(sigmoid * (1.0 + g * (1.0 - sigmoid)))  # |silu'(g)| <= 1.1
        act = silu * v
        # exp(-g)'s relative error (u (|g| + c) in float32 kernels) reaches silu(g) scaled by
        # exp(-g) / (1 + exp(-g)) = 1 - sigmoid(g): nothing where g >> 0 (silu(g) = g)
        own = u * ((1.0 - sigmoid) * np.abs(g) + 7) * np.abs(act)
        flushed = (slope * np.abs(v) + np.abs(silu)) * 2 * hidden * tiny + 3 * tiny
        # the fixed roundings, each its own term of the Azuma-Hoeffding sum: h's two roundings,
        # exp's (u (|g| + 4) relative, through 1 - sigmoid) and the add, division and product
        own_each = u * np.abs(act) * np.sqrt(((1.0 - sigmoid) * (np.abs(g) + 4)) ** 2 + 3)
        fixed = np.sqrt(
            (slope * np.abs(v) * u * np.abs(g)) ** 2 + (np.abs(silu) * u * np.abs(v)) ** 2
        )
        fixed = np.hypot(fixed, own_each)
        act_error = slope * np.abs(v) * eg + np.abs(silu) * ev + own + 3 * tiny
        # where exp(-g) overflows float32 (g < -88.72) a float32 kernel's silu is a signed zero
        overflow = g - eg < -88.72
        act_error = np.where(overflow, act_error + np.abs(act), act_error)
        y = act @ w2.T
        y_error, y_sum_likely = _sum_error_parts(
            y, (act * act) @ (w2 * w2).T, np.abs(act) @ np.abs(w2).T, inter, u
        )
        # act's error is a sum of independent roundings: the two dot products' (their standard
        # scale sigma, g's through silu's slope) and the few fixed ones (h's own rounding and
        # silu_and_mul's, ``fixed`` in quadrature); through w2 all of them together are
        # within LAMBDA sqrt(sum w2^2 (sigma_g^2 + sigma_v^2 + fixed^2)) (Azuma-Hoeffding over
        # every rounding at once, as in _sum_error: LAMBDA is applied once, not per stage);
        # underflows are not mean-zero roundings and add in the worst case (flushed), as does
        # an overflowing exp's whole act; all capped by the worst case |w2| e_act
        spread = (slope * np.abs(v) * sg) ** 2 + (np.abs(silu) * sv) ** 2 + fixed * fixed
        worst = act_error @ np.abs(w2).T
        likely = LAMBDA * np.sqrt(spread @ (w2 * w2).T)
        extra = (flushed + np.where(overflow, np.abs(act), 0.0)) @ np.abs(w2).T
        # the second GEMM's own roundings are more of the same independent ones: in quadrature
        # with the propagated ones where both bounds are probabilistic, added where a cap decided
        joint = y_sum_likely & (likely + extra < worst)
        y_likely = np.where(joint, np.hypot(y_error, likely), 0.0)
        y_fixed = np.where(joint, extra, y_error + np.minimum(worst, likely + extra))
        y_fixed = y_fixed + u * np.abs(y) + 2 * inter * tiny
    return y, y_likely, y_fixed


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
    u, dtype, tiny = unit_roundoff(acc), case.dtype, smallest_normal(acc)
    tokens, size = hidden.shape
    ids = _fused_moe_selection(gating, topk)
    p, p_error = _fused_moe_weights(gating, ids, renormalize, u)
    p_error = p_error + 2 * tiny  # exp(d) and the division underflow where a weight is tiny
    y = np.zeros((tokens, topk, size))
    y_likely = np.zeros((tokens, topk, size))
    y_fixed = np.zeros((tokens, topk, size))
    for expert in np.unique(ids):
        token, slot = np.nonzero(ids == expert)
        y[token, slot], y_likely[token, slot], y_fixed[token, slot] = _fused_moe_expert(
            hidden[token], w1[expert], w2[expert], u, tiny
        )
    with np.errstate(all="ignore"):
        terms = p[..., None] * y
        value = np.sum(terms, axis=1)
        magnitude = np.sum(np.abs(terms), axis=1)
        # a token's k experts are k separate computations: their probabilistic errors add in
        # quadrature (one Azuma-Hoeffding bound over all their roundings), the rest linearly
        likely = np.sqrt(np.sum((p[..., None] * y_likely) ** 2, axis=1))
        fixed = np.sum(p_error[..., None] * np.abs(y) + p[..., None] * y_fixed, axis=1)
        propagated = likely + fixed
        error = propagated + _sum_error(value, np.sum(terms * terms, axis=1), magnitude, topk, u)
        error = error + 2 * topk * tiny
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


def draw_embedding(draw: Any, ctx: Any) -> Shape:
    """(m, vocab, h): a small vocabulary (a tile edge and a prime among them), h from the space."""
    vocab = draw(ctx.choice(tuple([1, 16, 17, 257])))
    return (draw(ctx.rows), vocab, draw(ctx.dim)), {}


def draw_rotary_embedding(draw: Any, ctx: Any) -> Shape:
    """(tokens, heads, kv_heads, head_size, rot_dim, max_position), option is_neox.

    head_size is even, from the space's extent halved (tile-edge biased: 2 * (16 +- 1) ...),
    at most 256; rot_dim is the whole head, or (partial rotary) an even part of it; the cache
    has 1..4096 positions (tile-edge biased); a deployment-size example's 4097 up to the space's
    ``max_position`` (a named size or any), with heads of at most 64."""
    from hypothesis import strategies as st

    options = {"is_neox": draw(ctx.option("is_neox"))}
    tokens = draw(ctx.rows)
    kv_heads = draw(ctx.choice((1, 2)))
    heads = kv_heads * draw(ctx.choice((1, 2, 4)))
    half = draw(ctx.extents(ctx.clip(ctx.dim_extent, low=1, high=32 if ctx.scaled else 128)))
    head_size = 2 * half
    rot_dim = head_size
    if draw(st.booleans()):  # partial rotary (shrinks toward the full head)
        rot_dim = 2 * draw(ctx.integers(1, half))
    positions = ctx.extents(ctx.clip(ctx.space.rows, low=1, high=4096))
    if ctx.scaled:  # past a model's original context: rope scaling engages there
        positions = ctx.sizes(4097, ctx.space.max_position)
    max_position = draw(positions)
    return (tokens, heads, kv_heads, head_size, rot_dim, max_position), options


def draw_logits(draw: Any, ctx: Any) -> Shape:
    """(m, vocab): greedy_argmax (and top_k's rows); vocab >= 1, from the space's extent (a
    deployment-size example: a vocabulary size or any up to the largest)."""
    vocab = ctx.extents(ctx.clip(ctx.dim_extent, low=1))
    if ctx.scaled:
        vocab = ctx.vocabulary()
    return (draw(ctx.rows), draw(vocab)), {}


def draw_top_k(draw: Any, ctx: Any) -> Shape:
    """(m, vocab), option k in 1..vocab (tile-edge biased, shrinks toward 1)."""
    shape, _ = draw_logits(draw, ctx)
    k = draw(ctx.extents(ctx.clip(ctx.dim_extent, low=1, high=shape[1])))
    return shape, {"k": min(k, shape[1])}


def draw_fused_moe(draw: Any, ctx: Any) -> Shape:
    """(tokens, hidden, intermediate, experts, topk), option renormalize.

    hidden and intermediate from the space's extent (tile-edge biased, 1..128: a block's cost is
    3 E I H); experts 1..16 (a power of two or a prime); topk in 1..experts (shrinks toward 1)."""
    options = {"renormalize": draw(ctx.option("renormalize"))}
    tokens = draw(ctx.rows)
    extent = ctx.clip(ctx.dim_extent, low=1, high=128)
    hidden, inter = draw(ctx.extents(extent)), draw(ctx.extents(extent))
    experts = draw(ctx.choice((1, 2, 3, 4, 8, 16)))
    topk = draw(ctx.integers(1, experts))
    return (tokens, hidden, inter, experts, topk), options


OPS: tuple[OpSpec, ...] = (
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
        draw_shape=draw_embedding,
        scale="tokens",
        repro_call=_fixed_repro("F.embedding(args[0], args[1])"),
        aten_names=("aten::embedding",),
    ),
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
        draw_shape=draw_rotary_embedding,
        scale="positions",
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
        draw_shape=draw_logits,
        scale="vocab",
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
        draw_shape=draw_top_k,
        scale="vocab",
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
        draw_shape=draw_fused_moe,
        scale="tokens",
        # a token's routed activations: topk experts x the intermediate size, gate and up
        cost=lambda case, rows: rows * int(case.shape[4]) * (2 * int(case.shape[2]) + 1),
        repro_call=_fused_moe_repro,
        # One token alone vs among 256: the expert GEMMs' M crosses the CPU kernel's tiles
        # (x86 ATen, 2026-12-04: 57-62 of 64 values).
        control_examples=(ControlExample((1, 64, 64, 4, 2), (255,), {"renormalize": True}),),
    ),
)
