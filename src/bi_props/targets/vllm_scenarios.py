"""Replay engine scenarios (bi_props.model.scenario) on vLLM's real engine, in this process.

``ScenarioDriver`` builds one ``vllm.LLM`` per engine configuration the scenarios ask for (the
tiny random Llama of ``targets.engine``, float32, eager unless the configuration turns CUDA
graphs on (on CUDA only: ``engine_kwargs``), in-process and the ``uni`` executor as
the ``vllm-engine`` target builds it) and keeps it: on CPU a build costs about a second, the
first request of a process tens of seconds. A replay then drives the engine's own
``LLMEngine.add_request`` / ``step`` API: each request is added before the engine step its
``arrival`` names (an idle engine takes the next arrival at once: steps with nothing to run do not
exist), and the engine is stepped until every request finished. Per request it returns the
generated token ids, the float32 bit pattern of each one's logprob (the raw logprob vLLM reports,
before temperature), the prompt tokens the engine served from its prefix cache
(``RequestOutput.num_cached_tokens``) and how often the scheduler resumed it after a preemption;
and the timeline: per step, which requests the scheduler ran, prefill or decode, how many tokens
(read from the scheduler's own ``SchedulerOutput``).

Every replay starts on an empty prefix cache (``reset_prefix_cache``), so a scenario's result does
not depend on what ran before it. Engines are kept for the driver's life (a space's configuration
lists bound how many). When vLLM raises mid-replay, the driver aborts what the engine holds and
replays a canary (one fixed request, replayed right after the engine was built): only if the
canary comes out bitwise as it did then is the engine used again; else it is retired (kept
referenced, never collected: collecting an in-process engine runs its shutdown, which tears down
the process-wide distributed groups every other engine here uses) and the next replay of its
configuration builds a fresh one. ``DriverError`` marks the driver's own failures, apart from
vLLM raising. The switch (``VLLM_BATCH_INVARIANT``) is whatever this process'
environment says when vLLM is first imported: the vLLM lane runs the stock state.

Nothing here imports vLLM or torch at module import time.
"""

from __future__ import annotations

import itertools
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

from ..model.scenario import (
    BLOCK_SIZE,
    DEFAULT_MAX_NUM_SEQS,
    PIECEWISE_MODES,
    EngineConfig,
    Request,
    RequestResult,
    Scenario,
    ScenarioResult,
    Scheduled,
)
from ..model.scenario_judge import float_bits
from .vllm_engine import ENVIRONMENT, ENVIRONMENT_DEFAULTS

MAX_MODEL_LEN = 64
"""Two blocks of ``BLOCK_SIZE``: a request's prompt plus generated tokens must fit."""
ROOMY_BLOCKS = 64
"""The KV pool of a configuration without ``kv_blocks``: never runs out for the small spaces."""
CUDA_MEMORY_SHARE = 0.04
"""Of the GPU's memory, what one engine may plan for on CUDA (about 3 GiB of an H100's 80: the
tiny model and its few KV blocks need far less). Several engines live in one process."""
MAX_STEPS = 2000
MAX_RETIRED = 24
"""Engines retired after failing their canary, at most (each keeps its memory)."""
CANARY = tuple(range(4, 12))


