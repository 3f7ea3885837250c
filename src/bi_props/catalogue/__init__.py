"""The built-in ops and properties, as data (PyTorch's OpInfo: record types below, data above).

One file per op family: ``products``, ``reductions``, ``normalisation``, ``attention``,
``activations``, ``inference``, ``models``. In each, an op's helpers (operands, shapes, call,
float64 reference, reproducer text), its shape strategy and its ``OpSpec`` sit side by side; the
family's ``OPS`` tuple lists its specs. ``properties.py`` holds the built-in ``PropertySpec``
records. This package concatenates them and installs them in the registries of
``bi_props.model.registry`` (which load it by name on their first read). Users' ops and
properties are the same records, registered with ``register_op`` / ``register_property``.

Importing the catalogue imports neither torch nor Hypothesis: ``call`` imports torch when it runs
(in the worker), a shape strategy imports Hypothesis when it draws (in the controller).

Names (``OPS``) are stable: reports, known-failure files and third-party targets use them.
"""

from __future__ import annotations

from ..model import op_registry, property_spec
from ..model.bounds import (
    LAMBDA,
    SIXTEEN_BIT_CAP_ULPS,
    U32,
    bounded_amplitude,
    output_rounding,
    product_reference,
    sum_error,
)
from ..model.op_registry import (
    _ORIGINS,
    ATEN_BENIGN,
    ATEN_TO_OP,
    OPS,
    cells,
    controls,
    get,
    register_op,
    registered_ops,
)
from ..model.opspec import (
    MODEL_PROPERTIES,
    OP_PROPERTIES,
    PRECISIONS,
    Operand,
    OpSpec,
    Reference,
    ShapeFn,
    accumulation,
    out_dtype,
)
from . import (
    activations,
    attention,
    hf,
    inference,
    models,
    normalisation,
    products,
    properties,
    quantized,
    reductions,
    sampling,
)
from .attention import (
    PAGED_SPARE_BLOCKS,
    PAGED_STALE_SCALE,
    paged_cache,
    paged_decode_call,
    paged_layout,
)
from .models import ENGINE_MAX_COMPANIONS, ENGINE_MAX_TOKENS, ENGINE_SPECIAL_TOKENS, ENGINE_VOCAB

FAMILIES = (
    products, reductions, normalisation, attention, activations, inference, sampling, models,
    quantized, hf,
)  # fmt: skip

_FIRST = (
    "mm", "matmul", "bmm", "addmm", "linear", "sum", "mean", "softmax", "log_softmax", "rms_norm",
    "add_rms_norm", "attention", "silu", "silu_and_mul", "gelu_and_mul", "fused_add_rms_norm",
    "layer_norm", "embedding", "probe_model", "engine", "rotary_embedding", "greedy_argmax",
    "top_k", "fused_moe", "paged_decode_attention",
)  # fmt: skip
"""The order of the first 25 ops (reports and the cells list them in it); an op added later
follows them, in the families' order."""


def _in_order(specs: list[OpSpec]) -> list[OpSpec]:
    rank = {name: i for i, name in enumerate(_FIRST)}
    return sorted(specs, key=lambda spec: rank.get(spec.name, len(rank)))


property_spec.PROPERTIES.install_builtins(properties.PROPERTIES)
op_registry.OPS.install_builtins(_in_order([op for family in FAMILIES for op in family.OPS]))

BUILTIN_OPS = op_registry.OPS.builtin
"""The ops bi_props ships; ``register_op`` adds others to ``OPS``."""

__all__ = [
    "ATEN_BENIGN",
    "ATEN_TO_OP",
    "BUILTIN_OPS",
    "ENGINE_MAX_COMPANIONS",
    "ENGINE_MAX_TOKENS",
    "ENGINE_SPECIAL_TOKENS",
    "ENGINE_VOCAB",
    "FAMILIES",
    "LAMBDA",
    "MODEL_PROPERTIES",
    "OPS",
    "OP_PROPERTIES",
    "PAGED_SPARE_BLOCKS",
    "PAGED_STALE_SCALE",
    "PRECISIONS",
    "SIXTEEN_BIT_CAP_ULPS",
    "U32",
    "_ORIGINS",
    "OpSpec",
    "Operand",
    "Reference",
    "ShapeFn",
    "accumulation",
    "bounded_amplitude",
    "cells",
    "controls",
    "get",
    "out_dtype",
    "output_rounding",
    "paged_cache",
    "paged_decode_call",
    "paged_layout",
    "product_reference",
    "register_op",
    "registered_ops",
    "sum_error",
]
