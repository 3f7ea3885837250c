"""Explicit examples: the cases known to expose stock batch variance run first in the enabled
cells, and a case in every dtype of the contract runs first in parity.

No worker here: the session's judge is replaced where a verdict is needed."""

from __future__ import annotations

from hypothesis.database import InMemoryExampleDatabase

from bi_props.campaigns import explicit
from bi_props.campaigns.fuzz import Cell, run_slice
from bi_props.campaigns.session import Session
from bi_props.model.case import PARITY_DTYPES, Batch, Case, Companion, parse_case
from bi_props.model.properties import Verdict
from bi_props.model.space import parse


def _session(**runner) -> Session:
    # no deployment-size example (campaigns/deployment_example.py): the known cases alone
    space = parse(
        {"ops": {"include": ["mm", "sum"]}, "runner": runner, "scale": {"every": 0}}, "test", "test"
    )
    session = Session("cpu", space)
    session.entries = lambda op: None  # the op's own entries (no worker starts)
    return session


def _mm(rows: int, companions: tuple[int, ...], seed: int = 0, dtype="float32") -> Case:
    batch = Batch(0, tuple(Companion(seed + 1 + i, r) for i, r in enumerate(companions)))
    return Case("mm", "torch.mm", dtype, (rows, 32, 8), ("contiguous",) * 2, "general", seed,
                batch=batch)  # fmt: skip


def test_known_variant_cases_are_kept_smallest_first_and_in_the_database():
    session = _session()
    session.database = InMemoryExampleDatabase()
    big, small = _mm(4, (255,)), _mm(1, (15,))
    assert explicit.add_variant(session, big) and explicit.add_variant(session, small)
    assert not explicit.add_variant(session, small)  # once
    assert not explicit.add_variant(session, small.with_batch(None))  # nothing to compare
    assert explicit.variants(session, "mm") == (small, big)
    for i in range(explicit.MAX_VARIANTS + 3):  # the largest go first when over the cap
        explicit.add_variant(session, _mm(1, (16 + i,), seed=10 + i))
    kept = explicit.variants(session, "mm")
    assert len(kept) == explicit.MAX_VARIANTS and big not in kept and small in kept
    # a later session (a later run, a Ray actor) starts with them; a stale entry is dropped
    key = explicit.variant_key("cpu", "mm")
    session.database.save(key, b"Case(op='mm', broken")
    later = _session()
    later.database = session.database
    assert explicit.load_variants(later, ("mm", "sum")) == explicit.MAX_VARIANTS
    assert explicit.variants(later, "mm") == kept
    assert b"Case(op='mm', broken" not in set(session.database.fetch(key))


def test_each_known_case_runs_with_its_data_and_with_other_data_once_per_cell():
    session = _session()
    case = _mm(1, (15,), seed=7)
    explicit.add_variant(session, case)
    todo = explicit.pending(session, "mm", "batch_invariance", "enabled")
    assert len(todo) == explicit.SEEDS and todo[0] == case
    other = todo[1]
    assert other.seed != case.seed and other.shape == case.shape
    assert [c.rows for c in other.batch.companions] == [15]
    assert other.batch.companions[0].seed != case.batch.companions[0].seed
    assert explicit.pending(session, "mm", "batch_invariance", "disabled") == []
    assert len(explicit.pending(session, "mm", "row_permutation", "enabled")) == explicit.SEEDS
    for c in todo:
        explicit.mark_done(session, "mm", "batch_invariance", "enabled", c)
    assert explicit.pending(session, "mm", "batch_invariance", "enabled") == []


def test_parity_tries_every_dtype_of_the_contract_before_drawing():
    session = _session()
    template = explicit.template_for(session, "sum", "parity", "both")
    assert template is not None and template.batch is None  # the op's control example, bare
    dtypes = {c.dtype for c in explicit.pending(session, "sum", "parity", "both")}
    assert dtypes == ({"float32", "bfloat16", "float16"} | set(PARITY_DTYPES)) - {template.dtype}
    reference = {c.dtype for c in explicit.pending(session, "sum", "reference", "enabled")}
    explicit.template_for(session, "sum", "reference", "enabled")
    reference = {c.dtype for c in explicit.pending(session, "sum", "reference", "enabled")}
    assert reference == {"bfloat16", "float16"}  # the space's dtypes (float32 is the template)


def test_a_known_variant_case_that_fails_is_a_finding_before_any_draw():
    """A kernel as batch-variant as stock fails on the very case where stock varied: recorded
    at the cell's first turn, unshrunk (small by construction), confirmed in a fresh worker."""
    session = _session(power_examples=0)
    known = _mm(1, (255,))
    explicit.add_variant(session, known)
    drawn: list[Case] = []

    def judge(op, prop, switch, case, fresh=False, patience=1.0):
        if not fresh:
            drawn.append(case)
        if case.batch is not None and case.batch.companions[0].rows == 255:
            return Verdict(False, "needle rows differ", "mismatch", compared=8)
        return Verdict(True, compared=8)

    session.judge = judge
    session.covered = lambda op: True
    cell = Cell("mm", "batch_invariance", "enabled")
    ran = run_slice(session, cell, 5, None, seed=1)
    assert drawn[0] == known and ran >= explicit.SEEDS
    [finding] = session.findings
    # shrunk by Hypothesis from the explicit case: every knob to its simplest but the one the
    # failure needs (a companion of 255 rows)
    shrunk = parse_case(finding.case)
    assert shrunk.shape == (1, 1, 1) and [c.rows for c in shrunk.batch.companions] == [255]
    assert finding.shrink.startswith("shrunk by Hypothesis from an explicit example"), finding
    assert finding.reproduced_in_fresh_process is True
    assert session.judged[("mm", "batch_invariance", "enabled")] == ran


def test_the_shrinks_replay_of_a_case_is_the_case_itself():
    """A case's choice sequence under ``reductions`` draws that very case: the shrink starts
    from it (a transposed bf16 case, three companions, the needle last)."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import strategies as st
    from hypothesis.database import InMemoryExampleDatabase, choices_to_bytes

    from bi_props.campaigns.shrink import choices_of, reductions

    base = replace_batch(_mm(3, (15, 255, 7)), position=2)
    base = Case("mm", "torch.mm", "bfloat16", (3, 32, 8), ("transposed", "offset"), "wide", 5,
                batch=base.batch, padded=0)  # fmt: skip
    database, key, seen = InMemoryExampleDatabase(), b"replay", []
    database.save(key + b".secondary", choices_to_bytes(choices_of(base)))

    @settings(database=database, phases=[Phase.reuse], max_examples=1, deadline=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(st.data())
    def replay(data):
        seen.append(data.draw(reductions(base)))
        raise AssertionError  # interesting: Hypothesis keeps it (and stops)

    replay._hypothesis_internal_database_key = key
    try:
        replay()
    except AssertionError:
        pass
    assert seen[0] == base


def replace_batch(case: Case, position: int) -> Case:
    return case.with_batch(Batch(position, case.batch.companions))
