"""The probe model's ``decode`` layout: one decode step of a batch, every sequence's last token
over a paged KV cache of its earlier tokens, attention through ``paged_decode_attention``: the
kernel a serving engine spends its decode steps in, which no prefill layout calls."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

from bi_props.catalogue import OPS
from bi_props.execution.probe_model import (
    PAGE_BLOCK,
    ProbeModel,
    config_of,
    decode_step,
    paged_cache,
    run_batch,
)
from bi_props.model.case import Batch, Case, Companion

SHAPE = (6, 2, 4, 2, 8, 64, 16)  # length, layers, heads, kv_heads, head_dim, vocab, intermediate


def _model() -> ProbeModel:
    config = config_of(SHAPE)
    count = sum(torch.Size(shape).numel() for _, shape in config.parameters())
    weights = torch.randn(count, generator=torch.Generator().manual_seed(0)) * 0.3
    return ProbeModel(weights, config)


def test_a_decode_step_computes_each_sequences_next_token_logprobs():
    """Row b is the logprobs after sequence b's last token given its prefix: the prefill's last
    row of that sequence (close, not bitwise: another attention kernel)."""
    model = _model()
    lengths = [4, 1, 20]
    tokens = torch.randint(0, 64, (sum(lengths),), generator=torch.Generator().manual_seed(1))
    full = run_batch(model, tokens, lengths, "packed")
    step = decode_step(model, tokens, lengths)
    assert step.shape == (3, 64)
    torch.testing.assert_close(step, full[[3, 4, 24]], rtol=1e-4, atol=1e-5)


def test_the_paged_cache_holds_each_sequence_in_its_blocks():
    keys = [torch.randn(n, 2, 8) for n in (3, PAGE_BLOCK, PAGE_BLOCK + 1)]
    k_cache, _, table, lengths = paged_cache(keys, keys)
    assert k_cache.shape == (4, PAGE_BLOCK, 2, 8) and lengths.tolist() == [3, 16, 17]
    assert table.tolist() == [[0, 0], [1, 0], [2, 3]]
    for b, k in enumerate(keys):
        gathered = k_cache[table[b].long()].reshape(-1, 2, 8)[: k.shape[0]]
        assert torch.equal(gathered, k)


def test_every_sequence_owns_one_output_row():
    spec = OPS["probe_model"]
    batch = Batch(position=1, companions=(Companion(seed=1, rows=12), Companion(seed=2, rows=5)))
    case = Case("probe_model", "decode", "float32", SHAPE, (), "general", 0, batch=batch)
    assert spec.needle_output(case) == (1, 1)
    assert "decode" in spec.entries


_CHILD = r"""
import json, sys
from bi_props.execution.execute import observe_batch_invariance
from bi_props.model.case import Batch, Case, Companion
from bi_props.targets import resolve

target = resolve("cpu")
target.check()
if sys.argv[2] == "enabled":
    target.activate()
batch = Batch(position=1, companions=(Companion(seed=7, rows=40), Companion(seed=8, rows=3)))
case = Case("probe_model", "decode", "float32", tuple(json.loads(sys.argv[1])), (), "general", 3,
            batch=batch)
seen = observe_batch_invariance(case, target, profile_ops=True)
alone, together = seen["calls"]["alone"], seen["calls"]["in_batch"]
assert not alone.raised and not together.raised, (alone, together)
used = seen.get("evidence", seen).get("ops_used", [])
events = sorted({e for e in used if "paged_decode_attention" in e})
print(json.dumps([bool((alone.outputs[0].bits == together.outputs[0].bits).all()), events]))
"""


def _child(switch: str) -> list:
    env = dict(os.environ, VLLM_BATCH_INVARIANT="1" if switch == "enabled" else "0")
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(SHAPE), switch],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_decode_step_runs_the_targets_decode_kernel():
    """Switch on: the CPU target's batch-invariant paged decode kernel runs (routing sees it) and
    the needle's row is the same beside a 40-token sequence; switch off, the stock split-KV
    composite splits the keys by the batch's longest sequence (16 per split): the row differs."""
    same, events = _child("enabled")
    assert same, events
    assert any(e.startswith("bi_props_cpu::") for e in events), events
    same, events = _child("disabled")
    assert not same, events
