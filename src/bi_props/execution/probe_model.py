"""A probe model in plain torch: a small decoder LLM running on whatever ops the target installed.

Op-level properties can pass while a model still drifts: an op missing from the catalogue, a
composition effect, attention over variable lengths. This model calls the same public entry points
a serving engine does (``F.linear``, ``F.rms_norm``, ``F.silu``, ``torch.log_softmax`` and the
catalogue's ``add_rms_norm`` / ``varlen_attention`` entry points, looked up at call time so target
swaps apply): token embedding, RMSNorm with residual, rotary attention with grouped KV heads over
packed variable-length sequences, a SwiGLU MLP, lm_head, log_softmax.

Four batch layouts: ``packed`` (the tokens of all sequences concatenated, attention per sequence,
as vLLM schedules a prefill step), ``padded`` (each sequence right-padded to the longest, as
trainers do), ``mixed`` (one engine step of a mixed batch: the needle decodes its last token
over its KV cache while the companions prefill, attention through the catalogue's
``mixed_attention`` entry, as vLLM's chunked-prefill scheduler mixes them) and ``decode`` (one
decode step of a batch: every sequence decodes its last token over a paged KV cache of its
earlier tokens, attention through the catalogue's ``paged_decode_attention`` entry, the kernel a
serving engine spends its decode steps in).
Weights are one flat tensor sliced into views, so a case carries one seed for all of them. Imported
only in workers.
"""

from __future__ import annotations

import importlib
import itertools
import math
import sys
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

ROPE_BASE = 10000.0
MAX_POSITIONS = 4096
PAGE_BLOCK = 16
"""Keys per block of the decode layout's paged KV cache."""


@dataclass(frozen=True)
class ModelConfig:
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    intermediate: int

    @property
    def hidden(self) -> int:
        return self.heads * self.head_dim

    def parameters(self) -> list[tuple[str, tuple[int, ...]]]:
        h, hd = self.hidden, self.head_dim
        shapes: list[tuple[str, tuple[int, ...]]] = [("embed", (self.vocab, h))]
        for i in range(self.layers):
            shapes += [
                (f"{i}.input_norm", (h,)),
                (f"{i}.qkv", ((self.heads + 2 * self.kv_heads) * hd, h)),
                (f"{i}.o", (h, self.heads * hd)),
                (f"{i}.post_norm", (h,)),
                (f"{i}.gate_up", (2 * self.intermediate, h)),
                (f"{i}.down", (h, self.intermediate)),
            ]
        return [*shapes, ("final_norm", (h,)), ("lm_head", (self.vocab, h))]


def config_of(shape: tuple[int, ...]) -> ModelConfig:
    """A case's shape is (length, layers, heads, kv_heads, head_dim, vocab, intermediate)."""
    _, layers, heads, kv_heads, head_dim, vocab, intermediate = shape
    return ModelConfig(layers, heads, kv_heads, head_dim, vocab, intermediate)


def unflatten(flat: Tensor, config: ModelConfig) -> dict[str, Tensor]:
    """Views of the flat weight vector; matrices scaled by 1/sqrt(fan_in), norms centred on 1."""
    weights, offset = {}, 0
    for name, shape in config.parameters():
        size = math.prod(shape)
        w = flat[offset : offset + size].reshape(shape)
        offset += size
        if len(shape) == 1:
            w = w * 0.1 + 1.0
        elif name != "embed":
            w = w * (1.0 / math.sqrt(shape[1]))
        weights[name] = w
    return weights


def _entry(dotted: str):
    module, _, attr = dotted.rpartition(".")  # sys.modules first: Dynamo traces it (compiled)
    return getattr(sys.modules.get(module) or importlib.import_module(module), attr)


_ROPE: dict[tuple, tuple[Tensor, Tensor]] = {}


def rope_cache(head_dim: int, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """cos/sin for positions 0..MAX_POSITIONS-1, computed once (as vLLM's cos_sin_cache is) in
    float64 and rounded: a row is then gathered by position, never recomputed per batch."""
    key = (head_dim, dtype)
    if key not in _ROPE:
        half = head_dim // 2
        inv = ROPE_BASE ** (-torch.arange(half, dtype=torch.float64) * 2 / head_dim)
        angles = torch.arange(MAX_POSITIONS, dtype=torch.float64)[:, None] * inv[None, :]
        _ROPE[key] = (angles.cos().to(dtype), angles.sin().to(dtype))
    return _ROPE[key]


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotary embedding (neox style) of x (T, heads, head_dim) at the gathered cos/sin (T, half)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)


