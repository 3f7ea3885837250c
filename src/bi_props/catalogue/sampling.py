"""Sampling: ``sample``, a seeded sampler over logits with per-request parameters.

Each row of a sample is one request with its own parameters (greedy or not, temperature, top-k,
top-p, min-p, seeded or not), decoded from an int64 per-row operand ``request`` by
``request_params``; the sampler's random numbers are the per-row operand ``noise`` (one uniform
in (0, 1) per logit). Both are per-sample operands: they come from the sample's own seed, so a
needle's parameters and noise never change when its batch does, while its batch-mates' are drawn
independently (a companion with top-k beside a needle without, greedy beside seeded). That is the
mix that moves a stock sampler onto another path (sglang #35697: a batch-level ``any(need_top_k)``;
vLLM #50979: a top-k path at 8 or more rows that keeps exactly k).

One op's helpers, shape strategy and OpSpec (in ``OPS``) side by side (``bi_props.catalogue``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from ..model import batch_reach
from ..model.bounds import _sum_error
from ..model.case import Case
from ..model.compare import smallest_normal, unit_roundoff
from ..model.opspec import Operand, OpSpec, Reference
from ._shared import Shape, _entry_function
from .inference import TIE_AMPLITUDE

REQUEST_CODES = 1 << 20
"""The request operand's codes: int64 ids in [0, REQUEST_CODES), decoded by ``request_params``."""

NOISE_CODES = 1 << 23
"""The noise operand's codes: int64 ids i in [0, NOISE_CODES), the uniform (2 i + 1) / 2^24 in
(0, 1): exact in float32 and float64 alike, so the reference sees the kernel's random numbers."""

TEMPERATURES = (0.25, 0.5, 0.75, 1.0, 1.0, 1.25, 1.5, 2.0)
TOP_KS = (0, 0, 0, 0, 1, 2, 5, 20)  # 0: off (half of the requests)
TOP_PS = (1.0, 1.0, 1.0, 1.0, 0.5, 0.75, 0.875, 0.9375)  # 1.0: off (half)
MIN_PS = (0.0, 0.0, 0.0625, 0.25)  # 0.0: off (half)
"""The parameters' values: dyadic, so every one is exactly the same float32 and float64 value."""


class RequestParams(NamedTuple):
    greedy: bool
    temperature: float
    top_k: int
    top_p: float
    min_p: float
    seed: int | None


def request_params(code: int) -> RequestParams:
    """A request's sampling parameters from its code (mixed radix, each digit independent):
    greedy one request in 4; temperature in ``TEMPERATURES``; top-k off half the time, else 1, 2,
    5 or 20; top-p off half the time, else 0.5 to 0.9375; min-p off half the time, else 0.0625 or
    0.25; seeded half the time (seed 0..63), else None. ``seed`` is what an engine would seed
    the request's generator with; the op itself receives the random numbers (``noise``) in both
    cases, so it only tells the report's parameter mixes (seeded beside unseeded)."""
    c = int(code) % REQUEST_CODES
    greedy = c % 4 == 0
    c //= 4
    temperature = TEMPERATURES[c % 8]
    c //= 8
    top_k = TOP_KS[c % 8]
    c //= 8
    top_p = TOP_PS[c % 8]
    c //= 8
    min_p = MIN_PS[c % 4]
    c //= 4
    seed = None if c % 2 == 0 else c // 2
    return RequestParams(greedy, temperature, top_k, top_p, min_p, seed)


def features(params: RequestParams) -> frozenset[str]:
    """What of a request can move a sampler's path: greedy or sampled, each filter on, seeded or
    not (``parameter_mix``)."""
    out = {
        "greedy" if params.greedy else "sampled",
        "seeded" if params.seed is not None else "unseeded",
    }
    if not params.greedy:
        out |= {
            name
            for name, on in (
                ("top_k", params.top_k > 0),
                ("top_p", params.top_p < 1.0),
                ("min_p", params.min_p > 0.0),
            )
            if on
        }
    return frozenset(out)


