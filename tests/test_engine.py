"""The engine-level property (op ``engine``, target ``vllm-engine``), without vLLM.

The main CI has neither vLLM nor transformers: here the prompt splitting and logprob packing of
``prompt_logprobs`` run against a fake ``LLM`` (and fake ``vllm`` modules for SamplingParams and
TokensPrompt), the catalogue op and its strategy are checked, and the default search spaces must
leave ``engine`` out. The real engine, and the model writer (it needs transformers), run in the
vLLM lane: tests/vllm_lane/lane_engine.py (scripts/ci_vllm_lane.sh).
"""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, Phase, find, given, settings

from bi_props.catalogue import ENGINE_SPECIAL_TOKENS, ENGINE_VOCAB, OPS, cells, controls
from bi_props.catalogue.models import ENGINE_GENERATED
from bi_props.catalogue.strategies import ENGINE_MAX_COMPANIONS, ENGINE_MAX_TOKENS, cases
from bi_props.execution import materialize as M
from bi_props.execution.execute import observe
from bi_props.model import properties
from bi_props.model.case import Batch, Case, Companion
from bi_props.model.property_spec import controls_of
from bi_props.model.space import DEFAULT_OPS, OPT_IN_OPS, PROFILES, load_profile, parse
from bi_props.targets import BUILTIN, TargetBroken, TargetMissing, resolve
from bi_props.targets import vllm_engine as E
from bi_props.targets.base import Target
from bi_props.targets.engine import (
    MIN_HEAD_DIM,
    SPECIAL_TOKENS,
    tiny_model_spec,
    tokenizer_vocab,
)

ENTRY = "bi_props.targets.vllm_engine.prompt_logprobs"
FAST = settings(
    max_examples=25, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)
FIND = settings(
    max_examples=2000, deadline=None, database=None, phases=(Phase.generate, Phase.shrink)
)
ENGINE_SPACE = parse(  # more companions than the op's cap (the default space has 7): the cap shows
    {"ops": {"include": ["engine"]}, "batch": {"max_companions": 64}}, "engine.toml", "engine"
)


# ---------------------------------------------------------------------------------------------
# A fake vLLM: LLM.generate returns RequestOutput-like objects that follow vLLM 0.32 with
# prompt_logprobs=-1 and logprobs=-1: per prompt position (None for the first) and per generated
# token a dict {token_id: Logprob} over the whole vocabulary, the chosen token first (as vLLM
# lists it), or the same in a FlatLogprobs-like container.


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class Completion:
    token_ids: list[int]
    logprobs: list | None
    finish_reason: str = "length"


@dataclass
class Output:
    prompt_token_ids: list[int]
    prompt_logprobs: list | None
    outputs: list = field(default_factory=list)


class Flat:
    """vLLM's FlatLogprobs, as far as the op reads it: flat lists with per-position ranges, and
    indexing that builds the position's dict (what token_logprobs reads)."""

    def __init__(self) -> None:
        self.start_indices: list[int] = []
        self.end_indices: list[int] = []
        self.token_ids: list[int] = []
        self.logprobs: list[float] = []

    def append(self, entry: dict | None) -> None:
        self.start_indices.append(len(self.logprobs))
        for token, value in (entry or {}).items():
            self.token_ids.append(token)
            self.logprobs.append(value.logprob)
        self.end_indices.append(len(self.logprobs))

    def __len__(self) -> int:
        return len(self.start_indices)

    def __getitem__(self, index: int) -> dict:
        span = range(self.start_indices[index], self.end_indices[index])
        return {self.token_ids[i]: Logprob(self.logprobs[i]) for i in span}


class SamplingParams:
    def __init__(self, **kwargs):
        self.kwargs = kwargs


VOCAB_IDS = np.arange(ENGINE_VOCAB)


def fake_vector(prefix: list[int], batch: int) -> np.ndarray:
    """A float32 logprob vector of the prefix (its length and content); ``batch`` leaks the
    batch size in (0: none)."""
    shift = 0.001 * len(prefix) + 1e-5 * (sum(prefix) % 97) + 0.01 * batch
    return (-np.log(2.0 + VOCAB_IDS) - shift).astype(np.float32)


