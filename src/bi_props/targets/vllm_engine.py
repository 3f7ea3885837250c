"""The built-in ``vllm-engine`` target: vLLM's real engine (``vllm.LLM``) with a tiny random model.

The catalogue op ``engine`` sends the needle prompt alone, then inside a batch of up to
``ENGINE_MAX_COMPANIONS`` (31) random prompts, through ``prompt_logprobs`` (below): each prompt
is scored and then generates ``ENGINE_GENERATED`` tokens greedily, and its output is a block of
full-vocabulary logprob vectors, one row per prompt position (the vector that scored that token)
and one per generated token (the vector it was chosen from). The ``logprobs`` property compares
the needle's block alone and in the batch bitwise; ``determinism`` sends the same batch twice.
The model is a random-weight Llama written to a local folder by
``bi_props.targets.engine.write_tiny_model`` (``$BI_PROPS_ENGINE_DIR``, default a folder under
the temporary directory, reused while its spec matches): nothing is downloaded.

One engine per worker, i.e. per switch state, built in ``activate()`` with the switch already in
the environment and kept for every example. It runs in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``
and the ``uni`` executor): the same engine core, scheduler and model runner as the default
multi-process layout, but it starts in seconds rather than tens of seconds, and an error in the
forward reaches the caller as itself (``TypeError``...), not as ``EngineDeadError`` with the cause
only in a log. ``activate()`` also sends one warm-up request (the first request with prompt
logprobs costs seconds once): if building the engine or that first forward raises, the target is
broken *in this switch state* (TargetBroken; the session reports it), not the session.

Nothing here imports vLLM or torch at module import time.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .base import SWITCH_ENV, Target, TargetBroken, TargetMissing

DIR_ENV = "BI_PROPS_ENGINE_DIR"
ENGINE_KWARGS: dict[str, Any] = {
    "dtype": "float32",
    "enforce_eager": True,
    "max_model_len": 128,  # a 24-token prompt and its ENGINE_GENERATED tokens, with room
    "max_num_seqs": 32,  # room for the needle and ENGINE_MAX_COMPANIONS (31) at once
    "max_logprobs": -1,  # full vectors (logprobs=-1): the default caps a request at 20
    "seed": 0,
    "distributed_executor_backend": "uni",
}
# Set before vLLM (and transformers, huggingface_hub) are imported: offline, a small KV cache, and
# the engine core in this process.
ENVIRONMENT = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
}
ENVIRONMENT_DEFAULTS = {"VLLM_CPU_KVCACHE_SPACE": "1"}
WARMUP_TOKENS = (4, 5, 6, 7, 8, 9, 10, 11)

_ENGINE: Any = None
"""The worker's one ``vllm.LLM`` (set by ``VllmEngineTarget.activate``)."""


def model_dir() -> Path:
    """Where the tiny model is written: ``$BI_PROPS_ENGINE_DIR`` or a folder in the temp dir."""
    chosen = os.environ.get(DIR_ENV)
    return Path(chosen) if chosen else Path(tempfile.gettempdir()) / "bi_props-engine-model"


# ---------------------------------------------------------------------------------------------
# Prompts in, logprob vectors out (pure helpers, tested with a fake LLM).


def split_prompts(token_ids: Any, lengths: Sequence[int]) -> list[list[int]]:
    """Packed token ids (a 1-D tensor or sequence) cut into one list of ints per prompt."""
    flat = [int(t) for t in (token_ids.tolist() if hasattr(token_ids, "tolist") else token_ids)]
    lengths = [int(n) for n in lengths]
    if any(n < 1 for n in lengths):
        raise ValueError(f"every prompt needs at least one token, got lengths {lengths}")
    if sum(lengths) != len(flat):
        raise ValueError(f"lengths {lengths} sum to {sum(lengths)}, but {len(flat)} token ids")
    prompts, start = [], 0
    for n in lengths:
        prompts.append(flat[start : start + n])
        start += n
    return prompts


def token_logprobs(prompt: Sequence[int], logprobs: Any) -> list[float]:
    """One prompt's logprob of each token given its prefix, from ``RequestOutput.prompt_logprobs``
    (vLLM 0.32: one entry per prompt position, None or empty for the first, else a dict
    ``{token_id: Logprob}`` that holds the prompt's own token). The first token gets 0.0.
    (The engine op reads whole vectors, ``prompt_vectors``; the scenarios read this.)"""
    _check_positions("prompt_logprobs", len(prompt), logprobs)
    values = [0.0]
    for position in range(1, len(prompt)):
        entry = logprobs[position] or {}
        token = prompt[position]
        if token not in entry:
            raise RuntimeError(
                f"prompt_logprobs: position {position} has no logprob for its token {token} "
                f"(keys {sorted(entry)[:8]})"
            )
        values.append(float(entry[token].logprob))
    return values