class ProbeModel:
    """The forward pass over packed tokens, optionally continuing from a KV cache (decode)."""

    def __init__(self, flat: Tensor, config: ModelConfig, entries: dict[str, str] | None = None):
        self.config = config
        self.w = unflatten(flat, config)
        entries = entries or {}
        self.add_rms_norm = _entry(entries.get("add_rms_norm", "bi_props.ops.add_rms_norm"))
        self.attention = _entry(entries.get("attention", "bi_props.ops.varlen_attention"))
        self.mixed_attention = _entry(
            entries.get("mixed_attention", "bi_props.ops.mixed_attention")
        )
        self.paged_decode_attention = _entry(
            entries.get("paged_decode_attention", "bi_props.ops.paged_decode_attention")
        )
        self.eps = 1e-6

    def _add_norm(self, x: Tensor, residual: Tensor, weight: Tensor) -> tuple[Tensor, Tensor]:
        y, *rest = self.add_rms_norm(x, residual, weight, self.eps)
        return y, rest[-1]

    def _embed(self, tokens: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The tokens' embeddings and the rotary cos/sin at their positions."""
        w = self.w
        cos, sin = rope_cache(self.config.head_dim, w["embed"].dtype)
        return w["embed"][tokens], cos[positions], sin[positions]

    def _qkv(
        self, x: Tensor, residual: Tensor, i: int, cos: Tensor, sin: Tensor
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Layer ``i``'s input norm and QKV projection: rotated q (T, heads, head_dim), rotated
        k and v (T, kv_heads, head_dim), and the residual."""
        cfg, w = self.config, self.w
        hd, nh, nkv = cfg.head_dim, cfg.heads, cfg.kv_heads
        h, residual = self._add_norm(x, residual, w[f"{i}.input_norm"])
        qkv = F.linear(h, w[f"{i}.qkv"])
        q = qkv[:, : nh * hd].reshape(-1, nh, hd)
        k = qkv[:, nh * hd : (nh + nkv) * hd].reshape(-1, nkv, hd)
        v = qkv[:, (nh + nkv) * hd :].reshape(-1, nkv, hd)
        return _rotate(q, cos, sin), _rotate(k, cos, sin), v, residual

    def _layer_tail(self, a: Tensor, residual: Tensor, i: int) -> tuple[Tensor, Tensor]:
        """Attention's output projection and the MLP of layer ``i``."""
        cfg, w = self.config, self.w
        x = F.linear(a.reshape(-1, cfg.heads * cfg.head_dim), w[f"{i}.o"])
        h, residual = self._add_norm(x, residual, w[f"{i}.post_norm"])
        gate, up = F.linear(h, w[f"{i}.gate_up"]).chunk(2, dim=-1)
        return F.linear(F.silu(gate) * up, w[f"{i}.down"]), residual

    def step(
        self,
        tokens: Tensor,
        positions: Tensor,
        query_lengths: list[int],
        caches: list[list[tuple[Tensor, Tensor]] | None],
    ) -> Tensor:
        """One engine step over a mixed batch: sequence b's ``query_lengths[b]`` new tokens
        (packed in ``tokens``) continue its KV cache ``caches[b]`` (None: a prefill from position
        0). Keys per sequence are its cache's followed by its new tokens', and attention runs
        once over the whole batch through ``mixed_attention`` (cu_seqlens_q, cu_seqlens_k).
        Log-probabilities (sum(query_lengths), vocab) in float32."""
        cfg, w = self.config, self.w
        x, cos, sin = self._embed(tokens, positions)
        residual = torch.zeros_like(x)
        bounds = [0, *itertools.accumulate(query_lengths)]
        for i in range(cfg.layers):
            q, k, v, residual = self._qkv(x, residual, i, cos, sin)
            keys, values, key_lengths = [], [], []
            for b, cache in enumerate(caches):
                new_k, new_v = k[bounds[b] : bounds[b + 1]], v[bounds[b] : bounds[b + 1]]
                if cache is not None:
                    new_k, new_v = torch.cat((cache[i][0], new_k)), torch.cat((cache[i][1], new_v))
                keys.append(new_k)
                values.append(new_v)
                key_lengths.append(new_k.shape[0])
            a = self.mixed_attention(
                q,
                torch.cat(keys),
                torch.cat(values),
                torch.tensor(bounds, dtype=torch.int64),
                cu_seqlens_of(key_lengths),
                1.0 / math.sqrt(cfg.head_dim),
                True,
            )
            x, residual = self._layer_tail(a, residual, i)
        h, _ = self._add_norm(x, residual, w["final_norm"])
        return torch.log_softmax(F.linear(h, w["lm_head"]).float(), dim=-1)

    def decode(
        self,
        tokens: Tensor,
        positions: Tensor,
        caches: list[list[tuple[Tensor, Tensor]] | None],
    ) -> Tensor:
        """One decode step of a batch: token b continues the KV cache ``caches[b]`` (the
        per-layer (K, V) of its earlier tokens; None: none). Each layer's keys go into a paged
        cache (``paged_cache``) and attention runs once over the batch through
        ``paged_decode_attention``. Log-probabilities (B, vocab) in float32."""
        cfg, w = self.config, self.w
        x, cos, sin = self._embed(tokens, positions)
        residual = torch.zeros_like(x)
        for i in range(cfg.layers):
            q, k, v, residual = self._qkv(x, residual, i, cos, sin)
            keys, values = [], []
            for b, cache in enumerate(caches):
                new_k, new_v = k[b : b + 1], v[b : b + 1]
                if cache is not None:
                    new_k, new_v = torch.cat((cache[i][0], new_k)), torch.cat((cache[i][1], new_v))
                keys.append(new_k)
                values.append(new_v)
            k_cache, v_cache, table, lengths = paged_cache(keys, values)
            a = self.paged_decode_attention(
                q, k_cache, v_cache, table, lengths, 1.0 / math.sqrt(cfg.head_dim)
            )
            x, residual = self._layer_tail(a, residual, i)
        h, _ = self._add_norm(x, residual, w["final_norm"])
        return torch.log_softmax(F.linear(h, w["lm_head"]).float(), dim=-1)

    def forward(
        self,
        tokens: Tensor,
        positions: Tensor,
        cu_seqlens: Tensor,
        cache: list[tuple[Tensor, Tensor]] | None = None,
        only_last: bool = False,
    ) -> tuple[Tensor, list[tuple[Tensor, Tensor]]]:
        """Log-probabilities (T, vocab) in float32 and the per-layer (K, V) of these tokens.

        With ``cache`` (one sequence), the tokens continue it: keys and values are the cache's
        followed by the new ones, and each new query attends to the whole prefix."""
        cfg, w = self.config, self.w
        hd, nh, nkv = cfg.head_dim, cfg.heads, cfg.kv_heads
        x, cos, sin = self._embed(tokens, positions)
        residual = torch.zeros_like(x)
        new_cache = []
        for i in range(cfg.layers):
            q, k, v, residual = self._qkv(x, residual, i, cos, sin)
            new_cache.append((k, v))
            if cache is None:
                a = self.attention(q, k, v, cu_seqlens, 1.0 / math.sqrt(hd), True)
            else:
                past_k, past_v = cache[i]
                keys, values = torch.cat((past_k, k)), torch.cat((past_v, v))
                # Queries of the cached prefix are placeholders: their rows are dropped.
                full_q = torch.cat((torch.zeros_like(past_k.repeat_interleave(nh // nkv, 1)), q))
                total = torch.tensor([0, keys.shape[0]], dtype=torch.int64)
                a = self.attention(full_q, keys, values, total, 1.0 / math.sqrt(hd), True)
                a = a[past_k.shape[0] :]
            x, residual = self._layer_tail(a, residual, i)
        h, _ = self._add_norm(x, residual, w["final_norm"])
        if only_last:
            h = h[-1:]
        logits = F.linear(h, w["lm_head"])
        return torch.log_softmax(logits.float(), dim=-1), new_cache


def positions_of(lengths: list[int]) -> Tensor:
    return torch.cat([torch.arange(n, dtype=torch.int64) for n in lengths] or [torch.zeros(0)])


def cu_seqlens_of(lengths: list[int]) -> Tensor:
    return torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int64)


def run_batch(model: ProbeModel, tokens: Tensor, lengths: list[int], layout: str) -> Tensor:
    """Logprobs (sum(lengths), vocab) of a batch, in packed order, computed in ``layout``."""
    if layout == "packed":
        out, _ = model.forward(tokens, positions_of(lengths), cu_seqlens_of(lengths))
        return out
    # padded: every sequence right-padded (with token 0) to the longest; causal attention means a
    # real token never sees padding. Rows are gathered back into packed order.
    longest = max(lengths, default=0)
    padded = torch.zeros(len(lengths) * longest, dtype=tokens.dtype)
    keep = []
    start = 0
    for b, n in enumerate(lengths):
        padded[b * longest : b * longest + n] = tokens[start : start + n]
        keep.extend(range(b * longest, b * longest + n))
        start += n
    same = [longest] * len(lengths)
    out, _ = model.forward(padded, positions_of(same), cu_seqlens_of(same))
    return out[torch.tensor(keep, dtype=torch.int64)]


def mixed_step(model: ProbeModel, tokens: Tensor, lengths: list[int], decoding: int) -> Tensor:
    """Logprobs of one mixed engine step, in packed order: sequence ``decoding`` decodes its last
    token over the KV cache of its earlier tokens (prefilled on their own in an earlier step, as
    an engine did; none for a one-token sequence) and owns one output row; every other sequence
    prefills all its tokens beside it. The needle alone is the same step without companions."""
    seqs = list(torch.split(tokens, lengths))
    prefix = seqs[decoding][:-1]
    cache = None
    if prefix.shape[0]:
        n = prefix.shape[0]
        _, cache = model.forward(prefix, positions_of([n]), cu_seqlens_of([n]))
    queries = [s[-1:] if b == decoding else s for b, s in enumerate(seqs)]
    query_lengths = [q.shape[0] for q in queries]
    positions = [
        torch.tensor([lengths[b] - 1]) if b == decoding else torch.arange(n, dtype=torch.int64)
        for b, n in enumerate(query_lengths)
    ]
    caches = [cache if b == decoding else None for b in range(len(seqs))]
    return model.step(torch.cat(queries), torch.cat(positions), query_lengths, caches)


def paged_cache(keys: list[Tensor], values: list[Tensor]) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Sequences' keys and values (each (L_b, kv_heads, head_dim)) in a paged pool, as an
    engine's block manager lays them out: sequence b in consecutive blocks of ``PAGE_BLOCK``
    keys after sequence b - 1's (its last block zero-padded). Returns (k_cache, v_cache
    (num_blocks, PAGE_BLOCK, kv_heads, head_dim), block_table (B, most blocks) int32, the
    unused entries block 0, seq_lens (B,) int32)."""
    counts = [-(-t.shape[0] // PAGE_BLOCK) for t in keys]
    kv_heads, head_dim = keys[0].shape[1], keys[0].shape[2]
    pool = (max(sum(counts), 1), PAGE_BLOCK, kv_heads)
    k_cache = keys[0].new_zeros((*pool, head_dim))
    v_cache = values[0].new_zeros((*pool, values[0].shape[2]))
    table = torch.zeros((len(keys), max(counts, default=1)), dtype=torch.int32)
    start = 0
    for b, (k, v) in enumerate(zip(keys, values, strict=True)):
        n, blocks = k.shape[0], counts[b]
        k_cache[start : start + blocks].view(-1, kv_heads, head_dim)[:n] = k
        v_cache[start : start + blocks].view(-1, kv_heads, v.shape[2])[:n] = v
        table[b, :blocks] = torch.arange(start, start + blocks, dtype=torch.int32)
        start += blocks
    lengths = torch.tensor([k.shape[0] for k in keys], dtype=torch.int32)
    return k_cache, v_cache, table, lengths


def decode_step(model: ProbeModel, tokens: Tensor, lengths: list[int]) -> Tensor:
    """Logprobs (len(lengths), vocab) of one decode step of a batch: each sequence's last token
    over the KV cache of its earlier tokens (prefilled on their own in an earlier step, as an
    engine did; none for a one-token sequence), one output row per sequence, attention through
    the paged decode kernel. The needle alone is the same step without companions."""
    caches = []
    for sequence in torch.split(tokens, lengths):
        n = sequence.shape[0] - 1
        cache = None
        if n:
            _, cache = model.forward(sequence[:-1], positions_of([n]), cu_seqlens_of([n]))
        caches.append(cache)
    last = torch.cat([s[-1:] for s in torch.split(tokens, lengths)])
    positions = torch.tensor([n - 1 for n in lengths], dtype=torch.int64)
    return model.decode(last, positions, caches)


def prefill_then_decode(model: ProbeModel, tokens: Tensor) -> tuple[Tensor, Tensor]:
    """(full prefill's last row, the same row from prefill of all but the last token + one decode
    step with the KV cache). Equal bits mean decode is consistent with prefill."""
    n = tokens.shape[0]
    full, _ = model.forward(tokens, positions_of([n]), cu_seqlens_of([n]))
    _, cache = model.forward(tokens[:-1], positions_of([n - 1]), cu_seqlens_of([n - 1]))
    step, _ = model.forward(
        tokens[-1:], torch.tensor([n - 1]), cu_seqlens_of([1]), cache=cache, only_last=True
    )
    return full[-1:], step
