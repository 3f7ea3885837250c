"""The probe model's ``mixed`` layout: one engine step in which the needle decodes its
last token over its KV cache while its companions prefill, attention through ``mixed_attention``.

Only such a step reaches the bugs keyed on a mixed batch (a decode row beside a long prefill):
the ``packed`` layout's attention is ``varlen_attention`` over prefills alone. The checks that
need the CPU target's batch-invariant kernels installed run in a child interpreter (the kernels
register with torch.library for the whole process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from bi_props.catalogue import OPS
from bi_props.execution.probe_model import ProbeModel, config_of, mixed_step, run_batch
from bi_props.model.case import Batch, Case, Companion

PLANTED = Path(__file__).parent / "planted"
SHAPE = (6, 2, 4, 2, 8, 64, 16)  # length, layers, heads, kv_heads, head_dim, vocab, intermediate


def _model(entries: dict[str, str] | None = None) -> ProbeModel:
    config = config_of(SHAPE)
    count = sum(torch.Size(shape).numel() for _, shape in config.parameters())
    weights = torch.randn(count, generator=torch.Generator().manual_seed(0)) * 0.3
    return ProbeModel(weights, config, entries)


def test_a_mixed_step_computes_what_the_prefill_computes():
    """The decode row is the logprobs of the needle's last token given its prefix (the prefill's
    last row), the companions' rows their prefill's; close, not bitwise (other reductions)."""
    model = _model()
    lengths = [4, 6, 3]
    tokens = torch.randint(0, 64, (sum(lengths),), generator=torch.Generator().manual_seed(1))
    full = run_batch(model, tokens, lengths, "packed")
    step = mixed_step(model, tokens, lengths, decoding=1)
    assert step.shape == (4 + 1 + 3, 64)
    torch.testing.assert_close(step[4], full[4 + 5])  # the needle's last token
    torch.testing.assert_close(step[:4], full[:4])
    torch.testing.assert_close(step[5:], full[10:])
    alone = mixed_step(model, tokens[4:10], [6], decoding=0)
    torch.testing.assert_close(alone[0], full[9])


def test_the_needle_owns_one_output_row_and_each_companion_its_tokens():
    spec = OPS["probe_model"]
    batch = Batch(position=1, companions=(Companion(seed=1, rows=12), Companion(seed=2, rows=5)))
    case = Case("probe_model", "mixed", "float32", SHAPE, (), "general", 0, batch=batch)
    assert spec.needle_output(case) == (12, 1)
    packed = Case("probe_model", "packed", "float32", SHAPE, (), "general", 0, batch=batch)
    assert spec.needle_output(packed) == (12, 6)
    assert "mixed" in spec.entries


_CHILD = r"""
import json, sys
from bi_props.execution.execute import observe_batch_invariance
from bi_props.model.case import Batch, Case, Companion
from bi_props.targets import resolve

target = resolve("cpu")
target.check()
target.activate()
planted = (("mixed_attention", "planted_query_tiling.mixed_attention"),)
batch = Batch(position=1, companions=(Companion(seed=7, rows=12), Companion(seed=8, rows=3)))
out = {}
for name, entry, options in [
    ("mixed", "mixed", {}),
    ("mixed_planted", "mixed", {"entries": planted}),
    ("packed_planted", "packed", {"entries": planted}),
]:
    case = Case("probe_model", entry, "float32", tuple(json.loads(sys.argv[1])), (),
                "general", 3, options, batch=batch)
    calls = observe_batch_invariance(case, target)["calls"]
    alone, together = calls["alone"], calls["in_batch"]
    assert not alone.raised and not together.raised, (name, alone, together)
    out[name] = bool((alone.outputs[0].bits == together.outputs[0].bits).all())
print(json.dumps(out))
"""


def test_only_the_mixed_step_reaches_a_bug_keyed_on_a_prefill_beside_a_decode():
    """With the CPU target's batch-invariant kernels on: the mixed step is batch-invariant; with
    planted_query_tiling's attention (another path once any sequence of the call has >= 10 query
    tokens) the needle's decode row beside a 12-token prefill differs from the row alone, and the
    packed layout (prefills only, varlen_attention) cannot show it."""
    env = dict(os.environ, VLLM_BATCH_INVARIANT="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PLANTED), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(SHAPE)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    same = json.loads(done.stdout.strip().splitlines()[-1])
    assert same == {"mixed": True, "mixed_planted": False, "packed_planted": True}, same
