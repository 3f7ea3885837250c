"""Batch-invariant selection ops of sampling: ``argmax`` (greedy sampling) and ``top_k``.

A selection never rounds: comparisons are exact, so only the *tie rule* could depend on the batch
(a parallel or vectorised search that keeps whichever tied element its lane saw first). These
kernels fix it: ties go to the lowest index. The maximum of a row is ``tree_max`` (a fixed tree
of exact ``maximum``), the first index attaining it a fixed tree of ``minimum`` over the indices:
both functions of the row alone.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .normalization import softmax_core
from .primitives import _tree, exp, log, tree_max, tree_sum
from .route import KernelRoute


def _first_index(hit: Tensor, dim: int) -> Tensor:
    """The lowest index along ``dim`` where ``hit`` is True (``hit`` has one somewhere)."""
    n = hit.shape[dim]
    shape = [1] * hit.dim()
    shape[dim] = n
    index = torch.arange(n, dtype=torch.int64, device=hit.device).reshape(shape)
    candidates = torch.where(hit, index, torch.full_like(index, n))
    return _tree(candidates, dim, torch.minimum)


@torch.no_grad()
def argmax(self: Tensor, dim: int | None = None, keepdim: bool = False) -> Tensor:
    """Batch-invariant ``aten::argmax``: the first index of the maximum (NaN counts as the
    maximum, as in aten; -0.0 ties with +0.0)."""
    x = self
    if dim is None:
        if x.numel() == 0:
            raise IndexError(
                "argmax(): Expected reduction dim to be specified for input.numel() == 0."
            )
        x, dim, keep_shape = x.reshape(-1), 0, [1] * self.dim()
    else:
        dim = dim % max(x.dim(), 1)
        keep_shape = None
    if x.dim() == 0:
        out = torch.zeros((), dtype=torch.int64, device=x.device)
        return out.reshape([1] * self.dim()) if keepdim else out
    if x.shape[dim] == 0:
        raise IndexError(f"argmax(): Expected reduction dim {dim} to have non-zero size.")
    if x.numel() == 0:  # no rows: an empty result
        shape = list(x.shape)
        shape[dim] = 1
        out = torch.zeros(shape, dtype=torch.int64, device=x.device)
        return out if keepdim else out.squeeze(dim)
    m = tree_max(x, dim).unsqueeze(dim)
    hit = x == m
    if x.is_floating_point():
        hit = hit | (x.isnan() & m.isnan())
    out = _first_index(hit, dim)
    if keep_shape is not None:
        return out.reshape(keep_shape) if keepdim else out
    return out.unsqueeze(dim) if keepdim else out


_BIT_VIEWS = {
    torch.float64: torch.int64,
    torch.float32: torch.int32,
    torch.bfloat16: torch.int16,
    torch.float16: torch.int16,
}


def _bit_view(t: Tensor) -> Tensor:
    """``t``'s storage as same-width integers (``t`` itself for an integer tensor)."""
    view = _BIT_VIEWS.get(t.dtype)
    return t if view is None else t.view(view)


