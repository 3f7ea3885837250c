"""The engine-level property (op ``engine``, target ``vllm-engine``), without vLLM.

The main CI has neither vLLM nor transformers: here the prompt splitting and logprob packing of
``prompt_logprobs`` run against a fake ``LLM`` (and fake ``vllm`` modules for SamplingParams and
TokensPrompt), the catalogue op and its strategy are checked, and the default search spaces must
leave ``engine`` out. The real engine, and the model writer (it needs transformers), run in the
vLLM lane: tests/vllm_lane/lane_engine.py (scripts/ci_vllm_lane.sh).
"""

from __future__ import annotations

import math
import sys
import types
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, Phase, find, given, settings

from bi_props.catalogue import ENGINE_SPECIAL_TOKENS, ENGINE_VOCAB, OPS, cells, controls
from bi_props.catalogue.strategies import ENGINE_MAX_COMPANIONS, ENGINE_MAX_TOKENS, cases
from bi_props.execution import materialize as M
from bi_props.execution.execute import observe
from bi_props.model import properties
from bi_props.model.case import Batch, Case, Companion
from bi_props.model.property_spec import controls_of
from bi_props.model.space import DEFAULT_OPS, PROFILES, load_profile, parse
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
ENGINE_SPACE = parse({"ops": {"include": ["engine"]}}, "engine.toml", "engine")


# ---------------------------------------------------------------------------------------------
# A fake vLLM: LLM.generate returns RequestOutput-like objects whose prompt_logprobs follow
# vLLM 0.32 (None for the first position, then {token_id: Logprob}).


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class Output:
    prompt_token_ids: list[int]
    prompt_logprobs: list


class SamplingParams:
    def __init__(self, **kwargs):
        self.kwargs = kwargs


def _float32(x: float) -> float:
    return float(np.float32(x))


def fake_logprob(prefix: list[int], token: int, batch: int) -> float:
    """A float32 value of the prefix and the token; with ``drift`` the batch size leaks in."""
    return _float32(-math.log(2 + token) - 0.001 * len(prefix) - 0.01 * batch)


class FakeLLM:
    def __init__(self, drift: bool = False, first: str = "none", fail: bool = False) -> None:
        self.calls: list[tuple[list[list[int]], dict, bool]] = []
        self.drift, self.first, self.fail = drift, first, fail
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

    def generate(self, requests, params, use_tqdm=True):
        prompts = [list(r["prompt_token_ids"]) for r in requests]
        self.calls.append((prompts, params.kwargs, use_tqdm))
        if self.fail:
            raise TypeError("'function' object is not subscriptable")
        batch = len(prompts) if self.drift else 0
        outputs = []
        for p in prompts:
            first = {"none": None, "empty": {}}[self.first]
            logprobs = [first]
            for i in range(1, len(p)):
                # the prompt's own token first (vLLM's rank chain), then another top-k entry
                logprobs.append(
                    {
                        p[i]: Logprob(fake_logprob(p[:i], p[i], batch), rank=3),
                        999: Logprob(-0.5, rank=1),
                    }
                )
            outputs.append(Output(p, logprobs))
        return outputs


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


def _expected(prompts: list[list[int]], batch: int = 0) -> np.ndarray:
    values = []
    for p in prompts:
        values.append(0.0)
        values += [fake_logprob(p[:i], p[i], batch) for i in range(1, len(p))]
    return np.asarray(values, dtype=np.float32)


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


def test_prompt_logprobs_packs_in_prompt_order(fake_vllm):
    tokens = torch.tensor([10, 11, 12, 20, 30, 31, 32, 33], dtype=torch.int64)
    out = E.prompt_logprobs(tokens, [3, 1, 4])
    prompts = [[10, 11, 12], [20], [30, 31, 32, 33]]
    assert out.dtype == torch.float32 and tuple(out.shape) == (8,)
    np.testing.assert_array_equal(out.numpy().view(np.uint32), _expected(prompts).view(np.uint32))
    assert out[0] == 0.0 and out[3] == 0.0 and out[4] == 0.0  # first tokens have no logprob
    # One generate call for the whole batch: greedy, one new token, the prompt's own logprobs.
    ((sent, kwargs, use_tqdm),) = fake_vllm.calls
    assert sent == prompts and use_tqdm is False
    assert kwargs == {"temperature": 0.0, "max_tokens": 1, "prompt_logprobs": 0}


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
        assert float(out[i]) == fake_logprob(tokens[:i].tolist(), int(tokens[i]), 0)


def test_prompt_logprobs_rejects_malformed_outputs():
    with pytest.raises(RuntimeError, match="expected 3 positions, got 2"):
        E.token_logprobs([4, 5, 6], [None, {5: Logprob(-1.0)}])
    with pytest.raises(RuntimeError, match="no logprob for its token 6"):
        E.token_logprobs([4, 5, 6], [None, {5: Logprob(-1.0)}, {9: Logprob(-1.0)}])
    with pytest.raises(RuntimeError, match="expected 1 positions, got None"):
        E.token_logprobs([4], None)
    with pytest.raises(RuntimeError, match="carries"):
        E.pack_logprobs([Output([4, 9], [None, {9: Logprob(-1.0)}])], [[4, 5]])
    with pytest.raises(RuntimeError, match="2 prompts sent, 1 outputs"):
        E.pack_logprobs([Output([4], [None])], [[4], [5]])


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
    assert tuple(out.shape) == (sum(lengths),)


def test_logprobs_property_on_the_fake_engine(fake_vllm):
    """The needle's logprobs are cut out of the packed batch output at its offset: an engine
    whose logprobs depend only on the prompt passes; one where the batch size leaks in fails at
    the needle's second token (its first has no logprob)."""
    case = _case()
    verdict = properties.logprobs(observe("logprobs", case, _NoTarget(), "disabled"))
    assert verdict.ok, verdict
    needle = [[t + 4 for t in M.operands(case, M.needle(case), "cpu")[0].tolist()]]
    alone = fake_vllm.calls[0][0]
    assert alone == needle and len(fake_vllm.calls[1][0]) == 3
    assert fake_vllm.calls[1][0][case.batch.position] == needle[0]

    fake_vllm.drift = True
    verdict = properties.logprobs(observe("logprobs", case, _NoTarget(), "disabled"))
    assert not verdict.ok and verdict.kind == "mismatch"
    assert "First mismatch at index (1,)" in verdict.message
    assert properties.determinism(observe("determinism", case, _NoTarget(), "enabled")).ok


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
    assert tuple(op for op in OPS if op != "engine") == DEFAULT_OPS
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
