"""A user's transformers model as a model-level op (``bi-props model SPEC``).

The op ``hf_model`` runs the model the space names (``[model] spec``: a built-in small
configuration, a config.json or a model directory; execution/hf_model.py) over a right-padded
batch, one sample a sequence of token ids, and returns every real token's logprob vector. The
model-level properties judge it as they judge the probe model: ``logprobs`` (the needle's
vectors alone == inside the batch, bitwise; on a failure, the ops the model used that the target
does not claim), ``decode`` (one decode step on the KV cache == the prefill's vector), and
determinism. Explored only where a space names a model (an opt-in op, like ``engine``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..execution.hf_model import vocab_size
from ..model.case import Case
from ..model.opspec import Operand, OpSpec
from ._shared import Shape, _never_exact

MAX_TOKENS = 32
"""A sequence's tokens at most (every example runs the whole model, alone and in its batch)."""
MAX_COMPANIONS = 7


def _operands(case: Case) -> tuple[Operand, ...]:
    return (Operand("tokens", 0, tokens=case.shape[1]),)


def _shapes(case: Case, rows: int) -> tuple[tuple[int, ...], ...]:
    return ((rows,),)


def _model_of(case: Case) -> Any:
    from ..execution.hf_model import load_model

    return load_model(
        case.opt("spec"),
        case.dtype,
        case.opt("layers"),
        case.opt("hidden"),
        case.opt("attention"),
    )


def _call(entry: str, args: Sequence[Any], case: Case, lengths: Sequence[int]) -> Any:
    from ..execution.hf_model import logprobs, prefill_then_decode

    (tokens,) = args
    model = _model_of(case)
    if case.opt("mode") == "decode":
        return prefill_then_decode(model, tokens)
    return logprobs(model, tokens, [int(n) for n in lengths])


def _no_reference(x: Sequence[np.ndarray], case: Case, lengths: Sequence[int], acc="float32"):
    raise NotImplementedError("a transformers model has no float64 reference; use logprobs")


DEFAULT_SPEC = "llama"
"""The model of a space that names none (the op listed in ``[ops] include`` alone)."""


def model_options(space: Any) -> dict[str, Any]:
    """The space's model (``[model]``; ``DEFAULT_SPEC`` where it names none) as case options: a
    case names its model, so a reproducer or a later run rebuilds the same one."""
    options: dict[str, Any] = {"spec": space.model_spec or DEFAULT_SPEC}
    for key in ("layers", "hidden", "attention"):
        value = getattr(space, f"model_{key}")
        if value:
            options[key] = value
    return options


def draw_hf_model(draw: Any, ctx: Any) -> Shape:
    space, prop = ctx.space, ctx.prop
    options = model_options(space)
    tokens = ctx.clip(space.rows, low=2 if prop == "decode" else 1, high=MAX_TOKENS)
    if prop == "decode":
        options["mode"] = "decode"
    return (
        draw(ctx.integers(tokens.min, max(tokens.min, tokens.max))),
        vocab_size(options["spec"]),
    ), options


def hf_companions(ctx: Any) -> Any:
    tokens = ctx.clip(ctx.space.companion_rows, high=MAX_TOKENS)
    return ctx.integers(tokens.min, tokens.max)


OPS: tuple[OpSpec, ...] = (
    OpSpec(
        name="hf_model",
        entries=("padded",),
        shape_doc="(length, vocab): a sequence of `length` token ids of the model's vocabulary;"
        " options: the model (spec, layers, hidden, attention); output: each token's logprob"
        " vector, (length, vocab) float32 (decode: the prefill's last vector and a decode step's)",
        operands=_operands,
        operand_shapes=_shapes,
        call=_call,
        reference=_no_reference,
        exact_amplitude=_never_exact,
        properties=("logprobs", "decode", "determinism"),
        notes="a user's transformers model (bi-props model SPEC); explored only where a space"
        " names one ([model] spec)",
        draw_shape=draw_hf_model,
        companion_rows=hf_companions,
        max_companions=MAX_COMPANIONS,
    ),
)
