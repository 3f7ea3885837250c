"""Model-level ops: the probe model (model-level properties) and a real inference engine
(vLLM's LLM on a tiny random model: the vllm-engine target).

One op's helpers, shape strategy and OpSpec (in ``OPS``) side by side (``bi_props.catalogue``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..model.case import Case
from ..model.opspec import (
    MODEL_PROPERTIES,
    Operand,
    OpSpec,
)
from ._shared import (
    Shape,
    _entry_function,
    _never_exact,
)

MODEL_LAYOUTS = ("packed", "padded", "mixed", "decode")
"""The probe model's batch layouts (its entries): a packed prefill, a padded one, a mixed engine
step (the needle decodes its last token while its companions prefill) and a decode step (every
sequence decodes its last token over a paged KV cache, through paged_decode_attention)."""


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
    from ..execution.probe_model import (
        ProbeModel,
        config_of,
        decode_step,
        mixed_step,
        prefill_then_decode,
        run_batch,
    )

    tokens, weights = args
    model = ProbeModel(weights, config_of(case.shape), dict(case.opt("entries", ()) or ()))
    if case.opt("mode") == "decode":
        return prefill_then_decode(model, tokens)
    if entry == "decode":  # one output row per sequence, in batch order
        return decode_step(model, tokens, list(lengths))
    if entry == "mixed":  # the needle is the only sequence alone, else at its batch position
        needle = 0 if len(lengths) == 1 or case.batch is None else case.batch.position
        return mixed_step(model, tokens, list(lengths), needle)
    return run_batch(model, tokens, list(lengths), entry)


def _model_output_rows(case: Case, rows: int) -> int:
    """In the mixed and decode layouts the needle decodes: one output row (its next token's
    logprobs)."""
    return 1 if case.entry in ("mixed", "decode") and case.opt("mode") != "decode" else rows


def _model_companion_rows(case: Case, companion: Any) -> int:
    """A companion prefills in the mixed layout (its rows), decodes in the decode layout (one)."""
    return 1 if case.entry == "decode" and case.opt("mode") != "decode" else companion.rows


def _no_reference(x: Sequence[np.ndarray], case: Case, lengths: Sequence[int], acc="float32"):
    raise NotImplementedError("the probe model has no float64 reference; use logprobs/decode")


ENGINE_VOCAB = 512
"""The tiny model's vocabulary
(bi_props.targets.engine.write_tiny_model(vocab=ENGINE_VOCAB))."""


ENGINE_SPECIAL_TOKENS = 4
"""Token ids below this are the tokenizer's specials (unk, bos, eos, pad): prompts avoid them."""


ENGINE_MAX_TOKENS = 24


ENGINE_GENERATED = 4
"""Tokens each prompt generates (greedy, EOS ignored): each adds an output row, the full logprob
vector it was chosen from, so that decode steps over the batch's KV cache are compared as well
as the prefill."""


ENGINE_MAX_COMPANIONS = 31
"""Prompts of 1..24 tokens, a needle and at most 31 companion prompts: batches of tens of
sequences (the engine is built with max_num_seqs=32 and max_model_len=128, room for 24 + 4)."""


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


def draw_probe_model(draw: Any, ctx: Any) -> Shape:
    options: dict[str, Any] = {}
    space, prop = ctx.space, ctx.prop
    length = ctx.integers(2 if prop == "decode" else 1, max(2, min(space.attention_length.max, 12)))
    if prop == "decode":
        options["mode"] = "decode"
    kv_heads = draw(ctx.choice((1, 2)))
    heads = kv_heads * draw(ctx.choice((1, 2)))
    head_dim = draw(ctx.choice((8, 16)))
    vocab = draw(ctx.choice((16, 64, 257)))
    return (
        draw(length),
        draw(ctx.choice((1, 2))),
        heads,
        kv_heads,
        head_dim,
        vocab,
        draw(ctx.choice((16, 48))),
    ), options


def probe_model_companions(ctx: Any) -> Any:
    return ctx.integers(1, max(1, min(ctx.space.attention_length.max, 24)))


def draw_engine(draw: Any, ctx: Any) -> Shape:
    # One prompt of 1..24 tokens (within the space's rows) of the tiny model's vocabulary.
    tokens = ctx.clip(ctx.space.rows, high=ENGINE_MAX_TOKENS)
    return (draw(ctx.integers(tokens.min, tokens.max)), ENGINE_VOCAB), {}


def engine_companions(ctx: Any) -> Any:
    tokens = ctx.clip(ctx.space.companion_rows, high=ENGINE_MAX_TOKENS)
    return ctx.integers(tokens.min, tokens.max)


OPS: tuple[OpSpec, ...] = (
    OpSpec(
        name="probe_model",
        entries=MODEL_LAYOUTS,
        shape_doc="(length, layers, heads, kv_heads, head_dim, vocab, intermediate); entry is"
        " the batch layout (packed, padded, mixed: the needle decodes its last token while"
        " its companions prefill, or decode: every sequence decodes its last token over a paged"
        " KV cache); tokens per sample, one flat weight vector",
        operands=_model_operands,
        operand_shapes=_model_shapes,
        call=_model_call,
        reference=_no_reference,
        exact_amplitude=_never_exact,
        properties=MODEL_PROPERTIES,
        notes="logprobs (T, vocab) float32; the mismatch's first index is the first diverging"
        " token",
        draw_shape=draw_probe_model,
        companion_rows=probe_model_companions,
        output_rows=_model_output_rows,
        companion_output_rows=_model_companion_rows,
    ),
    OpSpec(
        name="engine",
        entries=("bi_props.targets.vllm_engine.prompt_logprobs",),
        shape_doc="(length, vocab): the needle prompt's token ids (length,) per sample, in"
        f" [4, vocab); each sample is one prompt, which then generates {ENGINE_GENERATED} tokens"
        f" greedily; output: per prompt, length + {ENGINE_GENERATED} rows of full logprob"
        " vectors (vocab,): one per prompt"
        " position (the vector that scored its token given its prefix; row 0, the first token,"
        " all 0.0) and one per generated token (the vector it was chosen from), packed",
        operands=_engine_operands,
        operand_shapes=_engine_shapes,
        call=_engine_call,
        reference=_engine_no_reference,
        exact_amplitude=_never_exact,
        properties=("logprobs", "determinism"),
        notes="a real engine (the vllm-engine target); explored only where a space lists it"
        f" in [ops] include; logprobs (length + {ENGINE_GENERATED}, vocab) float32: the"
        " mismatch's first index"
        " is (row, vocabulary id), rows past the prompt's length its generated tokens",
        draw_shape=draw_engine,
        companion_rows=engine_companions,
        max_companions=ENGINE_MAX_COMPANIONS,
        output_rows=lambda case, rows: rows + ENGINE_GENERATED,
        companion_output_rows=lambda case, companion: companion.rows + ENGINE_GENERATED,
    ),
)