def fake_choice(prefix: list[int]) -> int:
    """The fake's 'greedy' token after ``prefix``: a non-special id that depends on it."""
    return ENGINE_SPECIAL_TOKENS + (7 * sum(prefix) + len(prefix)) % 500


def _entry(vector: np.ndarray, first: int, drop: int | None = None) -> dict:
    """vLLM's dict for one position: the chosen (or prompt) token first, then every id."""
    entry = {first: Logprob(float(vector[first]), rank=3)}
    entry.update({t: Logprob(float(v), rank=t + 1) for t, v in enumerate(vector.tolist())})
    if drop is not None:
        del entry[drop]
    return entry


class FakeLLM:
    """``drift``: the batch size leaks into every vector; ``generated_drift``: only into the
    generated tokens' vectors; ``stop_after``: generation stops (EOS) after that many tokens;
    ``drop``: that vocabulary id is missing from the last prompt position; ``flat``: the
    containers are FlatLogprobs-like."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[list[int]], dict, bool]] = []
        self.drift = self.generated_drift = self.fail = self.flat = False
        self.first = "none"
        self.stop_after: int | None = None
        self.drop: int | None = None
        self.aborted: list[tuple[list[str], bool]] = []
        self.pending = {"7": None, "8": None}

        outer = self

        class Engine:
            class output_processor:
                request_states = outer.pending

            @staticmethod
            def abort_request(ids, internal=False):
                outer.aborted.append((list(ids), internal))

        self.llm_engine = Engine()

    def _container(self) -> Any:
        return Flat() if self.flat else []

    def _output(self, p: list[int], params: dict, batch: int) -> Output:
        prompt = self._container()
        prompt.append({"none": None, "empty": {}}[self.first])
        for i in range(1, len(p)):
            drop = self.drop if i == len(p) - 1 else None
            prompt.append(_entry(fake_vector(p[:i], batch if self.drift else 0), p[i], drop))
        sequence, generated = list(p), self._container()
        new = params["max_tokens"] if self.stop_after is None else self.stop_after
        leak = batch if self.drift or self.generated_drift else 0
        for _ in range(new):
            token = fake_choice(sequence)
            generated.append(_entry(fake_vector(sequence, leak), token))
            sequence.append(token)
        finish = "length" if self.stop_after is None else "stop"
        return Output(p, prompt, [Completion(sequence[len(p) :], generated, finish)])

    def generate(self, requests, params, use_tqdm=True):
        prompts = [list(r["prompt_token_ids"]) for r in requests]
        self.calls.append((prompts, params.kwargs, use_tqdm))
        if self.fail:
            raise TypeError("'function' object is not subscriptable")
        return [self._output(p, params.kwargs, len(prompts)) for p in prompts]


@pytest.fixture
def fake_vllm(monkeypatch):
    """Fake ``vllm`` and ``vllm.inputs`` modules (SamplingParams, TokensPrompt) and a fake engine
    in the module's ``_ENGINE``."""
    vllm = types.ModuleType("vllm")
    vllm.SamplingParams = SamplingParams
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = lambda **kw: dict(kw)  # a TypedDict: calling it builds a dict
    vllm.inputs = inputs
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.inputs", inputs)
    llm = FakeLLM()
    monkeypatch.setattr(E, "_ENGINE", llm)
    return llm


def _expected(prompts: list[list[int]]) -> np.ndarray:
    """The fake's rows, packed: per prompt a zero row, its positions' vectors, then the vectors
    of its ENGINE_GENERATED greedy tokens."""
    rows = []
    for p in prompts:
        rows.append(np.zeros(ENGINE_VOCAB, dtype=np.float32))
        rows += [fake_vector(p[:i], 0) for i in range(1, len(p))]
        sequence = list(p)
        for _ in range(ENGINE_GENERATED):
            rows.append(fake_vector(sequence, 0))
            sequence.append(fake_choice(sequence))
    return np.stack(rows)


