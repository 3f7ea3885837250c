"""A user's Hugging Face transformers model, run the way a serving batch runs it (worker side).

``bi-props model SPEC`` asks the model-level question of the model a user deploys: does a
sequence's logprob vector depend on the other sequences of its batch, with the target's switch
on? SPEC is a built-in small configuration of a common architecture (``BUILTIN_CONFIGS``), a
``config.json`` or a local model directory (its weights when it has them, else random ones).
Random weights come from a fixed seed, so every worker of a run holds the same model. Sizes are
the configuration's, cut only where the user asks (``layers``, ``hidden``).

A batch is right-padded with an attention mask and per-sequence positions from 0 (what a padded
serving batch holds); the needle alone is its own unpadded batch of one. Nothing here imports
torch or transformers at module import time (the controller reads ``vocab_size`` from here).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

_DENSE: dict[str, Any] = {
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
}
BUILTIN_CONFIGS: dict[str, dict[str, Any]] = {
    "llama": {"model_type": "llama", **_DENSE},
    "qwen2": {"model_type": "qwen2", **_DENSE},
    "mistral": {"model_type": "mistral", **_DENSE},
    "qwen2_moe": {
        "model_type": "qwen2_moe",
        **_DENSE,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 64,
        "num_experts": 8,
        "num_experts_per_tok": 2,
    },
}
"""Small configurations of common architectures (random weights): Llama, Qwen2, Mistral and a
Qwen-MoE (8 experts, 2 per token, a shared expert)."""

WEIGHT_SEED = 0
_MODELS: dict[tuple, Any] = {}


class ModelSpecError(ValueError):
    """SPEC names no built-in configuration and no readable config.json."""


def config_dict(spec: str) -> dict[str, Any]:
    """The configuration SPEC names, as a dict (no transformers needed): a built-in name, a
    config.json, or a directory holding one."""
    if spec in BUILTIN_CONFIGS:
        return dict(BUILTIN_CONFIGS[spec])
    path = Path(spec)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise ModelSpecError(
            f"model {spec!r}: not a built-in configuration ({', '.join(BUILTIN_CONFIGS)}), and "
            f"{path} is not a file; pass one of those names, a config.json or a model directory"
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelSpecError(f"model {spec!r}: {path} is not readable JSON: {exc}") from None
    if not isinstance(data, dict) or "model_type" not in data:
        raise ModelSpecError(f"model {spec!r}: {path} has no 'model_type' (a transformers config)")
    return data


@functools.lru_cache(maxsize=16)
def vocab_size(spec: str) -> int:
    """The vocabulary of SPEC's configuration (a multimodal one's text part); read once per
    process: every drawn case asks it."""
    data = config_dict(spec)
    size = data.get("vocab_size") or (data.get("text_config") or {}).get("vocab_size")
    if not isinstance(size, int) or size < 1:
        raise ModelSpecError(f"model {spec!r}: its configuration has no vocab_size")
    return size


def model_type_problem(spec: str) -> str | None:
    """Why transformers cannot build SPEC's configuration (its model_type unknown to the
    installed transformers), or None: said once by ``bi-props model``, not per example."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    model_type = config_dict(spec)["model_type"]
    if model_type in CONFIG_MAPPING_NAMES:
        return None
    return (
        f"model {spec!r}: model_type {model_type!r} is not one this transformers knows; "
        "upgrade transformers or pass a configuration of a known architecture"
    )


def _scaled(data: dict[str, Any], layers: int | None, hidden: int | None) -> dict[str, Any]:
    """The configuration cut to ``layers`` layers and a ``hidden`` width (the heads' size kept
    where it divides: heads = hidden // head size), only where the user asked."""
    data = dict(data)
    if layers:
        data["num_hidden_layers"] = layers
    if hidden:
        heads = int(data.get("num_attention_heads", 1))
        head_dim = int(data.get("head_dim") or data.get("hidden_size", hidden) // heads)
        new_heads = max(1, hidden // max(1, head_dim))
        kv = int(data.get("num_key_value_heads", heads))
        data["hidden_size"] = hidden
        data["num_attention_heads"] = new_heads
        data["num_key_value_heads"] = max(1, min(kv, new_heads))
        while new_heads % data["num_key_value_heads"]:
            data["num_key_value_heads"] -= 1
        data["head_dim"] = head_dim
    return data


def load_model(
    spec: str,
    dtype: str,
    layers: int | None = None,
    hidden: int | None = None,
    attention: str | None = None,
) -> Any:
    """SPEC's model in ``dtype``, evaluation mode, built once per worker: random weights from
    ``WEIGHT_SEED`` unless SPEC is a directory with weights."""
    key = (spec, dtype, layers, hidden, attention)
    if key in _MODELS:
        return _MODELS[key]
    import torch

    try:
        import transformers
    except ImportError as exc:
        raise ModelSpecError(
            "bi-props model needs transformers: pip install 'bi_props[model]'"
        ) from exc
    data = _scaled(config_dict(spec), layers, hidden)
    model_type = data.pop("model_type")
    config = transformers.AutoConfig.for_model(model_type, **data)
    if attention:
        config._attn_implementation = attention
    path = Path(spec)
    weights = path.is_dir() and any(path.glob("*.safetensors")) and not (layers or hidden)
    torch_dtype = getattr(torch, dtype)
    if weights:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            path, config=config, torch_dtype=torch_dtype
        )
    else:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(WEIGHT_SEED)
            model = transformers.AutoModelForCausalLM.from_config(config)
        model = model.to(torch_dtype)
    model.eval()
    _MODELS[key] = model
    return model


def _padded(tokens: Any, lengths: list[int]) -> tuple[Any, Any, Any]:
    """Packed token ids -> right-padded ids, the attention mask and positions from 0."""
    import torch

    batch, longest = len(lengths), max(lengths)
    ids = torch.zeros((batch, longest), dtype=torch.long)
    mask = torch.zeros((batch, longest), dtype=torch.long)
    start = 0
    for b, n in enumerate(lengths):
        ids[b, :n] = tokens[start : start + n]
        mask[b, :n] = 1
        start += n
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids, mask, positions


def logprobs(model: Any, tokens: Any, lengths: list[int]) -> Any:
    """Every real token's logprob vector over the vocabulary (float32, log_softmax of the
    logits), packed in sequence order: (sum(lengths), vocab)."""
    import torch

    ids, mask, positions = _padded(tokens, lengths)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits
    out = torch.log_softmax(logits.float(), dim=-1)
    return torch.cat([out[b, :n] for b, n in enumerate(lengths)])


def prefill_then_decode(model: Any, tokens: Any) -> tuple[Any, Any]:
    """One sequence: the prefill's logprob vector at its last token, and the same vector from
    one decode step over the KV cache of the tokens before it (both (1, vocab) float32)."""
    import torch

    ids = tokens.reshape(1, -1).long()
    with torch.no_grad():
        full = model(input_ids=ids).logits[:, -1]
        prefix = model(input_ids=ids[:, :-1], use_cache=True)
        step = model(
            input_ids=ids[:, -1:],
            past_key_values=prefix.past_key_values,
            use_cache=True,
        ).logits[:, -1]
    return torch.log_softmax(full.float(), dim=-1), torch.log_softmax(step.float(), dim=-1)


__all__ = [
    "BUILTIN_CONFIGS",
    "ModelSpecError",
    "config_dict",
    "load_model",
    "logprobs",
    "model_type_problem",
    "prefill_then_decode",
    "vocab_size",
]