MIXES = ("greedy", "sampled", "top_k", "top_p", "min_p", "seeded", "unseeded")
"""The parameter mixes the batch reach counts: a companion holding a request with this feature
beside a needle none of whose requests has it."""


def request_codes(seed: int, rows: int) -> np.ndarray:
    """The request codes of a sample's rows, as the worker materialises them
    (``execution.materialize``: token operand 1 drawn from numpy's PCG64 at (seed, 1))."""
    return np.random.default_rng([int(seed), 1]).integers(0, REQUEST_CODES, size=(rows,))


def parameter_mix(case: Case) -> frozenset[str]:
    """The features (``MIXES``) some companion's request has and no needle request has, from the
    materialised request codes (cheap: one small integer draw per sample, in the controller)."""
    if case.batch is None:
        return frozenset()
    needle: set[str] = set()
    for code in request_codes(case.seed, int(case.shape[0])):
        needle |= features(request_params(int(code)))
    others: set[str] = set()
    for companion in case.batch.companions:
        for code in request_codes(companion.seed, companion.rows):
            others |= features(request_params(int(code)))
    return frozenset(others - needle)


batch_reach.PARAMETER_MIXES["sample"] = parameter_mix


def _operands(case: Case) -> tuple[Operand, ...]:
    return (
        Operand("logits", 0),
        Operand("request", 0, tokens=REQUEST_CODES),
        Operand("noise", 0, tokens=NOISE_CODES),
    )


def _shapes(case: Case, rows: int) -> tuple[tuple[int, ...], ...]:
    vocab = case.shape[1]
    return ((rows, vocab), (rows,), (rows, vocab))


def decode(request: Sequence[int]) -> tuple[list[Any], ...]:
    """Columns (greedy, temperature, top_k, top_p, min_p) of the requests' parameters."""
    params = [request_params(int(c)) for c in request]
    return (
        [p.greedy for p in params],
        [p.temperature for p in params],
        [p.top_k for p in params],
        [p.top_p for p in params],
        [p.min_p for p in params],
    )


def _call(entry: str, args: Sequence[Any], case: Case, lengths: Sequence[int]) -> Any:
    import torch

    logits, request, noise = args
    greedy, temperature, top_k, top_p, min_p = decode(request.reshape(-1).tolist())
    u = ((noise.to(torch.float64) * 2 + 1) / (2 * NOISE_CODES)).to(torch.float32)
    return tuple(
        _entry_function(entry)(
            logits,
            torch.tensor(temperature, dtype=torch.float32),
            torch.tensor(top_k, dtype=torch.int64),
            torch.tensor(top_p, dtype=torch.float32),
            torch.tensor(min_p, dtype=torch.float32),
            torch.tensor(greedy, dtype=torch.bool),
            u,
        )
    )


SAMPLE_BOUND = (
    "greedy rows: the id exact (the first index of the largest logit), the logprobs log_softmax"
    " of the logits within softmax's bound; sampled rows: z = x / T (exact for a power-of-two T,"
    " else u |z|), d = z - max z within e_d = e_z + e_max + 2 u |d|; top-k exact (keeps every"
    " logit >= the k-th largest: ties kept); top-p keeps a logit when the probability of the"
    " logits strictly above it is < p, min-p when d >= log(min_p): a logit within the decision's"
    " error of its threshold (probability: (relative error of the normaliser + 4 u) mass +"
    " sum p e_d + the sum-of-terms bound; min-p: e_d + 8 u) may be kept or not; logprobs of"
    " the kept set d - log S within e_d + e_S / S + u (|log S| + |value| + 2) + log(S with the"
    " undecided / S without), anything for an undecided logit, -inf outside; the id"
    " argmax over the kept set of the logprob + g, g = -log(-log u) (ties to the lowest index),"
    " judged where the best candidate is kept for sure and leads every other by more than both"
    " scores' errors (e_lp + 4 u (1 + |g|) + u |score|), else any id"
)

UNDECIDED = 1e39
"""The tolerance of a logprob whose logit may or may not be kept: finite (reports state ulps),
and past float32's largest so that compare's overflow rule accepts -inf there."""