def _bits(x: Any) -> np.ndarray:
    return np.asarray(x, dtype=np.float32).view(np.uint32)


# ---------------------------------------------------------------------------------------------
# prompt_logprobs: splitting, one batched generate call, packing


def test_split_prompts():
    assert E.split_prompts(torch.tensor([5, 6, 7, 8, 9, 10]), [2, 1, 3]) == [
        [5, 6],
        [7],
        [8, 9, 10],
    ]
    assert E.split_prompts([4, 5], [2]) == [[4, 5]]
    assert E.split_prompts(torch.zeros(0, dtype=torch.int64), []) == []
    with pytest.raises(ValueError, match="sum to 3, but 4 token ids"):
        E.split_prompts([1, 2, 3, 4], [1, 2])
    with pytest.raises(ValueError, match="at least one token"):
        E.split_prompts([1, 2], [2, 0])


@pytest.mark.parametrize("flat", [False, True])
def test_prompt_logprobs_packs_full_vectors_in_prompt_order(fake_vllm, flat):
    """Per prompt: its positions' full vectors (row 0 zeros), then its generated tokens'; prompts
    in order; the same from list-of-dict and FlatLogprobs containers."""
    fake_vllm.flat = flat
    tokens = torch.tensor([10, 11, 12, 20, 30, 31, 32, 33], dtype=torch.int64)
    out = E.prompt_logprobs(tokens, [3, 1, 4])
    prompts = [[10, 11, 12], [20], [30, 31, 32, 33]]
    rows = 3 + 1 + 4 + 3 * ENGINE_GENERATED
    assert out.dtype == torch.float32 and tuple(out.shape) == (rows, ENGINE_VOCAB)
    np.testing.assert_array_equal(_bits(out.numpy()), _bits(_expected(prompts)))
    starts = [0, 3 + ENGINE_GENERATED, 4 + 2 * ENGINE_GENERATED]  # each prompt's first token
    assert all(not out[s].any() for s in starts)
    # The generated rows are whole vectors, not one value: the vocabulary's, of the sequence so far.
    first_generated = fake_vector(prompts[0], 0)
    np.testing.assert_array_equal(_bits(out[3].numpy()), _bits(first_generated))
    # One generate call for the whole batch, with the sampling the op documents.
    ((sent, kwargs, use_tqdm),) = fake_vllm.calls
    assert sent == prompts and use_tqdm is False
    assert kwargs == E.sampling_params()
    assert kwargs["temperature"] == 0.0 and kwargs["max_tokens"] == ENGINE_GENERATED
    assert kwargs["ignore_eos"] is True
    assert kwargs["prompt_logprobs"] == kwargs["logprobs"] == -1


def test_prompt_logprobs_accepts_flat_logprobs_first_position(fake_vllm):
    """FlatLogprobs (vLLM's flat container) gives {} rather than None for the first position."""
    fake_vllm.first = "empty"
    out = E.prompt_logprobs(torch.tensor([4, 5, 6]), [3])
    np.testing.assert_array_equal(out.numpy(), _expected([[4, 5, 6]]))


def test_prompt_logprobs_bits_survive_the_float_round_trip(fake_vllm):
    """vLLM returns float32 logprobs as Python floats; packing them back is exact, bit for bit."""
    tokens = torch.arange(4, 4 + 24)
    out = E.prompt_logprobs(tokens, [24])
    for i in range(1, 24):
        np.testing.assert_array_equal(
            _bits(out[i].numpy()), _bits(fake_vector(tokens[:i].tolist(), 0))
        )


def test_engine_settings_hold_the_largest_batch():
    """vLLM refuses logprobs=-1 past max_logprobs (default 20), a prompt past max_model_len,
    and schedules at most max_num_seqs sequences together."""
    assert E.ENGINE_KWARGS["max_logprobs"] == -1
    assert E.ENGINE_KWARGS["max_num_seqs"] >= 1 + ENGINE_MAX_COMPANIONS >= 32
    assert E.ENGINE_KWARGS["max_model_len"] >= ENGINE_MAX_TOKENS + ENGINE_GENERATED