def _check_positions(what: str, expected: int, logprobs: Any) -> None:
    """A logprobs container must hold one entry per position: a shorter one means vLLM returned
    less than was asked, and reading on would misalign every row after it."""
    if logprobs is None or len(logprobs) != expected:
        got = "None" if logprobs is None else f"{len(logprobs)} positions"
        raise RuntimeError(f"{what}: expected {expected} positions, got {got}")


def _position(logprobs: Any, index: int) -> tuple[Sequence[int], Sequence[float]]:
    """Token ids and logprobs at one position of a vLLM logprobs container. A ``FlatLogprobs``
    (``flat_logprobs=True``) is read in place: indexing it builds a dict with a ``Logprob`` per
    vocabulary entry, the cost the flat form avoids. A list holds a dict ``{token_id: Logprob}``
    per position (None or empty where there is none)."""
    starts = getattr(logprobs, "start_indices", None)
    if starts is not None:
        start, end = starts[index], logprobs.end_indices[index]
        return logprobs.token_ids[start:end], logprobs.logprobs[start:end]
    entry = logprobs[index] or {}
    return list(entry), [float(v.logprob) for v in entry.values()]


def full_vector(ids: Sequence[int], values: Sequence[float], vocab: int, where: str) -> Any:
    """One position's logprobs as a dense float32 vector over the vocabulary (numpy). Every id
    must be there (what ``logprobs=-1`` asks for): a vector with holes would be compared on
    fewer entries than it claims. An id listed twice (vLLM puts the chosen token first, then
    again among the top-k) must carry the same value both times."""
    import numpy as np

    index = np.asarray(ids, dtype=np.int64)
    given = np.asarray(values, dtype=np.float64)
    if index.size and (int(index.min()) < 0 or int(index.max()) >= vocab):
        outside = index[(index < 0) | (index >= vocab)]
        raise RuntimeError(f"{where}: token ids {outside[:8].tolist()} outside [0, {vocab})")
    seen = np.zeros(vocab, dtype=bool)
    seen[index] = True
    if not seen.all():
        missing = np.flatnonzero(~seen)
        raise RuntimeError(
            f"{where}: no logprob for {missing.size} of the {vocab} vocabulary ids (first "
            f"{missing[:8].tolist()}): not the full vector that logprobs=-1 asks for"
        )
    vector = np.empty(vocab, dtype=np.float64)
    vector[index] = given
    if vector[index].view(np.uint64).tolist() != given.view(np.uint64).tolist():
        raise RuntimeError(f"{where}: a token id is listed twice with different logprobs")
    # vLLM hands float32 logprobs over as Python floats: converting back is exact.
    return vector.astype(np.float32)


def prompt_vectors(prompt: Sequence[int], logprobs: Any, vocab: int) -> Any:
    """A prompt's rows, (len(prompt), vocab) float32, from ``RequestOutput.prompt_logprobs``
    with ``prompt_logprobs=-1``: row p is the full vector that scored token p given tokens
    0..p-1; row 0 is all 0.0 (the first token has no prefix, vLLM returns None there)."""
    import numpy as np

    _check_positions("prompt_logprobs", len(prompt), logprobs)
    rows = np.zeros((len(prompt), vocab), dtype=np.float32)
    for position in range(1, len(prompt)):
        ids, values = _position(logprobs, position)
        where = f"prompt_logprobs: position {position} of a {len(prompt)}-token prompt"
        rows[position] = full_vector(ids, values, vocab, where)
    return rows


def generated_vectors(output: Any, generated: int, vocab: int) -> Any:
    """A prompt's generated rows, (generated, vocab) float32, from its one ``CompletionOutput``
    with ``logprobs=-1``: row i is the full vector from which generated token i was chosen.
    A generation that stopped early (an EOS despite ``ignore_eos``, a stop) would give the
    needle fewer rows alone than in the batch, or none to compare: it raises."""
    import numpy as np

    completions = list(getattr(output, "outputs", None) or [])
    if len(completions) != 1:
        raise RuntimeError(f"expected one completion per prompt, got {len(completions)}")
    (completion,) = completions
    tokens = list(completion.token_ids)
    if len(tokens) != generated:
        raise RuntimeError(
            f"generation stopped after {len(tokens)} of {generated} tokens (finish_reason "
            f"{getattr(completion, 'finish_reason', None)!r}, tokens {tokens}): every prompt "
            f"must generate exactly {generated} (max_tokens={generated}, ignore_eos=True)"
        )
    _check_positions("logprobs of the generated tokens", generated, completion.logprobs)
    rows = np.empty((generated, vocab), dtype=np.float32)
    for i in range(generated):
        ids, values = _position(completion.logprobs, i)
        where = f"logprobs: generated token {i} (id {tokens[i]})"
        rows[i] = full_vector(ids, values, vocab, where)
    return rows


