"""The built-in properties as records: each names its observer (``bi_props.execution.execute``,
run in the worker) and its judge (``bi_props.model.properties``, run in the controller).

A property of your own is the same record, registered with ``bi_props.register_property`` (a
target module's ``EXTRA_PROPERTIES``); docs/properties.md.
"""

from __future__ import annotations

from ..execution import execute
from ..model import properties
from ..model.property_spec import BOTH, PropertySpec

PROPERTIES: tuple[PropertySpec, ...] = (
    PropertySpec(
        "routing",
        execute.observe_routing,
        properties.routing,
        "switch propagation and routing: enabled, each covered entry point shows positive "
        "evidence of reaching the target's kernels; disabled, none does",
        needs_hello=True,
    ),
    PropertySpec(
        "reference",
        execute.observe_reference,
        properties.reference,
        "agreement with the float64 CPU reference: bit-exact on exact inputs, else within the "
        "stated bound for the target's declared internal precision",
        values=("exact", "general", "wide"),
    ),
    PropertySpec(
        "batch_invariance",
        execute.observe_batch_invariance,
        properties.batch_invariance,
        "the needle's rows alone == the same rows inside a batch of N samples at any position, "
        "bitwise",
        control=True,
        values=("general", "wide", "exact"),
        batched=True,
        reports_unclaimed=True,
    ),
    PropertySpec(
        "row_permutation",
        execute.observe_row_permutation,
        properties.row_permutation,
        "the batch with its rows (sequence ops: its sequences) in a derangement that moves "
        "every row, the output un-permuted, == the batch in its drawn order, bitwise",
        switches=("enabled",),
        ops=lambda spec: "batch_invariance" in spec.properties,
        values=("general", "wide", "exact"),
        batched=True,
    ),
    PropertySpec(
        "determinism",
        execute.observe_determinism,
        properties.determinism,
        "the same call on the same (batched) tensors twice gives the same bits",
        values=("general", "wide", "special"),
        batched=True,
    ),
    PropertySpec(
        "parity",
        execute.observe_parity,
        properties.parity,
        "switching on changes nothing of the contract: raises or not, exception type, output "
        "dtype, shape, device",
        switches=BOTH,
        values=("general", "exact", "special"),
    ),
    PropertySpec(
        "logprobs",
        execute.observe_logprobs,
        properties.logprobs,
        "model level: a model's per-token logprob vectors of a needle alone == inside a batch, "
        "bitwise (the probe model, vLLM's engine, a transformers model)",
        control=True,
        batched=True,
        explain=properties.explain_model,
        inference_promise=True,
        reports_unclaimed=True,
    ),
    PropertySpec(
        "decode",
        execute.observe_decode,
        properties.decode,
        "model level: one decode step on the KV cache gives the prefill's logprobs, bitwise",
        control=True,
        inference_promise=True,
    ),
)