def test_token_logprobs_reads_the_prompt_tokens():
    """The scenarios' helper: each prompt token's own logprob, from dicts or a flat container."""
    entries = [None, {5: Logprob(-1.5), 9: Logprob(-0.5)}, {6: Logprob(-2.0)}]
    assert E.token_logprobs([4, 5, 6], entries) == [0.0, -1.5, -2.0]
    flat = Flat()
    for entry in entries:
        flat.append(entry)
    assert E.token_logprobs([4, 5, 6], flat) == [0.0, -1.5, -2.0]


def test_prompt_logprobs_rejects_malformed_outputs():
    with pytest.raises(RuntimeError, match="expected 3 positions, got 2"):
        E.token_logprobs([4, 5, 6], [None, {5: Logprob(-1.0)}])
    with pytest.raises(RuntimeError, match="no logprob for its token 6"):
        E.token_logprobs([4, 5, 6], [None, {5: Logprob(-1.0)}, {9: Logprob(-1.0)}])
    with pytest.raises(RuntimeError, match="expected 1 positions, got None"):
        E.token_logprobs([4], None)
    with pytest.raises(RuntimeError, match="expected 2 positions, got 1"):
        E.prompt_vectors([4, 5], [None], ENGINE_VOCAB)
    with pytest.raises(RuntimeError, match="carries"):
        E.pack_logprobs([Output([4, 9], [None, {}])], [[4, 5]], ENGINE_VOCAB, ENGINE_GENERATED)
    with pytest.raises(RuntimeError, match="2 prompts sent, 1 outputs"):
        E.pack_logprobs([Output([4], [None])], [[4], [5]], ENGINE_VOCAB, ENGINE_GENERATED)
    with pytest.raises(RuntimeError, match="expected one completion per prompt, got 0"):
        E.pack_logprobs([Output([4], [None])], [[4]], ENGINE_VOCAB, ENGINE_GENERATED)


def test_full_vector_checks_the_vocabulary():
    vector = fake_vector([4, 5], 0)
    entry = _entry(vector, 9)
    ids, values = list(entry), [v.logprob for v in entry.values()]
    np.testing.assert_array_equal(
        _bits(E.full_vector(ids, values, ENGINE_VOCAB, "x")), _bits(vector)
    )
    keep = [i for i, token in enumerate(ids) if token != 17]
    with pytest.raises(RuntimeError, match=r"here: no logprob for 1 of the 512 .*\(first \[17\]\)"):
        E.full_vector([ids[i] for i in keep], [values[i] for i in keep], ENGINE_VOCAB, "here")
    with pytest.raises(RuntimeError, match=r"outside \[0, 512\)"):
        E.full_vector([*ids, 512], [*values, -1.0], ENGINE_VOCAB, "x")
    with pytest.raises(RuntimeError, match="listed twice with different logprobs"):
        E.full_vector([9, *ids], [-100.0, *values], ENGINE_VOCAB, "x")


def test_a_missing_vocabulary_entry_raises(fake_vllm):
    """A position whose vector lacks an id (what logprobs=-1 must not do) is not compared on
    fewer entries: the op raises, naming the position."""
    fake_vllm.drop = 100
    with pytest.raises(RuntimeError, match=r"position 2 of a 3-token prompt: no logprob for 1 "):
        E.prompt_logprobs(torch.tensor([4, 5, 6]), [3])


@pytest.mark.parametrize("flat", [False, True])
def test_an_early_stop_raises(fake_vllm, flat):
    """A generation that stops early (an EOS) would leave the needle fewer rows: it raises."""
    fake_vllm.stop_after, fake_vllm.flat = 2, flat
    stopped = rf"stopped after 2 of {ENGINE_GENERATED} tokens \(finish_reason 'stop'"
    with pytest.raises(RuntimeError, match=stopped):
        E.prompt_logprobs(torch.tensor([4, 5, 6]), [3])