def pack_logprobs(
    outputs: Sequence[Any], prompts: Sequence[Sequence[int]], vocab: int, generated: int
) -> Any:
    """All prompts' rows packed in prompt order, each prompt's positions then its generated
    tokens: float32, (sum(lengths) + generated * len(prompts), vocab)."""
    import numpy as np
    import torch

    if len(outputs) != len(prompts):
        raise RuntimeError(f"{len(prompts)} prompts sent, {len(outputs)} outputs returned")
    blocks = []
    for output, prompt in zip(outputs, prompts, strict=True):
        returned = getattr(output, "prompt_token_ids", None)
        if returned is not None and list(returned) != list(prompt):
            raise RuntimeError(f"output for prompt {list(prompt)} carries {list(returned)}")
        blocks.append(prompt_vectors(prompt, output.prompt_logprobs, vocab))
        blocks.append(generated_vectors(output, generated, vocab))
    if not blocks:
        return torch.zeros((0, vocab), dtype=torch.float32)
    return torch.from_numpy(np.concatenate(blocks))


def _abort_unfinished(llm: Any) -> None:
    """After a failed ``generate``, drop its requests: ``LLM`` leaves them in the engine, and the
    next call would otherwise batch them with its own prompts."""
    try:
        engine = llm.llm_engine
        pending = list(engine.output_processor.request_states)
        if pending:
            engine.abort_request(pending, internal=True)
    except Exception as exc:  # best effort: report, the caller re-raises the original error
        print(f"bi_props: could not abort unfinished requests: {exc!r}", file=sys.stderr)


def sampling_params() -> dict[str, Any]:
    """The engine op's ``SamplingParams``: greedy, exactly ``ENGINE_GENERATED`` new tokens
    (``ignore_eos``: an EOS would cut a row block short), the full vector at every prompt
    position and every generated token (-1: the whole vocabulary; ENGINE_KWARGS' max_logprobs
    allows it). ``flat_logprobs`` and no detokenizing change no number, only the cost: a
    batch of 32 prompts took ~0.4 s rather than ~1.7 s on CPU (vLLM 0.32)."""
    from ..catalogue.models import ENGINE_GENERATED

    return {
        "temperature": 0.0,
        "max_tokens": ENGINE_GENERATED,
        "ignore_eos": True,
        "prompt_logprobs": -1,
        "logprobs": -1,
        "flat_logprobs": True,
        "detokenize": False,
    }


