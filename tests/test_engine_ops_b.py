"""The inference ops rotary_embedding, greedy_argmax, top_k.

Per op: the float64 reference agrees with the stock torch entry point (within the stated bound,
or exactly) on random cases in float32 and bfloat16, and catches a planted perturbation (the
bound is not vacuous); the cpu target's kernel passes the reference and is bitwise
batch-invariant (a sample alone vs the same sample inside a larger batch at another position).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings

import bi_props.ops as stock_ops
from bi_props.catalogue import OPS
from bi_props.catalogue.strategies import cases
from bi_props.execution import materialize
from bi_props.model.case import Batch, Case, Companion
from bi_props.model.compare import compare_bits, compare_to_reference, ulp_summary
from bi_props.model.space import load_profile
from bi_props.targets.kernels import rotary, sampling

DTYPES = ("float32", "bfloat16")


def _case(op: str, dtype: str, shape: tuple, options: dict, seed: int, values: str = "general"):
    provisional = Case(op, "", dtype, shape, (), values, 0, options)
    layouts = ("contiguous",) * len(OPS[op].operands(provisional))
    return Case(op, OPS[op].entries[0], dtype, shape, layouts, values, seed, options)


def _outputs(result) -> tuple:
    return tuple(result) if isinstance(result, (tuple, list)) else (result,)


def _check_reference(case: Case, outputs, precision: str) -> list[str]:
    """Mismatch messages of ``outputs`` against the op's reference (empty: all agree)."""
    args = materialize.operands(case, materialize.needle(case), "cpu")
    refs = OPS[case.op].references(
        [materialize.to_float64(a) for a in args], case, [case.shape[0]], precision
    )
    problems = []
    for out, ref in zip(_outputs(outputs), refs, strict=True):
        dtype, shape, _, bits = materialize.bits(out)
        assert (dtype, shape) == (ref.dtype, ref.value.shape)
        mismatch = compare_to_reference(bits, ref.value, ref.tolerance, dtype, case.op)
        if mismatch is not None:
            problems.append(str(mismatch))
    return problems


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.dtype == b.dtype
        and a.shape == b.shape
        and np.array_equal(materialize.bits(a)[3], materialize.bits(b)[3])
    )


def _batch_invariant(case: Case, kernel, position: int, companions) -> None:
    """The needle's rows alone == the same rows inside a batch (companions around it)."""
    spec = OPS[case.op]
    alone = _outputs(kernel(materialize.operands(case, materialize.needle(case), "cpu"), case))
    batched = case.with_batch(Batch(position=position, companions=tuple(companions)))
    samples = materialize.batch_samples(batched)
    together = _outputs(kernel(materialize.operands(batched, samples, "cpu"), batched))
    offset = sum(rows for _, rows in samples[:position])
    for axis, a, t in zip(spec.output_batch_axes, alone, together, strict=True):
        rows = t.narrow(axis, offset, case.shape[0])
        assert _same_bits(rows, a), f"{case!r}: rows in the batch differ from alone"


# ---------------------------------------------------------------------------------------------
# rotary_embedding

ROTARY_SHAPES = [
    (1, 1, 1, 2, 2, 1),
    (5, 2, 1, 8, 8, 17),
    (7, 4, 2, 16, 6, 100),
    (17, 2, 2, 64, 32, 4096),
    (3, 1, 1, 128, 128, 33),
]


def _rotary_kernel(args, case):
    positions, query, key, cache = args
    return rotary.rotary_embedding(
        positions, query, key, case.shape[3], cache, case.opt("is_neox", True)
    )