def test_prompt_logprobs_without_engine(monkeypatch):
    monkeypatch.setattr(E, "_ENGINE", None)
    with pytest.raises(RuntimeError, match="no engine in this process"):
        E.prompt_logprobs(torch.tensor([4]), [1])


def test_failed_generate_aborts_its_requests(fake_vllm):
    """LLM.generate leaves a failed batch's requests in the engine; they are aborted, so that the
    next call does not batch them with its own prompts, and the error reaches the caller."""
    fake_vllm.fail = True
    with pytest.raises(TypeError, match="not subscriptable"):
        E.prompt_logprobs(torch.tensor([4, 5]), [2])
    assert fake_vllm.aborted == [(["7", "8"], True)]


# ---------------------------------------------------------------------------------------------
# The catalogue op, through the worker's observers (the fake engine stands in for vLLM)


def _case(rows: int = 3, position: int = 1, companions=((11, 5), (12, 1))) -> Case:
    batch = Batch(position, tuple(Companion(seed, n) for seed, n in companions))
    return Case(
        "engine", ENTRY, "float32", (rows, ENGINE_VOCAB), ("contiguous",), "general", 7, batch=batch
    )


class _NoTarget(Target):
    def activate(self) -> None:
        pass


def test_engine_op_is_data():
    info = OPS["engine"]
    assert info.entries == (ENTRY,)
    assert info.properties == ("logprobs", "determinism")
    assert controls_of(info) == ("logprobs",)
    assert cells(["engine"]) == [
        ("engine", "logprobs", "enabled"),
        ("engine", "determinism", "enabled"),
        ("engine", "determinism", "disabled"),
    ]
    assert controls(["engine"]) == [("engine", "logprobs")]
    case = _case()
    (operand,) = info.operands(case)
    assert (operand.name, operand.batch_axis) == ("tokens", 0)
    assert operand.tokens == ENGINE_VOCAB - ENGINE_SPECIAL_TOKENS
    assert info.operand_shapes(case, 9) == ((9,),)
    # Each prompt owns its positions' rows and its generated tokens' rows, companions too.
    assert info.owned_rows(case, 5) == 5 + ENGINE_GENERATED
    assert info.companion_owned_rows(case, Companion(3, 1)) == 1 + ENGINE_GENERATED
    assert info.needle_output(case) == (5 + ENGINE_GENERATED, 3 + ENGINE_GENERATED)
    assert info.exact_amplitude(case) == 0 and info.batchable(case)
    with pytest.raises(NotImplementedError):
        info.reference([], case, [3])


def test_engine_call_shifts_tokens_past_the_specials(fake_vllm):
    case = _case()
    samples = M.batch_samples(case)
    (tokens,) = M.operands(case, samples, "cpu")
    lengths = [rows for _, rows in samples]
    out = OPS["engine"].call(case.entry, [tokens], case, lengths)
    ((sent, _, _),) = fake_vllm.calls
    assert [len(p) for p in sent] == lengths == [5, 3, 1]
    flat = [t for p in sent for t in p]
    assert flat == (tokens + ENGINE_SPECIAL_TOKENS).tolist()
    assert min(flat) >= len(SPECIAL_TOKENS) and max(flat) < ENGINE_VOCAB
    assert tuple(out.shape) == (sum(lengths) + 3 * ENGINE_GENERATED, ENGINE_VOCAB)