def _ulp_free(t: float) -> bool:
    """Whether dividing by ``t`` is exact (a power of two)."""
    mantissa, _ = math.frexp(t)
    return mantissa == 0.5


def _row_reference(
    x: np.ndarray, params: RequestParams, u_noise: np.ndarray, u: float
) -> tuple[float, float, np.ndarray, np.ndarray]:
    """(id, id tolerance, logprobs, their tolerance) of one row (float64)."""
    n = x.shape[0]
    tiny = smallest_normal("float32")
    with np.errstate(all="ignore"):
        if params.greedy:
            best = float(np.argmax(x))
            m = np.max(x)
            d = x - m
            e = np.exp(d)
            s = np.sum(e)
            weighted = np.sum(np.where(e > 0, np.abs(d) * e, 0.0)) / s
            slack = u * (2 * np.abs(d) + 8) + 2 * u * weighted
            slack = slack + _sum_error(s, np.sum(e * e), s, n, u) / s
            value = d - np.log(s)
            tol = slack + u * np.abs(value) + n * tiny + tiny
            return best, 0.0, value, tol
        t = params.temperature
        k = params.top_k
        keep_k = np.ones(n, dtype=bool)
        if 0 < k < n:
            keep_k = x >= np.sort(x)[::-1][k - 1]
        z = x / t
        e_z = np.zeros(n) if _ulp_free(t) else u * np.abs(z)
        top = int(np.argmax(np.where(keep_k, z, -np.inf)))
        m = z[top]
        d = z - m
        e_d = e_z + e_z[top] + 2 * u * np.abs(d) + tiny
        e = np.where(keep_k, np.exp(d), 0.0)
        s_k = np.sum(e)
        rel_s = (np.sum(e * (e_d + 2 * u)) + _sum_error(s_k, np.sum(e * e), s_k, n, u)) / s_k
        p = e / s_k
        sure = keep_k.copy()
        maybe = keep_k.copy()
        if params.top_p < 1.0:
            # the mass strictly above each logit (ties kept together: a value rule)
            order = np.argsort(-x, kind="stable")
            xs, ps = x[order], p[order]
            cum = np.concatenate(([0.0], np.cumsum(ps)))
            first = np.searchsorted(-xs, -xs, side="left")
            mass = np.empty(n)
            mass[order] = cum[first]
            squares = np.concatenate(([0.0], np.cumsum(ps * ps)))
            sq = np.empty(n)
            sq[order] = squares[first]
            pe = np.concatenate(([0.0], np.cumsum(ps * e_d[order])))
            spread = np.empty(n)
            spread[order] = pe[first]
            err = mass * (rel_s + 4 * u) + spread + _sum_error(mass, sq, mass, n, u) + n * tiny
            sure &= mass + err < params.top_p
            maybe &= mass - err < params.top_p
        if params.min_p > 0.0:
            threshold = math.log(params.min_p)
            err = e_d + 8 * u + 2 * u * abs(threshold)
            sure &= d - err >= threshold
            maybe &= d + err >= threshold
        s_sure = np.sum(np.where(sure, e, 0.0))
        s_maybe = np.sum(np.where(maybe, e, 0.0))
        log_s = np.log(s_sure)
        lp = np.where(maybe, d - log_s, -np.inf)
        lp_tol = e_d + rel_s + u * (np.abs(log_s) + np.abs(lp) + 2) + np.log(s_maybe / s_sure)
        lp_tol = np.where(maybe, lp_tol, 0.0)
        undecided = maybe & ~sure
        lp = np.where(undecided, np.minimum(lp, -tiny), lp)
        lp_tol = np.where(undecided, UNDECIDED, lp_tol)
        g = -np.log(-np.log(u_noise))
        score = np.where(maybe, lp + g, -np.inf)
        score_tol = np.where(maybe, lp_tol, 0.0) + 4 * u * (1 + np.abs(g)) + u * np.abs(score)
        best = int(np.argmax(score))
        others = maybe.copy()
        others[best] = False
        margin = score[best] - score[others]
        judged = bool(sure[best]) and bool(np.all(margin > score_tol[best] + score_tol[others]))
    return float(best), 0.0 if judged else float(n), lp, lp_tol