def _rotary_stock(args, case):
    positions, query, key, cache = args
    return stock_ops.rotary_embedding(
        positions, query, key, case.shape[3], cache, case.opt("is_neox", True)
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("neox", [True, False])
def test_rotary_reference_agrees_with_stock_and_kernel(dtype: str, neox: bool) -> None:
    for seed, shape in enumerate(ROTARY_SHAPES):
        for values in ("general", "wide"):
            case = _case("rotary_embedding", dtype, shape, {"is_neox": neox}, seed, values)
            args = materialize.operands(case, materialize.needle(case), "cpu")
            # stock: vLLM's forward_native, in the operands' dtype (declared "output")
            assert not _check_reference(case, _rotary_stock(args, case), "output")
            # the cpu kernel: float32 internals
            assert not _check_reference(case, _rotary_kernel(args, case), "float32")


@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_reference_catches_a_planted_perturbation(dtype: str) -> None:
    """One ulp-scale nudge of a single rotated element, the wrong rotation convention, a cache
    row off by one position, or bf16 products under a float32 declaration: each is caught."""
    case = _case("rotary_embedding", dtype, (9, 2, 1, 16, 16, 64), {"is_neox": True}, 5)
    args = materialize.operands(case, materialize.needle(case), "cpu")
    q, k = _rotary_kernel(args, case)
    nudged = q.clone()
    nudged[3, 2] = nudged[3, 2] * (1 + 8 * torch.finfo(q.dtype).eps) + 4 * torch.finfo(q.dtype).eps
    assert _check_reference(case, (nudged, k), "float32")
    positions, query, key, cache = args
    gptj = rotary.rotary_embedding(positions, query, key, 16, cache, False)
    assert _check_reference(case, gptj, "float32")
    shifted = rotary.rotary_embedding((positions + 1) % 64, query, key, 16, cache, True)
    assert _check_reference(case, shifted, "float32")
    if dtype == "float32":
        low = stock_ops.rotary_embedding(
            positions, query.bfloat16(), key.bfloat16(), 16, cache.bfloat16(), True
        )
        assert _check_reference(case, tuple(t.float() for t in low), "float32")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("neox", [True, False])
def test_rotary_kernel_is_batch_invariant(dtype: str, neox: bool) -> None:
    for seed, shape in enumerate(ROTARY_SHAPES):
        case = _case("rotary_embedding", dtype, shape, {"is_neox": neox}, seed)
        companions = [Companion(seed + 100, 300), Companion(seed + 200, 1), Companion(7, 16)]
        for position in (0, 1, 3):
            _batch_invariant(case, _rotary_kernel, position, companions)


# ---------------------------------------------------------------------------------------------
# greedy_argmax

LOGIT_SHAPES = [(1, 1), (3, 6), (5, 17), (4, 160), (2, 4097)]


def _argmax_kernel(args, case):
    return sampling.argmax(args[0], -1)


def _argmax_stock(args, case):
    return torch.argmax(args[0], dim=-1)


def _ties(logits: torch.Tensor) -> int:
    """Rows whose maximum is attained more than once."""
    top = logits.max(dim=-1, keepdim=True).values
    return int(((logits == top).sum(dim=-1) > 1).sum())


def test_torch_argmax_breaks_ties_to_the_lowest_index() -> None:
    """The semantics the op states (vLLM's greedy sampling) is what stock CPU argmax does."""
    x = torch.tensor([[1.0, 3.0, 3.0, 0.0, 3.0], [2.0, 2.0, 2.0, 2.0, 2.0]])
    assert torch.argmax(x, dim=-1).tolist() == [1, 0]
    assert sampling.argmax(x, -1).tolist() == [1, 0]


@pytest.mark.parametrize("dtype", DTYPES)
def test_argmax_reference_agrees_with_stock_and_kernel(dtype: str) -> None:
    tied = 0
    for seed, shape in enumerate(LOGIT_SHAPES):
        for values in ("exact", "general", "wide"):
            case = _case("greedy_argmax", dtype, shape, {}, seed, values)
            args = materialize.operands(case, materialize.needle(case), "cpu")
            tied += _ties(args[0])
            assert not _check_reference(case, _argmax_stock(args, case), "float32")
            assert not _check_reference(case, _argmax_kernel(args, case), "float32")
    assert tied > 0  # the tie rule was exercised


@pytest.mark.parametrize("dtype", DTYPES)
def test_argmax_reference_catches_a_planted_perturbation(dtype: str) -> None:
    """Ties to the highest index (a reversed search) and an index off by one are caught."""
    case = _case("greedy_argmax", dtype, (8, 40), {}, 3, "exact")
    (logits,) = materialize.operands(case, materialize.needle(case), "cpu")
    assert _ties(logits) > 0
    last = logits.shape[-1] - 1 - torch.argmax(logits.flip(-1), dim=-1)
    assert _check_reference(case, last, "float32")
    off = torch.argmax(logits, dim=-1)
    off[2] += 1
    problems = _check_reference(case, off, "float32")
    assert problems and "index (2,)" in problems[0]


@pytest.mark.parametrize("dtype", DTYPES)
def test_argmax_kernel_is_batch_invariant(dtype: str) -> None:
    for seed, shape in enumerate(LOGIT_SHAPES):
        for values in ("exact", "general"):
            case = _case("greedy_argmax", dtype, shape, {}, seed, values)
            companions = [Companion(seed + 100, 300), Companion(seed + 200, 1), Companion(7, 16)]
            for position in (0, 1, 3):
                _batch_invariant(case, _argmax_kernel, position, companions)


def test_drawn_argmax_cases_have_ties() -> None:
    """The strategies draw the exact class (integers in [-2, 2]) for reference and batch
    invariance, so drawn rows tie at their maximum often: the tie rule is really tested."""
    space = load_profile("cpu")
    seen = {"cases": 0, "exact": 0, "tied_rows": 0}

    @settings(max_examples=60, derandomize=True, database=None, deadline=None)
    @given(cases(space, "greedy_argmax", "reference"))
    def draw(case: Case) -> None:
        seen["cases"] += 1
        seen["exact"] += case.values == "exact"
        (logits,) = materialize.operands(case, materialize.needle(case), "cpu")
        seen["tied_rows"] += _ties(logits) if logits.numel() else 0

    draw()
    assert seen["exact"] >= 5, seen
    assert seen["tied_rows"] >= 10, seen


# ---------------------------------------------------------------------------------------------
# Integer outputs and the kernels' construction rules


def test_int64_outputs_compare_exactly_with_a_readable_message() -> None:
    actual = np.array([[0, 4], [2, 7]], dtype=np.int64)
    assert compare_to_reference(actual, actual.astype(np.float64), None, "int64", "x") is None
    assert compare_bits(actual, actual.copy(), "int64", "x") is None
    desired = np.array([[0, 4], [3, 7]], dtype=np.float64)
    mismatch = compare_to_reference(actual, desired, None, "int64", "indices")
    assert mismatch is not None and mismatch.first_index == (1, 0) and mismatch.max_ulp == 1
    assert "actual 2.0" in str(mismatch) and "desired 3.0" in str(mismatch)
    assert ulp_summary(actual, desired, None, "int64") == (1, 0.0)


def test_new_kernels_avoid_banned_calls() -> None:
    """The rules of targets/kernels/primitives.py, on the new modules' source (no library
    transcendental, no fused op, nothing install() overrides: argmax, topk and sort included; a
    stable sort is allowed: its permutation is unique, whatever the kernel or the batch)."""
    import ast
    import inspect

    banned = {
        "exp", "log", "sqrt", "rsqrt", "pow", "tanh", "sigmoid", "addcmul", "addcdiv", "lerp",
        "mm", "bmm", "mv", "dot", "matmul", "einsum", "sum", "mean", "amax", "max", "min",
        "argmax", "topk", "sort", "argsort", "softmax", "cumsum", "prod",
    }  # fmt: skip
    found = []
    for module in (rotary, sampling):
        for node in ast.walk(ast.parse(inspect.getsource(module))):
            if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
                found.append(f"{module.__name__}:{node.lineno} @")
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            owner = node.func.value
            if isinstance(owner, ast.Name) and owner.id == "ns":
                continue  # a route's forwarder: the custom op torch.ops.<namespace>, the kernel
            stable = any(
                kw.arg == "stable" and isinstance(kw.value, ast.Constant) and kw.value.value is True
                for kw in node.keywords
            )
            if node.func.attr == "sort" and stable:
                continue  # a stable sort's result is unique: any correct kernel returns it
            if node.func.attr in banned or any(kw.arg == "alpha" for kw in node.keywords):
                found.append(f"{module.__name__}:{node.lineno} .{node.func.attr}")
    assert not found


# ---------------------------------------------------------------------------------------------
# top_k

TOP_K_CASES = [((1, 1), 1), ((3, 6), 2), ((5, 17), 17), ((4, 160), 16), ((2, 1000), 33)]


def _top_k_kernel(args, case):
    return sampling.top_k(args[0], case.opt("k"))


def _top_k_stock(args, case):
    return stock_ops.top_k(args[0], case.opt("k"))


def test_torch_topk_orders_ties_otherwise_hence_the_composite() -> None:
    """Why the stock entry point is ``bi_props.ops.top_k`` (a stable descending sort) and not
    ``torch.topk``: on CPU torch.topk does not break ties to the lowest index. Its values agree."""
    x = torch.randint(-2, 3, (64, 100), generator=torch.Generator().manual_seed(0)).float()
    values, indices = torch.topk(x, 5, dim=-1, sorted=True)
    ours = stock_ops.top_k(x, 5)
    assert torch.equal(values, ours[0])
    assert not torch.equal(indices, ours[1])  # if this fails, torch.topk could be the entry
    assert torch.equal(x.gather(-1, indices), values)


@pytest.mark.parametrize("dtype", DTYPES)
def test_top_k_reference_agrees_with_stock_and_kernel(dtype: str) -> None:
    tied = 0
    for seed, (shape, k) in enumerate(TOP_K_CASES):
        for values in ("exact", "general", "wide"):
            case = _case("top_k", dtype, shape, {"k": k}, seed, values)
            args = materialize.operands(case, materialize.needle(case), "cpu")
            tied += _ties(args[0])
            assert not _check_reference(case, _top_k_stock(args, case), "float32")
            assert not _check_reference(case, _top_k_kernel(args, case), "float32")
            # special values (NaN first, as in torch.topk; -0.0 ties +0.0): kernel == stock
            special = case.__class__(**{**case.__dict__, "values": "special"})
            sargs = materialize.operands(special, materialize.needle(special), "cpu")
            pairs = zip(_top_k_kernel(sargs, special), _top_k_stock(sargs, special), strict=True)
            for a, b in pairs:
                assert _same_bits(a, b.contiguous())
    assert tied > 0


@pytest.mark.parametrize("dtype", DTYPES)
def test_top_k_reference_catches_a_planted_perturbation(dtype: str) -> None:
    """torch.topk's own tie order, an ascending order and a value one ulp off are each caught."""
    case = _case("top_k", dtype, (8, 40), {"k": 6}, 3, "exact")
    (logits,) = materialize.operands(case, materialize.needle(case), "cpu")
    values, indices = torch.topk(logits, 6, dim=-1, sorted=True)
    problems = _check_reference(case, (values, indices), "float32")
    assert len(problems) == 1 and "int64" in problems[0]  # values right, tie order wrong
    good = stock_ops.top_k(logits, 6)
    assert _check_reference(case, (good[0].flip(-1), good[1].flip(-1)), "float32")
    nudged = good[0].clone()
    nudged[1, 0] = torch.nextafter(nudged[1, 0], torch.tensor(100.0, dtype=nudged.dtype))
    assert _check_reference(case, (nudged, good[1]), "float32")


@pytest.mark.parametrize("dtype", DTYPES)
def test_top_k_kernel_is_batch_invariant(dtype: str) -> None:
    for seed, (shape, k) in enumerate(TOP_K_CASES):
        for values in ("exact", "general"):
            case = _case("top_k", dtype, shape, {"k": k}, seed, values)
            companions = [Companion(seed + 100, 300), Companion(seed + 200, 1), Companion(7, 16)]
            for position in (0, 1, 3):
                _batch_invariant(case, _top_k_kernel, position, companions)


# ---------------------------------------------------------------------------------------------
# Reproducers: int64 outputs and the swapped entry points in a standalone script


@pytest.mark.parametrize(
    "op, shape, options",
    [
        ("greedy_argmax", (3, 9), {}),
        ("top_k", (3, 9), {"k": 4}),
        ("rotary_embedding", (3, 1, 1, 8, 6, 5), {"is_neox": False}),
    ],
)
def test_reproducer_runs_and_compares(op: str, shape: tuple, options: dict, tmp_path) -> None:
    """A reference reproducer for each op runs standalone, compares every output (int64 indices
    included) and says the (correct) result does not reproduce a finding."""
    import subprocess
    import sys

    from bi_props.execution import execute
    from bi_props.reporting import repro
    from bi_props.targets.cpu import CpuTarget

    target = CpuTarget()
    values = "general" if op == "rotary_embedding" else "exact"
    case = _case(op, "bfloat16", shape, options, 1, values)
    exported = execute.export("reference", case, target)
    # the cpu target's own setups (its switch-off one is only a comment: it must still compile)
    setup = {"enabled": target.repro_setup(True), "disabled": target.repro_setup(False)}
    finding = {"property": "reference", "switch": "enabled", "kind": "mismatch", "message": ""}
    path = tmp_path / f"{op}.py"
    path.write_text(repro.script(finding, case, exported, setup, target.kernel_prefix))
    proc = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    outputs = len(OPS[op].output_batch_axes)
    assert proc.stdout.count("vs the float64 reference") == outputs, proc.stdout
    assert "does NOT reproduce" in proc.stdout
