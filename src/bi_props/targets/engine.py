"""A tiny random-weight Llama written to a local folder, for the engine-level property.

``write_tiny_model`` writes a ``LlamaForCausalLM`` (safetensors) and an offline tokenizer (a
``tokenizers`` WordLevel vocabulary wrapped in ``PreTrainedTokenizerFast``) with
``save_pretrained``, so that ``vllm.LLM(model=directory)`` runs with nothing downloaded. The weights
come from numpy's PCG64 seeded by (seed, parameter index), not from torch's generator or
transformers' init code: the same seed gives the same model on every machine and version.

Imported only in workers (the ``vllm-engine`` target): transformers, tokenizers and torch are
imported inside the functions. ``tiny_model_spec`` is pure and imports nothing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

SPEC_FILE = "bi_props_tiny_model.json"
FORMAT = 1  # bump when the written files change for the same parameters
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<pad>")  # ids 0..3: unk, bos, eos, pad
MIN_HEAD_DIM = 32  # vLLM's CPU attention: head sizes 32, 64, 80, ... (cpu_attn.py)
INIT_STD = 0.02  # LlamaConfig.initializer_range


def tiny_model_spec(
    seed: int = 0,
    layers: int = 2,
    hidden: int = 64,
    heads: int = 2,
    kv_heads: int = 1,
    vocab: int = 512,
) -> dict[str, Any]:
    """The parameters of a tiny model, validated; what ``write_tiny_model`` records and compares."""
    if heads < 1 or kv_heads < 1 or heads % kv_heads:
        raise ValueError(f"heads ({heads}) must be a positive multiple of kv_heads ({kv_heads})")
    if hidden % heads:
        raise ValueError(f"hidden ({hidden}) must be a multiple of heads ({heads})")
    head_dim = hidden // heads
    if head_dim < MIN_HEAD_DIM:
        raise ValueError(
            f"head_dim = hidden / heads = {head_dim}: vLLM's CPU attention needs at least "
            f"{MIN_HEAD_DIM} (first forward fails with 'Unsupported CPU attention configuration')"
        )
    if layers < 1:
        raise ValueError(f"layers must be >= 1, got {layers}")
    if vocab <= len(SPECIAL_TOKENS):
        raise ValueError(f"vocab must exceed the {len(SPECIAL_TOKENS)} special tokens, got {vocab}")
    return {
        "format": FORMAT,
        "seed": int(seed),
        "layers": int(layers),
        "hidden": int(hidden),
        "heads": int(heads),
        "kv_heads": int(kv_heads),
        "head_dim": head_dim,
        "vocab": int(vocab),
        "intermediate": 2 * int(hidden),
        "max_position_embeddings": 256,
    }


def tokenizer_vocab(vocab: int) -> dict[str, int]:
    """The special tokens (ids 0-3), then ``t4``, ``t5``, ... up to ``vocab`` entries."""
    table = {name: i for i, name in enumerate(SPECIAL_TOKENS)}
    for i in range(len(SPECIAL_TOKENS), vocab):
        table[f"t{i}"] = i
    return table


def read_spec(directory: str | os.PathLike) -> dict[str, Any] | None:
    """The spec ``write_tiny_model`` recorded in ``directory`` (None: none, or unreadable)."""
    try:
        return json.loads((Path(directory) / SPEC_FILE).read_text())
    except (OSError, ValueError):
        return None


def _complete(directory: Path, spec: dict[str, Any]) -> bool:
    files = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
    return read_spec(directory) == spec and all((directory / f).is_file() for f in files)


def write_tiny_model(
    directory: str | os.PathLike,
    seed: int = 0,
    layers: int = 2,
    hidden: int = 64,
    heads: int = 2,
    kv_heads: int = 1,
    vocab: int = 512,
) -> Path:
    """Write the model and tokenizer to ``directory`` (created), unless it already holds the same
    spec. Safe to call from two workers at once (a lock file next to the folder). Returns the
    folder."""
    spec = tiny_model_spec(seed, layers, hidden, heads, kv_heads, vocab)
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    with _locked(directory.parent / f".{directory.name}.lock"):
        if _complete(directory, spec):
            return directory
        directory.mkdir(parents=True, exist_ok=True)
        (directory / SPEC_FILE).unlink(missing_ok=True)  # written last: marks a complete folder
        _write_tokenizer(directory, spec)
        _write_model(directory, spec)
        (directory / SPEC_FILE).write_text(json.dumps(spec, indent=1, sort_keys=True) + "\n")
    return directory


class _locked:
    """An exclusive ``flock`` on ``path`` for the duration of a ``with`` (a no-op without fcntl)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.handle: Any = None

    def __enter__(self) -> _locked:
        try:
            import fcntl
        except ImportError:  # pragma: no cover - not POSIX
            return self
        self.handle = self.path.open("a")
        fcntl.flock(self.handle, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.handle is not None:
            self.handle.close()  # closing releases the lock


def _write_tokenizer(directory: Path, spec: dict[str, Any]) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    unk, bos, eos, pad = SPECIAL_TOKENS
    tok = Tokenizer(models.WordLevel(vocab=tokenizer_vocab(spec["vocab"]), unk_token=unk))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=bos, eos_token=eos, unk_token=unk, pad_token=pad
    )
    fast.save_pretrained(str(directory))


def config_kwargs(spec: dict[str, Any]) -> dict[str, Any]:
    """``LlamaConfig`` keyword arguments for a spec."""
    return {
        "vocab_size": spec["vocab"],
        "hidden_size": spec["hidden"],
        "intermediate_size": spec["intermediate"],
        "num_hidden_layers": spec["layers"],
        "num_attention_heads": spec["heads"],
        "num_key_value_heads": spec["kv_heads"],
        "head_dim": spec["head_dim"],
        "max_position_embeddings": spec["max_position_embeddings"],
        "initializer_range": INIT_STD,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 3,
    }


def _write_model(directory: Path, spec: dict[str, Any]) -> None:
    import numpy as np
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**config_kwargs(spec))
    config.dtype = "float32"  # the checkpoint's dtype, as config.json records it
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for index, (name, param) in enumerate(sorted(model.named_parameters())):
            if name.endswith("norm.weight"):
                param.fill_(1.0)  # RMSNorm weights start at one, as transformers initialises them
                continue
            rng = np.random.default_rng([spec["seed"], index])
            values = rng.standard_normal(tuple(param.shape)) * INIT_STD
            param.copy_(torch.from_numpy(values.astype(np.float32)))
    model.save_pretrained(str(directory), safe_serialization=True)