def _reference(x: Sequence[np.ndarray], case: Case, lengths: Sequence[int], acc: str = "float32"):
    """The sampler in float64 row by row (``SAMPLE_BOUND``): exact where a decision is a
    comparison of inputs (greedy ids, the top-k set), bounded where it rests on rounded
    probabilities (top-p, min-p, the sampled id); logprobs bounded. The id tolerance is 0
    (judged) or the vocabulary (any id: an undecided row)."""
    logits, request, noise = x
    rows, n = logits.shape
    u = unit_roundoff(acc)
    ids = np.zeros(rows)
    ids_tol = np.zeros(rows)
    lps = np.zeros((rows, n))
    lps_tol = np.zeros((rows, n))
    for r in range(rows):
        if n == 0:
            continue
        params = request_params(int(request[r]))
        u_noise = (2 * np.asarray(noise[r], dtype=np.float64) + 1) / (2 * NOISE_CODES)
        ids[r], ids_tol[r], lps[r], lps_tol[r] = _row_reference(logits[r], params, u_noise, u)
    return (
        Reference(ids, ids_tol, "int64", acc),
        Reference(lps, lps_tol, "float32", acc),
    )


def _amplitude(case: Case, acc: str = "float32") -> int:
    """The exact class draws integers in [-2, 2] (ties: the top-k tie rule and greedy's); the
    outputs stay bounded (``inexact_outputs``: a sampled id rests on rounded probabilities)."""
    return TIE_AMPLITUDE


def _repro(case: Case) -> tuple[str, str]:
    module, _, attr = case.entry.rpartition(".")
    definition = (
        f"import {module} as _sample_module  # looked up at call time (a target swaps it)\n"
        "from bi_props.catalogue.sampling import decode\n"
        "def _sample(logits, request, noise):\n"
        "    greedy, t, k, p, m = decode(request.reshape(-1).tolist())\n"
        f"    u = ((noise.double() * 2 + 1) / {2 * NOISE_CODES}).float()\n"
        f"    return _sample_module.{attr}(logits, torch.tensor(t), torch.tensor(k),"
        " torch.tensor(p), torch.tensor(m), torch.tensor(greedy), u)\n"
    )
    return definition, "_sample(*args)"


def draw_sample(draw: Any, ctx: Any) -> Shape:
    """(requests, vocab): requests from the space's rows, vocab >= 1 from its extent (tile-edge
    biased; a deployment-size example: a vocabulary size or any up to the largest)."""
    vocab = ctx.extents(ctx.clip(ctx.dim_extent, low=1))
    if ctx.scaled:
        vocab = ctx.vocabulary()
    return (draw(ctx.rows), draw(vocab)), {}


OPS: tuple[OpSpec, ...] = (
    OpSpec(
        name="sample",
        entries=("bi_props.ops.sample",),
        shape_doc="(requests, vocab): logits (requests, vocab), request (requests,) int64 codes"
        " of each request's parameters (request_params) and noise (requests, vocab) int64 codes"
        " of its uniforms, per sample; returns (ids int64 (requests,), processed logprobs"
        " float32 (requests, vocab): temperature-scaled, filtered, -inf outside the kept set)",
        operands=_operands,
        operand_shapes=_shapes,
        call=_call,
        reference=_reference,
        exact_amplitude=_amplitude,
        inexact_outputs=(0, 1),
        output_batch_axes=(0, 0),
        bound=SAMPLE_BOUND,
        draw_shape=draw_sample,
        sequences=True,  # each request a co-resident sequence: batches of up to max_sequences
        scale="vocab",
        repro_call=_repro,
        notes="top-k keeps every logit >= the k-th largest (ties kept: the PyTorch rule of"
        " vLLM #50979, not the Triton path's exactly k)",
    ),
)