def engine_kwargs(config: EngineConfig, cuda: bool = False) -> dict[str, Any]:
    """``vllm.LLM`` keyword arguments for an engine configuration (``cuda``: vLLM runs on CUDA).

    On CUDA each engine asks for ``CUDA_MEMORY_SHARE`` of the GPU (``gpu_memory_utilization``,
    vllm/engine/arg_utils.py:596): vLLM's default (0.92, vllm/config/cache.py:102) is checked
    against the free memory at every build (vllm/v1/worker/utils.py:716-745), so the second
    engine this driver keeps in the same process would be refused.

    Eager (``enforce_eager=True``) unless the configuration turns CUDA graphs on. Then, as vLLM
    0.32.0 names them: ``enforce_eager=False`` (vllm/engine/arg_utils.py:630; with it True vLLM
    sets ``cudagraph_mode`` NONE and drops the capture sizes, vllm/config/vllm.py:1927-1932) and
    a ``compilation_config`` dict (vllm/entrypoints/llm.py:217,266-273 turns it into a
    ``CompilationConfig``) with ``cudagraph_capture_sizes`` (vllm/config/compilation.py:651: the
    sizes given, not vLLM's inferred list) and ``cudagraph_mode`` by name (compilation.py:610,
    parsed from a string at :873-879). A mode without piecewise graphs (FULL, FULL_DECODE_ONLY)
    gets ``mode`` NONE as well (compilation.py:37-41: no torch.compile; full graphs need no
    compilation, compilation.py:636-640), which spares each engine build an Inductor compile;
    the piecewise modes keep vLLM's default (VLLM_COMPILE, which they require,
    vllm/config/vllm.py:1077-1094). On a platform without static graphs (CPU) vLLM would set
    NONE silently (vllm/config/vllm.py:1940): ``ScenarioDriver`` refuses that instead."""
    kwargs: dict[str, Any] = {
        "dtype": "float32",
        "enforce_eager": config.cuda_graph_sizes is None,
        "max_model_len": MAX_MODEL_LEN,
        "seed": 0,
        "distributed_executor_backend": "uni",
        "block_size": BLOCK_SIZE,
        "enable_prefix_caching": config.prefix_caching,
        "enable_chunked_prefill": config.chunk_budget is not None,
        "num_gpu_blocks_override": config.kv_blocks or ROOMY_BLOCKS,
        "max_num_seqs": config.max_num_seqs or DEFAULT_MAX_NUM_SEQS,
    }
    if cuda:
        kwargs["gpu_memory_utilization"] = CUDA_MEMORY_SHARE
    if config.chunk_budget is not None:
        kwargs["max_num_batched_tokens"] = config.chunk_budget
    if config.cuda_graph_sizes is not None:
        compilation: dict[str, Any] = {
            "cudagraph_capture_sizes": list(config.cuda_graph_sizes),
            "cudagraph_mode": config.cuda_graph_mode,
        }
        if config.cuda_graph_mode not in PIECEWISE_MODES:
            compilation["mode"] = "NONE"  # CompilationMode by name (compilation.py:853-871)
        kwargs["compilation_config"] = compilation
    return kwargs


CPU_GRAPHS = (
    "CUDA graphs need vLLM on CUDA, but this vLLM runs on {platform} "
    "(vllm.platforms.current_platform), where it would run every CUDA-graph scenario eagerly "
    "without a word"
)


def vllm_platform() -> str:
    """The device vLLM runs on here (``cuda``, ``cpu``...); imports vLLM's platform module."""
    from vllm.platforms import current_platform

    return "cuda" if current_platform.is_cuda() else str(current_platform.device_type or "?")


def sampling_kwargs(request: Any) -> dict[str, Any]:
    """``SamplingParams`` keyword arguments for a scenario request: exactly ``max_tokens`` tokens
    (EOS ignored), the logprob of each generated token, greedy or seeded."""
    kwargs: dict[str, Any] = {
        "max_tokens": request.max_tokens,
        "ignore_eos": True,
        "logprobs": 0,
        "temperature": request.temperature,
    }
    if not request.greedy:
        kwargs["seed"] = request.seed
    if request.prompt_logprobs:
        kwargs["prompt_logprobs"] = 0
    return kwargs


class DriverError(RuntimeError):
    """The driver could not replay a scenario for a reason of its own (not vLLM raising)."""


class _Recorder:
    """Wraps one scheduler's ``schedule``: keeps each step's SchedulerOutput for the timeline."""

    def __init__(self, scheduler: Any) -> None:
        self.outputs: list[Any] = []
        original = scheduler.schedule

        def schedule(*args: Any, **kwargs: Any) -> Any:
            out = original(*args, **kwargs)
            self.outputs.append(out)
            return out

        scheduler.schedule = schedule


def external_id(req_id: str) -> str:
    """The id ``add_request`` was given: vLLM 0.32 schedules ``f"{id}-{8 random characters}"``
    (``InputProcessor.assign_request_id``)."""
    return req_id.rsplit("-", 1)[0]