@torch.no_grad()
def top_k(logits: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Batch-invariant top-k over the last dim, descending, ties to the lowest index (NaN counts
    as the largest, as in ``torch.topk``): k rounds of the row's ``tree_max`` over the elements
    not taken yet and the first index attaining it, so every round is a function of the row."""
    n = logits.shape[-1] if logits.dim() else 1
    torch._check(0 <= k <= n, lambda: "selected index k out of range")
    x = logits.reshape(-1, n).contiguous()
    rows = x.shape[0]
    values = torch.empty((rows, k), dtype=logits.dtype, device=logits.device)
    # The values are gathered as bit patterns: torch's CPU gather on bf16 rewrites NaN payloads
    # (0x7fc0 -> 0xffff, measured), a copy of the integers cannot.
    x_bits, bits = _bit_view(x), _bit_view(values)
    indices = torch.empty((rows, k), dtype=torch.int64, device=logits.device)
    if rows and k:
        alive = torch.ones_like(x, dtype=torch.bool)
        floor = torch.full_like(x, float("-inf")) if x.is_floating_point() else None
        low = floor if floor is not None else torch.full_like(x, torch.iinfo(x.dtype).min)
        for j in range(k):
            m = tree_max(torch.where(alive, x, low), -1).unsqueeze(-1)
            hit = x == m
            if x.is_floating_point():
                hit = hit | (x.isnan() & m.isnan())
            first = _first_index(hit & alive, -1).unsqueeze(-1)
            indices[:, j : j + 1] = first
            bits[:, j : j + 1] = x_bits.gather(-1, first)
            alive.scatter_(-1, first, False)
    shape = [*logits.shape[:-1], k] if logits.dim() else [k]
    return values.reshape(shape), indices.reshape(shape)


def _scan(x: Tensor) -> Tensor:
    """Inclusive prefix sums along the last dim by a fixed doubling scan (Hillis-Steele): step s
    adds the element s places back, elementwise, so every sum's order depends on its position
    alone, never on the rows around it."""
    out = x.clone()
    step = 1
    while step < out.shape[-1]:
        shifted = torch.zeros_like(out)
        shifted[..., step:] = out[..., :-step]
        out = out + shifted
        step *= 2
    return out


@torch.no_grad()
def sample(
    logits: Tensor,
    temperature: Tensor,
    top_k: Tensor,
    top_p: Tensor,
    min_p: Tensor,
    greedy: Tensor,
    noise: Tensor,
) -> tuple[Tensor, Tensor]:
    """Batch-invariant ``bi_props.ops.sample`` (the catalogue's contract, SAMPLE_BOUND): every
    step elementwise, a fixed tree (``tree_max``, ``tree_sum``), a doubling scan or an exact
    selection (a stable sort, a running maximum of indices) along the row, in float32 with the
    package's own ``exp`` and ``log``: a row's results are a function of the row and its own
    parameters, whatever its batch-mates ask for. Ties go to the lowest index."""
    x = logits.to(torch.float32)
    rows, vocab = x.shape
    if rows == 0 or vocab == 0:
        return torch.zeros(rows, dtype=torch.int64), torch.zeros((rows, vocab))
    inf = torch.tensor(float("-inf"))
    t = temperature.to(torch.float32)[:, None]
    ranked, order = torch.sort(x, dim=-1, descending=True, stable=True)
    k = top_k.clamp(min=1, max=vocab)[:, None]
    keep = (x >= ranked.gather(1, k - 1)) | ((top_k <= 0) | (top_k >= vocab))[:, None]
    z = x / t
    m = tree_max(torch.where(keep, z, inf), -1).unsqueeze(-1)
    d = z - m
    e = torch.where(keep, exp(d), torch.zeros_like(d))
    s = tree_sum(e, -1).unsqueeze(-1)
    p = e / s
    ps = p.gather(1, order)
    before = torch.zeros_like(ps)
    before[:, 1:] = _scan(ps)[:, :-1]
    starts = torch.ones_like(ranked, dtype=torch.bool)
    starts[:, 1:] = ranked[:, 1:] != ranked[:, :-1]
    index = torch.arange(vocab).expand(rows, vocab)
    first = torch.cummax(torch.where(starts, index, torch.zeros_like(index)), dim=1).values
    mass = torch.empty_like(before).scatter_(1, order, before.gather(1, first))
    keep = keep & ((mass < top_p[:, None]) | (top_p >= 1.0)[:, None])
    on = min_p > 0.0
    floor = log(torch.where(on, min_p, torch.ones_like(min_p)).to(torch.float32))[:, None]
    keep = keep & ((d >= floor) | ~on[:, None])
    e = torch.where(keep, e, torch.zeros_like(e))
    lp = torch.where(keep, d - log(tree_sum(e, -1)).unsqueeze(-1), inf)
    g = -log(-log(noise.to(torch.float32)))
    score = torch.where(keep, lp + g, inf)
    top = tree_max(score, -1).unsqueeze(-1)
    sampled = _first_index(keep & (score == top), -1)
    greedy_lp = softmax_core(x, -1, log_output=True)
    ids = torch.where(greedy, argmax(x, -1), sampled)
    return ids, torch.where(greedy[:, None], greedy_lp, lp)


ROUTES = (
    KernelRoute(
        "argmax(Tensor self, int? dim=None, bool keepdim=False) -> Tensor",
        argmax,
        ops=("greedy_argmax",),
        aten={
            "argmax": lambda ns: lambda self, dim=None, keepdim=False: ns.argmax(self, dim, keepdim)
        },
    ),
    KernelRoute(
        "top_k(Tensor logits, int k) -> (Tensor, Tensor)",
        top_k,
        ops=("top_k",),
        composite="top_k",
    ),
    KernelRoute(
        "sample(Tensor logits, Tensor temperature, Tensor top_k, Tensor top_p, Tensor min_p,"
        " Tensor greedy, Tensor noise) -> (Tensor, Tensor)",
        sample,
        ops=("sample",),
        composite="sample",
    ),
)
"""The kernels of this module and how the switch routes to them (route.py)."""