def run_prompts(llm: Any, prompts: Sequence[Sequence[int]]) -> Any:
    """``llm.generate`` on token-id prompts as one batch (``sampling_params``); the packed rows
    (``pack_logprobs``)."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from ..catalogue.models import ENGINE_GENERATED, ENGINE_VOCAB

    params = SamplingParams(**sampling_params())
    requests = [TokensPrompt(prompt_token_ids=list(p)) for p in prompts]
    try:
        outputs = llm.generate(requests, params, use_tqdm=False)
    except Exception:
        _abort_unfinished(llm)
        raise
    return pack_logprobs(outputs, prompts, ENGINE_VOCAB, ENGINE_GENERATED)


def prompt_logprobs(token_ids: Any, lengths: list[int]) -> Any:
    """The entry point of the ``engine`` op (named for its first form, which compared only the
    prompt's tokens): split the packed ``token_ids`` into prompts of ``lengths``, run them as
    one batch through the worker's engine, and return each prompt's full logprob vectors,
    packed in the same order: its positions (row 0 all 0.0: the first token has none), then
    its ``ENGINE_GENERATED`` generated tokens. float32, (sum(lengths) + ENGINE_GENERATED *
    len(lengths), ENGINE_VOCAB)."""
    if _ENGINE is None:
        raise RuntimeError("no engine in this process: VllmEngineTarget.activate() builds it")
    prompts = split_prompts(token_ids, lengths)
    if not prompts:
        import torch

        from ..catalogue.models import ENGINE_VOCAB

        return torch.zeros((0, ENGINE_VOCAB), dtype=torch.float32)
    return run_prompts(_ENGINE, prompts)


# ---------------------------------------------------------------------------------------------
# The target (worker side).


def _renamed(exc: Exception) -> str:
    return str(exc).replace("target 'vllm':", "target 'vllm-engine':", 1)


class VllmEngineTarget(Target):
    one_way = "the engine reads VLLM_BATCH_INVARIANT once: one process per switch state"
    name = "vllm-engine"
    device = "cpu"
    kernel_prefix = ""

    def __init__(self) -> None:
        from .vllm import VllmTarget

        self._vllm = VllmTarget()
        self._spec: dict[str, Any] = {}
        self._dir: Path | None = None
        self._timings: dict[str, float] = {}

    def check(self) -> None:
        """vLLM importable and its batch-invariance module found (the ``vllm`` target's checks
        and messages); the offline and in-process settings go in before anything imports it."""
        os.environ.update(ENVIRONMENT)
        for key, value in ENVIRONMENT_DEFAULTS.items():
            os.environ.setdefault(key, value)
        try:
            self._vllm.check()
        except TargetMissing as exc:
            raise TargetMissing(_renamed(exc)) from None
        except TargetBroken as exc:
            raise TargetBroken(_renamed(exc)) from None
        self.device = self._vllm.device

    def activate(self) -> None:
        global _ENGINE
        from ..catalogue import ENGINE_VOCAB
        from .engine import read_spec, write_tiny_model

        state = f"{SWITCH_ENV}={os.environ.get(SWITCH_ENV)!r}"
        start = time.perf_counter()
        try:
            self._dir = write_tiny_model(model_dir(), vocab=ENGINE_VOCAB)
            self._spec = read_spec(self._dir) or {}
        except Exception as exc:
            from .vllm_install import hint_for

            raise TargetBroken(
                f"target 'vllm-engine': writing the tiny model to {model_dir()} failed: {exc!r}"
                + hint_for(exc)
            ) from None
        self._timings["engine_model_write_s"] = time.perf_counter() - start
        start = time.perf_counter()
        try:
            from vllm import LLM

            _ENGINE = LLM(model=str(self._dir), **ENGINE_KWARGS)
        except Exception as exc:
            from .vllm_install import hint_for

            raise TargetBroken(
                f"target 'vllm-engine': building vllm.LLM failed with {state}: "
                f"{type(exc).__name__}: {exc}" + hint_for(exc)
            ) from None
        self._timings["engine_start_s"] = time.perf_counter() - start
        start = time.perf_counter()
        try:
            run_prompts(_ENGINE, [list(WARMUP_TOKENS)])
        except Exception as exc:
            raise TargetBroken(
                f"target 'vllm-engine': the engine started, but its first request (one prompt of "
                f"{len(WARMUP_TOKENS)} tokens, full logprob vectors) failed with {state}: "
                f"{type(exc).__name__}: {exc}"
            ) from None
        self._timings["engine_first_request_s"] = time.perf_counter() - start

    def covered(self) -> tuple[str, ...]:
        return ("engine",)

    def promises_inference(self) -> bool:
        return True  # VLLM_BATCH_INVARIANT=1 promises batch-invariant inference

    def observe_routing(self) -> str:
        return "none"

    def _envs_switch(self) -> Any:
        try:
            return getattr(importlib.import_module("vllm.envs"), SWITCH_ENV)
        except Exception as exc:
            return f"unreadable: {exc!r}"

    def switch_state(self) -> dict[str, Any]:
        value = self._envs_switch()
        return {
            "active": value is True,
            SWITCH_ENV: os.environ.get(SWITCH_ENV),
            f"envs.{SWITCH_ENV}": value,
        }

    def repro_setup(self, enabled: bool) -> str:
        return (
            "# The engine op needs vLLM and the tiny model:"
            " bi_props.targets.engine.write_tiny_model(dir),"
            "\n# then vllm.LLM(model=dir, ...) as in bi_props.targets.vllm_engine.ENGINE_KWARGS."
        )

    def environment(self) -> dict[str, str]:
        from .vllm import _vllm_version

        env = super().environment()
        env["vllm"] = _vllm_version()
        platform = getattr(self._vllm, "_platform", None)
        env["vllm_platform"] = type(platform).__name__ if platform is not None else "?"
        env["vllm_device_type"] = self.device
        triton = sys.modules.get("vllm.triton_utils")
        if triton is not None and hasattr(triton, "HAS_TRITON"):
            env["vllm_HAS_TRITON"] = str(triton.HAS_TRITON)
        env[f"envs.{SWITCH_ENV}"] = str(self._envs_switch())
        try:  # in-process engine: vLLM's batch-invariant kernels are (or are not) in this process
            names, _ = self._vllm.registered()
            env["vllm_registered"] = ", ".join(names) or "(none)"
        except Exception as exc:
            env["vllm_registered"] = f"unreadable: {exc!r}"
        env["engine_model_dir"] = str(self._dir)
        env["engine_model"] = json.dumps(self._spec, sort_keys=True)
        env["engine_kwargs"] = json.dumps(ENGINE_KWARGS, sort_keys=True)
        env["engine_env"] = json.dumps(
            {k: os.environ.get(k) for k in (*ENVIRONMENT, *ENVIRONMENT_DEFAULTS)}, sort_keys=True
        )
        for key, seconds in self._timings.items():
            env[key] = f"{seconds:.2f}"
        return env

    def precision(self, op: str) -> str:
        """The engine op has no float64 reference (it is judged by logprobs and determinism), so
        no bound depends on this; the model's own kernels are vLLM's, float32 when switched."""
        return "float32"