def test_logprobs_property_on_the_fake_engine(fake_vllm):
    """The needle's rows are cut out of the packed batch output at its offset (the companions
    before it own their prompt and generated rows): an engine whose vectors depend only on the
    prefix passes; one where the batch size leaks in fails at the needle's second token (its
    first has no logprob), at vocabulary id 0."""
    case = _case()
    verdict = properties.logprobs(observe("logprobs", case, _NoTarget(), "disabled"))
    assert verdict.ok, verdict
    assert verdict.compared == (3 + ENGINE_GENERATED) * ENGINE_VOCAB
    needle = [[t + 4 for t in M.operands(case, M.needle(case), "cpu")[0].tolist()]]
    alone = fake_vllm.calls[0][0]
    assert alone == needle and len(fake_vllm.calls[1][0]) == 3
    assert fake_vllm.calls[1][0][case.batch.position] == needle[0]

    fake_vllm.drift = True
    verdict = properties.logprobs(observe("logprobs", case, _NoTarget(), "disabled"))
    assert not verdict.ok and verdict.kind == "mismatch"
    assert "needle logprobs (row, vocab id) inside the batch" in verdict.message
    assert "First mismatch at index (1, 0)" in verdict.message
    assert properties.determinism(observe("determinism", case, _NoTarget(), "enabled")).ok


@pytest.mark.parametrize("leaks", [False, True])
def test_logprobs_property_judges_the_generated_rows(fake_vllm, leaks):
    """An engine whose prompt rows never depend on the batch, but whose generated tokens'
    vectors do, fails at the needle's first generated row (row = its prompt length); without
    that leak the same engine passes."""
    fake_vllm.generated_drift = leaks
    case = _case()
    verdict = properties.logprobs(observe("logprobs", case, _NoTarget(), "disabled"))
    assert verdict.ok is not leaks, verdict
    if leaks:
        assert f"First mismatch at index ({case.shape[0]}, 0)" in verdict.message
        mismatched = ENGINE_GENERATED * ENGINE_VOCAB  # every generated row, whole
        assert f"Mismatched elements: {mismatched} / " in verdict.message


# ---------------------------------------------------------------------------------------------
# The strategy


@pytest.mark.parametrize("prop", ["logprobs", "determinism"])
def test_engine_cases(prop):
    @FAST
    @given(cases(ENGINE_SPACE, "engine", prop))
    def run(case):
        length, vocab = case.shape
        assert 1 <= length <= ENGINE_MAX_TOKENS and vocab == ENGINE_VOCAB
        assert case.entry == ENTRY and len(case.layouts) == 1
        assert case.batch is not None
        assert 1 <= len(case.batch.companions) <= ENGINE_MAX_COMPANIONS
        assert all(1 <= c.rows <= ENGINE_MAX_TOKENS for c in case.batch.companions)
        (tokens,) = M.operands(case, M.batch_samples(case), "cpu")
        assert tokens.dtype == torch.int64
        assert int(tokens.min()) >= 0 and int(tokens.max()) < ENGINE_VOCAB - ENGINE_SPECIAL_TOKENS

    run()


def test_engine_cases_reach_the_extremes():
    strategy = cases(ENGINE_SPACE, "engine", "logprobs")
    for condition in (
        lambda c: c.shape[0] == 1,
        lambda c: c.shape[0] == ENGINE_MAX_TOKENS,
        lambda c: len(c.batch.companions) == ENGINE_MAX_COMPANIONS,
        lambda c: any(x.rows == ENGINE_MAX_TOKENS for x in c.batch.companions),
        lambda c: c.batch.position == len(c.batch.companions) > 1,
    ):
        assert condition(find(strategy, condition, settings=FIND))
    simplest = find(strategy, lambda c: True, settings=FIND)
    assert simplest.shape == (1, ENGINE_VOCAB)
    assert [x.rows for x in simplest.batch.companions] == [1]


def test_engine_companions_follow_a_smaller_space():
    space = parse(
        {
            "ops": {"include": ["engine"]},
            "shapes": {"rows": {"min": 2, "max": 6}},
            "batch": {"max_companions": 2, "companion_rows": {"min": 3, "max": 9}},
        },
        "small.toml",
        "small",
    )

    @FAST
    @given(cases(space, "engine", "logprobs"))
    def run(case):
        assert 2 <= case.shape[0] <= 6 and len(case.batch.companions) <= 2
        assert all(3 <= c.rows <= 9 for c in case.batch.companions)

    run()


# ---------------------------------------------------------------------------------------------
# Search spaces: engine only where a space asks for it