def _step_entries(output: Any, index: dict[str, int], prompts: dict[str, int]):
    """(timeline entries, resumed request ids) of one SchedulerOutput, by external request id."""
    computed: dict[str, int] = {}
    for new in output.scheduled_new_reqs:
        computed[external_id(new.req_id)] = new.num_computed_tokens
    cached = output.scheduled_cached_reqs
    for req_id, done in zip(cached.req_ids, cached.num_computed_tokens, strict=True):
        computed[external_id(req_id)] = done
    entries = []
    for req_id, tokens in output.num_scheduled_tokens.items():
        rid = external_id(req_id)
        if rid not in index:
            raise DriverError(f"the scheduler ran request {req_id!r}, not one of this replay's")
        done = computed.get(rid, 0)
        phase = "prefill" if done < prompts[rid] else ("decode" if tokens == 1 else "recompute")
        entries.append(Scheduled(index[rid], phase, int(tokens)))
    entries.sort(key=lambda e: e.request)
    resumed = getattr(cached, "resumed_req_ids", ()) or ()
    return tuple(entries), {external_id(r) for r in resumed}


class ScenarioDriver:
    """Engines by configuration, and ``__call__(scenario) -> ScenarioResult`` (a ``Replay``)."""

    def __init__(self, model_dir: str | os.PathLike) -> None:
        self.model_dir = Path(model_dir)
        self._engines: dict[EngineConfig, tuple[Any, _Recorder]] = {}
        self._ids = itertools.count()
        self.timings: dict[str, float] = {"build_s": 0.0, "replay_s": 0.0}
        self.replays = 0
        self.builds = 0
        self.recovered = 0
        """Times vLLM raised and the engine passed its canary afterwards (kept in use)."""
        self._retired: list[Any] = []
        self._canaries: dict[EngineConfig, ScenarioResult] = {}
        self._trainer: Any = None
        self.platform: str | None = None
        """The device vLLM runs on (``vllm_platform``), read at the first engine build."""
        self.observed: Counter[str] = Counter()
        """How many replays showed each thing the engine did (ScenarioResult.observed)."""

    @staticmethod
    def prepare_environment() -> None:
        """Offline, in-process engine core: set before vLLM is imported (as the target does)."""
        os.environ.update(ENVIRONMENT)
        for key, value in ENVIRONMENT_DEFAULTS.items():
            os.environ.setdefault(key, value)

    @property
    def engines(self) -> tuple[EngineConfig, ...]:
        return tuple(self._engines)

    def engine(self, config: EngineConfig) -> tuple[Any, _Recorder]:
        if config not in self._engines:
            self.prepare_environment()
            if self.platform is None:
                self.platform = vllm_platform()
            if config.cuda_graph_sizes is not None and self.platform != "cuda":
                raise DriverError(CPU_GRAPHS.format(platform=self.platform))
            from vllm import LLM

            start = time.perf_counter()
            kwargs = engine_kwargs(config, cuda=self.platform == "cuda")
            llm = LLM(model=str(self.model_dir), **kwargs)
            engine = llm.llm_engine
            scheduler = engine.engine_core.engine_core.scheduler  # InprocClient -> EngineCore
            self._engines[config] = (llm, _Recorder(scheduler))
            self.timings["build_s"] += time.perf_counter() - start
            self.builds += 1
            self._canaries[config] = self._replay(self._canary(config))
        llm, recorder = self._engines[config]
        return llm.llm_engine, recorder

    def trainer_logprobs(self, prompt: tuple[int, ...], generated: tuple[int, ...]) -> list[float]:
        """The trainer's view: the same tiny model through a plain transformers forward (batch
        of one, float32, eager attention, in this process and so in its state's kernels), the
        float32 logprob of each generated token given everything before it."""
        import torch

        if self._trainer is None:
            from transformers import AutoModelForCausalLM

            self._trainer = AutoModelForCausalLM.from_pretrained(
                str(self.model_dir), torch_dtype=torch.float32, attn_implementation="eager"
            ).eval()
        ids = torch.tensor([[*prompt, *generated]], dtype=torch.long)
        with torch.no_grad():
            logits = self._trainer(input_ids=ids).logits[0].float()
        logprobs = torch.log_softmax(logits, dim=-1)
        start = len(prompt) - 1  # the logits at position p predict token p + 1
        return [float(logprobs[start + i, t]) for i, t in enumerate(generated)]

    @property
    def retired(self) -> int:
        return len(self._retired)

    @staticmethod
    def _canary(config: EngineConfig) -> Scenario:
        return Scenario((Request(CANARY, max_tokens=2),), config)

    def __call__(self, scenario: Scenario) -> ScenarioResult:
        try:
            result = self._replay(scenario)
        except BaseException:
            self._recover(scenario.config)
            raise
        self.replays += 1
        self.observed.update(result.observed())
        return result

    def _replay(self, scenario: Scenario) -> ScenarioResult:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        engine, recorder = self.engine(scenario.config)
        if engine.has_unfinished_requests():
            raise DriverError("the engine still holds requests from an earlier replay")
        if not engine.reset_prefix_cache():
            raise DriverError("reset_prefix_cache() refused: the replay would start warm")
        start = time.perf_counter()
        serial = next(self._ids)
        ids = [f"s{serial}-r{i}" for i in range(len(scenario.requests))]
        index = {rid: i for i, rid in enumerate(ids)}
        prompts = {rid: len(r.prompt) for rid, r in zip(ids, scenario.requests, strict=True)}
        pending = sorted(range(len(ids)), key=lambda i: (scenario.requests[i].arrival, i))
        finals: dict[int, Any] = {}
        timeline: list[tuple[Scheduled, ...]] = []
        resumed = [0] * len(ids)
        recorder.outputs.clear()
        step = 0
        try:
            while pending or engine.has_unfinished_requests():
                due = [i for i in pending if scenario.requests[i].arrival <= step]
                if not due and not engine.has_unfinished_requests():
                    first = scenario.requests[pending[0]].arrival  # idle: the next arrival now
                    due = [i for i in pending if scenario.requests[i].arrival == first]
                for i in due:
                    pending.remove(i)
                    request = scenario.requests[i]
                    engine.add_request(
                        ids[i],
                        TokensPrompt(prompt_token_ids=list(request.prompt)),
                        SamplingParams(**sampling_kwargs(request)),
                    )
                outputs = engine.step()
                for out in recorder.outputs:
                    entries, back = _step_entries(out, index, prompts)
                    timeline.append(entries)
                    for rid in back:
                        if rid in index:
                            resumed[index[rid]] += 1
                recorder.outputs.clear()
                for out in outputs:
                    if out.finished and out.request_id in index:
                        finals[index[out.request_id]] = out
                step += 1
                if step > MAX_STEPS:
                    raise DriverError(f"the scenario did not finish in {MAX_STEPS} engine steps")
        finally:
            recorder.outputs.clear()
        results = []
        for i, rid in enumerate(ids):
            if i not in finals:
                raise DriverError(f"request {i} ({rid}) never finished")
            results.append(self._result(finals[i], resumed[i], scenario.requests[i]))
        self.timings["replay_s"] += time.perf_counter() - start
        return ScenarioResult(tuple(results), tuple(timeline))

    def _recover(self, config: EngineConfig) -> None:
        """After vLLM raised mid-replay: abort what the engine holds, then replay the canary;
        an engine whose canary differs (or raises) is retired."""
        if config not in self._engines:
            return  # the build itself raised
        llm, _ = self._engines[config]
        try:
            engine = llm.llm_engine
            pending = list(engine.output_processor.request_states)
            if pending:
                engine.abort_request(pending, internal=True)
            if self._replay(self._canary(config)) == self._canaries[config]:
                self.recovered += 1
                return
        except Exception:
            pass
        self._retired.append(self._engines.pop(config))
        if len(self._retired) > MAX_RETIRED:
            raise DriverError(f"{len(self._retired)} engines retired after vLLM raised")

    @staticmethod
    def _result(output: Any, resumed: int, request: Any) -> RequestResult:
        completion = output.outputs[0]
        tokens = tuple(int(t) for t in completion.token_ids)
        logprobs = completion.logprobs or []
        if len(logprobs) != len(tokens):
            raise DriverError(f"{len(tokens)} tokens but {len(logprobs)} logprob entries")
        bits = []
        for position, (token, entry) in enumerate(zip(tokens, logprobs, strict=True)):
            if token not in entry:
                raise DriverError(f"no logprob for generated token {position} ({token})")
            bits.append(float_bits(float(entry[token].logprob)))
        prompt_bits: tuple[int, ...] = ()
        if request.prompt_logprobs:
            from .vllm_engine import token_logprobs  # position 0 gets 0.0: no logprob there

            values = token_logprobs(list(request.prompt), output.prompt_logprobs)[1:]
            prompt_bits = tuple(float_bits(v) for v in values)
        return RequestResult(
            tokens,
            tuple(bits),
            cached_tokens=int(output.num_cached_tokens or 0),
            preempted=resumed,
            prompt_logprob_bits=prompt_bits,
        )