@pytest.mark.parametrize("profile", PROFILES)
def test_bundled_spaces_leave_the_engine_out(profile):
    space = load_profile(profile)
    assert "engine" not in space.ops
    assert not [c for c in cells(space.ops) if c[0] == "engine"]


def test_default_ops_are_the_catalogue_without_the_engine():
    """The engine is opt-in (as any op in OPT_IN_OPS): the default is the catalogue without them."""
    assert "engine" in OPT_IN_OPS and "engine" not in DEFAULT_OPS
    assert tuple(op for op in OPS if op not in OPT_IN_OPS) == DEFAULT_OPS
    assert parse({}, "mem.toml", "mine").ops == DEFAULT_OPS
    assert parse({"ops": {"exclude": ["mm"]}}, "x.toml", "x").ops == DEFAULT_OPS[1:]
    assert ENGINE_SPACE.ops == ("engine",)
    both = parse({"ops": {"include": ["mm", "engine"]}}, "y.toml", "y")
    assert both.ops == ("mm", "engine")


# ---------------------------------------------------------------------------------------------
# The model's spec (pure; the writer itself needs transformers: the lane runs it)


def test_tiny_model_spec():
    spec = tiny_model_spec()
    assert spec["vocab"] == ENGINE_VOCAB and spec["head_dim"] == 64 // 2 == MIN_HEAD_DIM
    assert (spec["layers"], spec["hidden"], spec["heads"], spec["kv_heads"]) == (2, 64, 2, 1)
    assert tiny_model_spec(seed=3) != spec
    with pytest.raises(ValueError, match="head_dim = hidden / heads = 16"):
        tiny_model_spec(heads=4)
    with pytest.raises(ValueError, match="multiple of kv_heads"):
        tiny_model_spec(heads=2, kv_heads=3)
    with pytest.raises(ValueError, match="vocab must exceed"):
        tiny_model_spec(vocab=4)
    vocab = tokenizer_vocab(ENGINE_VOCAB)
    assert len(vocab) == ENGINE_VOCAB and sorted(vocab.values()) == list(range(ENGINE_VOCAB))
    assert [vocab[t] for t in SPECIAL_TOKENS] == [0, 1, 2, 3] == list(range(ENGINE_SPECIAL_TOKENS))


# ---------------------------------------------------------------------------------------------
# The target, where vLLM is missing or broken (no vLLM needed)


@pytest.fixture
def clean_env(monkeypatch):
    for key in (*E.ENVIRONMENT, *E.ENVIRONMENT_DEFAULTS):
        monkeypatch.delenv(key, raising=False)
    return monkeypatch


@pytest.mark.parametrize("error", [TargetMissing, TargetBroken])
def test_target_check_reuses_the_vllm_messages(clean_env, error):
    import bi_props.targets.vllm as V

    def fail():
        raise error("target 'vllm': vLLM is not importable here (No module named 'vllm').")

    clean_env.setattr(V, "import_batch_invariant", fail)
    clean_env.setenv("VLLM_CPU_KVCACHE_SPACE", "4")
    assert BUILTIN["vllm-engine"] == "bi_props.targets.vllm_engine:VllmEngineTarget"
    target = resolve("vllm-engine")
    assert isinstance(target, E.VllmEngineTarget) and target.covered() == ("engine",)
    with pytest.raises(error, match=r"^target 'vllm-engine': vLLM is not importable"):
        target.check()
    # Offline and in-process before vLLM is imported; a user's KV cache size is kept.
    import os

    assert os.environ["HF_HUB_OFFLINE"] == os.environ["TRANSFORMERS_OFFLINE"] == "1"
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert os.environ["VLLM_CPU_KVCACHE_SPACE"] == "4"


def test_model_dir(monkeypatch, tmp_path):
    monkeypatch.setenv(E.DIR_ENV, str(tmp_path / "m"))
    assert E.model_dir() == tmp_path / "m"
    monkeypatch.delenv(E.DIR_ENV)
    assert E.model_dir().name == "bi_props-engine-model"
