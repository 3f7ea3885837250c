"""Worker side: run one case for one property and observe it (bits, errors, profiler events).

Imports torch (lazily) and the catalogue; never Hypothesis or pytest. One observer per built-in
property; the matching judge lives in properties.py, and ``property_spec.PROPERTIES`` pairs them
(users' properties included). ``run_op`` is the building block a user's observer calls.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from ..model.case import Batch, Case
from ..model.observation import Call, Observation, TensorBits
from ..model.op_registry import OPS
from ..model.permutation import derangement, moved_rows, unpermute_index
from ..model.target import Target
from .materialize import (
    alone_case,
    apply_layout,
    batch_samples,
    bits,
    needle,
    operands,
    row_slice,
    to_float64,
    unpad,
)


def _as_tuple(result: Any) -> tuple[Any, ...]:
    return tuple(result) if isinstance(result, (tuple, list)) else (result,)


def _tensor_bits(t: Any, keep_bits: bool = True) -> TensorBits:
    dtype, shape, device, array = bits(t)
    return TensorBits(dtype, shape, device, array if keep_bits else None)


def _invoke(
    case: Case, args: list[Any], lengths: list[int], around: Any = None
) -> tuple[tuple[Any, ...] | None, Call]:
    """Call the case's entry point; an exception is an observation, not a crash of the worker.
    ``around``: a context manager entered around the entry's call alone (a dispatcher trace).
    A compiled case (``Case.mode``) calls the same code through ``torch.compile``
    (``compiled.call``). A padded case's outputs are cut back to each sample's real rows
    (``unpad``): no property ever compares padding rows."""
    info = OPS[case.op]
    try:
        with around if around is not None else nullcontext():
            if case.mode == "compiled":
                from . import compiled

                result = _as_tuple(compiled.call(case, args, lengths))
            else:
                result = _as_tuple(info.call(case.entry, args, case, lengths))
        if case.padded:
            result = tuple(unpad(t, lengths) for t in result)
    except Exception as exc:  # the op's own error: part of its contract
        return None, Call(error_type=type(exc).__name__, error_message=str(exc)[:2000])
    return result, Call(outputs=tuple(_tensor_bits(t) for t in result))


def run_op(
    case: Case,
    target: Target,
    samples: list[tuple[int, int]] | None = None,
    layouts: bool = True,
) -> Call:
    """Call the case's entry point on the tensors of ``samples`` ([(seed, rows), ...]; default:
    the needle alone, ``bi_props.execution.materialize.batch_samples(case)`` for the batch) on the
    target's device, with the case's layouts (all contiguous with ``layouts=False``). The op's
    own exception is observed (``Call.raised``), never raised: for users' observers."""
    samples = needle(case) if samples is None else samples
    args = operands(case, samples, target.device, layouts=layouts)
    return _invoke(case, args, [rows for _, rows in samples])[1]


def observe_reference(case: Case, target: Target) -> dict[str, Any]:
    samples = needle(case)
    args = operands(case, samples, target.device)
    lengths = [rows for _, rows in samples]
    _, call = _invoke(case, args, lengths)
    refs = None
    if not call.raised:  # a padded case: the reference of the real rows alone
        packed = operands(case.with_padded(0), samples, target.device) if case.padded else args
        inputs = [to_float64(a) for a in packed]
        refs = OPS[case.op].references(inputs, case, lengths, target.precision(case.op))
    return {"calls": {"op": call}, "references": refs}


WINDOWS_ENV = "BI_PROPS_BATCH_WINDOWS"
"""How many windows a batch-invariance example runs (the space's ``[runner] batch_windows``,
passed to the workers by the session; 0: the needle alone, benchmarks/rows_judged.py's
baseline)."""


def _windows_wanted() -> int:
    import os

    from ..model.windows import MAX_WINDOWS

    try:
        return max(0, int(os.environ.get(WINDOWS_ENV, str(MAX_WINDOWS))))
    except ValueError:
        return MAX_WINDOWS


def observe_batch_invariance(
    case: Case, target: Target, profile_ops: bool = False, windows: bool | None = None
) -> dict[str, Any]:
    """The needle alone, and the needle's rows cut out of the batched result. In a padded case
    the needle alone is laid out at its own length and the batch at the padded length: the
    needle's rows must not depend on how far the batch is padded.

    ``windows``: also run the batch's nested windows (``model.windows``) and compare every row
    of each with the same row of the whole batch, bitwise, in this worker; the first window that
    differs is sent whole (calls ``window`` and ``window_in_batch``) for the judge, and
    ``evidence["rows"]`` counts the rows judged (the needle's and the windows')."""
    info = OPS[case.op]
    if not info.batchable(case) or case.batch is None:
        raise ValueError(f"batch invariance is not defined for {case!r}")
    if windows is None:
        windows = _windows_wanted() > 0
    alone_samples, batch = needle(case), batch_samples(case)
    single = alone_case(case)
    _, alone = _invoke(single, operands(single, alone_samples, target.device), [case.shape[0]])
    logical = operands(case, batch, target.device, layouts=False)
    batch_args = _laid_out(case, logical)
    lengths = [rows for _, rows in batch]
    evidence: dict[str, Any] = {}
    if profile_ops:  # which ops the composition used, for the report of a logprobs finding
        import torch

        with torch.autograd.profiler.profile(use_kineto=False) as prof:
            result, together = _invoke(case, batch_args, lengths)
        evidence["ops_used"] = sorted({e.name for e in prof.function_events})
    else:
        result, together = _invoke(case, batch_args, lengths)
    calls = {"alone": alone, "in_batch": together}
    if result is not None:
        offset, rows = info.needle_output(case)  # the needle's output rows (OpSpec.output_rows)
        sliced = []
        for t, axis in zip(result, info.output_batch_axes, strict=False):
            sliced.append(_tensor_bits(t[row_slice(offset, rows, axis, t.dim())]))
        calls["in_batch"] = Call(outputs=tuple(sliced))
        evidence["rows"] = rows
        if windows and not alone.raised:
            evidence["rows"] += _judge_windows(case, target, logical, result, calls, evidence)
    return {"calls": calls, "evidence": evidence}


def _laid_out(case: Case, logical: list[Any]) -> list[Any]:
    """The case's layouts applied to logical (contiguous) operands."""
    return [
        apply_layout(t, case.layouts[i] if i < len(case.layouts) else "contiguous")
        for i, t in enumerate(logical)
    ]


@dataclass(frozen=True)
class _Window:
    """One window of a batch: how to call it, and which of its output rows are which of the
    whole batch's (``pairs``: (offset in the window's output, offset in the batch's, rows))."""

    label: str
    case: Case
    samples: list[tuple[int, int]]
    args: list[Any] | None  # row windows: the batch's own rows, cut (None: materialise samples)
    pairs: list[tuple[int, int, int]]

    @property
    def rows(self) -> int:
        return sum(rows for _, _, rows in self.pairs)


def batch_windows(case: Case, logical: list[Any] | None = None) -> list[_Window]:
    """The nested windows of a case's batch (``model.windows``): rows cut from the batch's
    logical operands (``logical``; row ops), or whole samples (sequence ops, padded batches)."""
    from ..model.windows import describe, row_windows, sample_windows

    info = OPS[case.op]
    assert case.batch is not None
    samples = batch_samples(case)
    most = _windows_wanted()
    out: list[_Window] = []
    if not permutes_samples(case):
        total = sum(rows for _, rows in samples)
        specs = info.operands(case)
        for size in row_windows(total, most):
            cut, left, pairs, at = [], size, [], 0
            for seed, rows in samples:
                if left <= 0:
                    break
                cut.append((seed, min(rows, left)))
                if _judged(seed):
                    pairs.append((at, at, min(rows, left)))
                at += min(rows, left)
                left -= rows
            if not pairs:
                continue
            args = None
            if logical is not None:  # fresh tensors, as the needle alone gets: a kernel that
                # caches by a tensor's identity or address sees a call of its own
                args = [
                    (t if spec.batch_axis is None else t.narrow(spec.batch_axis, 0, size)).clone()
                    for spec, t in zip(specs, logical, strict=True)
                ]
            label = describe("rows", size, total)
            out.append(_Window(label, case, cut, args, pairs))
        return out
    companions = case.batch.companions
    owned = _owned_rows(case)
    starts = [sum(owned[:i]) for i in range(len(owned))]
    position = case.batch.position
    for keep in sample_windows(len(companions), most):
        where = min(position, keep)
        window = case.with_batch(Batch(where, companions[:keep]))
        # The window's samples in its order, as indices of the batch's samples: companion i
        # sits at i below the needle's position and at i + 1 from it on; the needle at position.
        index = [i if i < position else i + 1 for i in range(keep)]
        index.insert(where, position)
        pairs, at = [], 0
        for u in index:
            if _judged(samples[u][0]):
                pairs.append((at, starts[u], owned[u]))
            at += owned[u]
        label = describe("samples", keep, len(companions))
        out.append(_Window(label, window, batch_samples(window), None, pairs))
    if most and companions and info.companion_output_rows is None and not case.padded:
        alone = _without_needle(case, samples, owned, starts)
        if alone.pairs:
            out.append(alone)
    return out


def _without_needle(
    case: Case, samples: list[tuple[int, int]], owned: list[int], starts: list[int]
) -> _Window:
    """The batch without its needle: its companions alone, in order, the first one standing in
    as the case's needle. Every window above keeps the needle, so a kernel keyed on the batch's
    longest sequence, with the needle the longest, never changes path in them; here it can, and
    each companion's rows are judged against the whole batch's."""
    assert case.batch is not None
    position, companions = case.batch.position, case.batch.companions
    first = companions[0]
    window = replace(
        case, shape=(first.rows, *case.shape[1:]), seed=first.seed, batch=Batch(0, companions[1:])
    )
    index = [i if i < position else i + 1 for i in range(len(companions))]
    pairs, at = [], 0
    for u in index:
        if _judged(samples[u][0]):
            pairs.append((at, starts[u], owned[u]))
        at += owned[u]
    label = f"the batch without its needle (its {len(companions)} companions alone)"
    return _Window(label, window, [samples[u] for u in index], None, pairs)


def _judged(seed: int) -> bool:
    """Whether a sample's rows are compared across windows: plain ones. A companion of another
    content (``Companion.content``: -inf, huge, outliers) is there to disturb the others; its
    own rows are mostly NaN and infinities whose payloads vector and scalar code set apart."""
    return getattr(seed, "content", "plain") == "plain"


def _gather(t: Any, axis: int, spans: list[tuple[int, int]]) -> Any:
    """The rows ``spans`` [(offset, rows), ...] of ``t`` along ``axis``, concatenated."""
    import torch

    return torch.cat([t.narrow(axis, offset, rows) for offset, rows in spans], dim=axis)


def _window_calls(
    case: Case, target: Target, window: _Window, result: tuple[Any, ...]
) -> tuple[Call, Call, int]:
    """(the window's rows in the window, the same rows in the batch, elements) for one window."""
    info = OPS[case.op]
    if window.args is not None:
        args = _laid_out(case, window.args)
    else:
        args = operands(window.case, window.samples, target.device)
    outs, call = _invoke(window.case, args, [rows for _, rows in window.samples])
    axes = info.output_batch_axes
    inside = Call(
        outputs=tuple(
            _tensor_bits(_gather(t, axis, [(b, r) for _, b, r in window.pairs]))
            for t, axis in zip(result, axes, strict=False)
        )
    )
    if outs is None:
        return call, inside, 0
    mine = tuple(
        _gather(t, axis, [(w, r) for w, _, r in window.pairs])
        for t, axis in zip(outs, axes, strict=False)
    )
    elements = sum(int(t.numel()) for t in mine)
    return Call(outputs=tuple(_tensor_bits(t) for t in mine)), inside, elements


def _same_bits(a: Call, b: Call) -> bool:
    if a.raised or b.raised:
        return a.error_type == b.error_type
    assert a.outputs is not None and b.outputs is not None
    return len(a.outputs) == len(b.outputs) and all(
        (x.dtype, x.shape) == (y.dtype, y.shape)
        and x.bits is not None
        and y.bits is not None
        and np.array_equal(x.bits, y.bits)
        for x, y in zip(a.outputs, b.outputs, strict=True)
    )


def _window_logical(case: Case, window: _Window) -> list[Any]:
    """A window's logical operands on the CPU (layouts not applied): a reproducer's tensors."""
    if window.args is not None:
        return [t.to("cpu") for t in window.args]
    return operands(window.case, window.samples, "cpu", layouts=False)


def _failing_window(case: Case, target: Target) -> _Window | None:
    """The first window of the case's batch whose rows differ from the whole batch's (as
    ``observe_batch_invariance`` finds it), or None."""
    batch = batch_samples(case)
    logical = operands(case, batch, target.device, layouts=False)
    result, _ = _invoke(case, _laid_out(case, logical), [rows for _, rows in batch])
    if result is None:
        return None
    for window in batch_windows(case, logical):
        mine, inside, _ = _window_calls(case, target, window, result)
        if not _same_bits(mine, inside):
            return window
    return None


def _judge_windows(
    case: Case,
    target: Target,
    logical: list[Any],
    result: tuple[Any, ...],
    calls: dict[str, Call],
    evidence: dict[str, Any],
) -> int:
    """Run the windows; return the rows they judged. The first window whose rows differ from
    the batch's goes to ``calls`` (``window``, ``window_in_batch``) and ``evidence["window"]``
    (its label); the windows after it are not run."""
    judged = 0
    evidence["windows"] = 0
    for window in batch_windows(case, logical):
        mine, inside, elements = _window_calls(case, target, window, result)
        evidence["windows"] += 1
        if not _same_bits(mine, inside):
            calls["window"], calls["window_in_batch"] = mine, inside
            evidence["window"] = window.label
            return judged + window.rows
        judged += window.rows
        evidence["window_elements"] = evidence.get("window_elements", 0) + elements
    return judged


def permutes_samples(case: Case) -> bool:
    """Whether row permutation moves whole samples (sequences: packed or paged attention, an op
    owning other output rows than input rows; a padded case, whose samples are its batch axis)
    rather than single rows."""
    info = OPS[case.op]
    return info.sequences or info.output_rows is not None or bool(case.padded)


def permuted_case(case: Case, order: list[int]) -> Case:
    """The case whose batch holds the same samples in ``order`` (``order[new] = original``): the
    needle and each companion (its seed, rows and query tokens) moved whole, so that an op
    reading per-sample metadata from the case (mixed attention's query tokens) sees them in
    their new order."""
    assert case.batch is not None
    position = case.batch.position
    companions = case.batch.companions

    def companion(unit: int):
        return companions[unit if unit < position else unit - 1]

    moved = tuple(companion(u) for u in order if u != position)
    return case.with_batch(Batch(order.index(position), moved))


@dataclass(frozen=True)
class _Permutation:
    """How ``row_permutation`` reorders a case's batch: the units (rows, or whole samples), their
    new order (``order[new] = original unit``), and where each output row goes back."""

    samples: list[tuple[int, int]]
    whole: bool
    sizes: list[int]
    order: list[int]
    back: list[int]

    @property
    def lengths(self) -> list[int]:
        return [rows for _, rows in self.samples]

    @property
    def moved_lengths(self) -> list[int]:
        return [self.samples[u][1] for u in self.order] if self.whole else self.lengths

    def evidence(self) -> dict[str, Any]:
        return {
            "unit": "sequence" if self.whole else "row",
            "units": len(self.sizes),
            "rows": int(sum(self.lengths)),
            "moved_rows": moved_rows(self.order, self.sizes),
        }


def _owned_rows(case: Case) -> list[int]:
    """The output rows each sample of the batch owns, in batch order (a companion's may depend
    on more than its rows: ``OpSpec.companion_output_rows``)."""
    info = OPS[case.op]
    assert case.batch is not None
    owned = [info.companion_owned_rows(case, c) for c in case.batch.companions]
    owned.insert(case.batch.position, info.owned_rows(case, case.shape[0]))
    return owned


def _permutation(case: Case) -> _Permutation:
    info = OPS[case.op]
    if not info.batchable(case):
        raise ValueError(f"row permutation is not defined for {case!r}")
    samples = batch_samples(case)
    lengths = [rows for _, rows in samples]
    whole = permutes_samples(case)
    sizes = lengths if whole else [1] * sum(lengths)
    order = list(derangement(sizes, case.seed))
    owned = _owned_rows(case) if whole else sizes
    return _Permutation(samples, whole, sizes, order, unpermute_index(order, owned))


def _permuted_operands(case: Case, plan: _Permutation, device: str, layouts: bool = True):
    """The batch's operands in the permuted order: whole samples drawn in their new order, or the
    rows of every per-sample operand reordered along its batch axis (layouts applied after)."""
    import torch

    if plan.whole:
        return operands(permuted_case(case, plan.order), [plan.samples[u] for u in plan.order],
                        device, layouts=layouts)  # fmt: skip
    specs = OPS[case.op].operands(case)
    logical = operands(case, plan.samples, device, layouts=False)
    index = torch.tensor(plan.order, dtype=torch.int64)
    result = []
    for i, (spec, t) in enumerate(zip(specs, logical, strict=True)):
        if spec.batch_axis is not None:
            if t.shape[spec.batch_axis] != len(plan.order):
                raise ValueError(  # bi_props' own bug: a per-row op whose operand is not per row
                    f"row permutation of {case.op}: operand {spec.name!r} has "
                    f"{t.shape[spec.batch_axis]} rows along its batch axis, the batch "
                    f"{len(plan.order)}"
                )
            t = t.index_select(spec.batch_axis, index.to(t.device))
        layout = case.layouts[i] if i < len(case.layouts) and layouts else "contiguous"
        result.append(apply_layout(t, layout))
    return result


def observe_row_permutation(case: Case, target: Target, unpermute: bool = True) -> dict[str, Any]:
    """The batch as drawn, and the batch with its rows (sequence ops: its samples) in a
    derangement (``model.permutation``), the latter's output put back in the original order.
    ``unpermute=False`` leaves it permuted: the mistake the property's positive control plants."""
    import torch

    info = OPS[case.op]
    plan = _permutation(case)
    keep = _judged_rows(case, plan.samples)
    drawn, batch = _invoke(case, operands(case, plan.samples, target.device), plan.lengths)
    if drawn is not None and keep is not None:
        batch = _rows_call(drawn, info.output_batch_axes, keep)
    args = _permuted_operands(case, plan, target.device)
    moved = permuted_case(case, plan.order) if plan.whole else case
    result, permuted = _invoke(moved, args, plan.moved_lengths)
    if result is not None and unpermute:
        back = []
        for t, axis in zip(result, info.output_batch_axes, strict=False):
            index = torch.tensor(plan.back, dtype=torch.int64, device=t.device)
            back.append(t.index_select(axis, index))
        permuted = _rows_call(tuple(back), info.output_batch_axes, keep)
    elif result is not None and keep is not None:  # left permuted: the same rows kept
        permuted = _rows_call(result, info.output_batch_axes, keep)
    return {"calls": {"batch": batch, "permuted": permuted}, "evidence": plan.evidence()}


def _judged_rows(case: Case, samples: list[tuple[int, int]]) -> list[int] | None:
    """The output rows of the batch's plain samples, in batch order (``_judged``); None when
    every sample is plain (all rows)."""
    if all(_judged(seed) for seed, _ in samples):
        return None
    rows, at = [], 0
    for (seed, _), owned in zip(samples, _owned_rows(case), strict=True):
        if _judged(seed):
            rows.extend(range(at, at + owned))
        at += owned
    return rows


def _rows_call(outputs: tuple[Any, ...], axes, keep: list[int] | None) -> Call:
    """A call's outputs, only the rows ``keep`` along each output's batch axis (all: None)."""
    import torch

    picked = []
    for t, axis in zip(outputs, axes, strict=False):
        if keep is not None:
            t = t.index_select(axis, torch.tensor(keep, dtype=torch.int64, device=t.device))
        picked.append(_tensor_bits(t))
    return Call(outputs=tuple(picked))


def observe_logprobs(case: Case, target: Target) -> dict[str, Any]:
    """The probe model's per-token logprobs: the needle alone and inside the batch. Only when they
    differ is the batch run again under the profiler, to name the ops the model used: passing
    examples (the hot path) never pay for a profiler window."""
    observed = observe_batch_invariance(case, target, windows=False)  # a model call is costly
    alone, together = observed["calls"]["alone"], observed["calls"]["in_batch"]
    same = (
        alone.outputs is not None
        and together.outputs is not None
        and all(
            a.bits is not None and b.bits is not None and a.bits.tobytes() == b.bits.tobytes()
            for a, b in zip(alone.outputs, together.outputs, strict=False)
        )
    )
    if same or alone.raised or together.raised:
        return observed
    return observe_batch_invariance(case, target, profile_ops=True, windows=False)


def observe_decode(case: Case, target: Target) -> dict[str, Any]:
    """Prefill's last row, and the same row from one decode step on the KV cache."""
    samples = needle(case)
    _, call = _invoke(case, operands(case, samples, target.device), [case.shape[0]])
    return {"calls": {"op": call}}


def observe_determinism(case: Case, target: Target) -> dict[str, Any]:
    """The same call on the same tensors twice (batched, so that scheduling has room to vary)."""
    samples = batch_samples(case)
    args = operands(case, samples, target.device)
    lengths = [rows for _, rows in samples]
    _, first = _invoke(case, args, lengths)
    _, second = _invoke(case, args, lengths)
    return {"calls": {"first": first, "second": second}}


def observe_parity(case: Case, target: Target) -> dict[str, Any]:
    """Only the contract: raised or not (and what), output dtypes, shapes, devices."""
    samples = needle(case)
    _, call = _invoke(case, operands(case, samples, target.device), [case.shape[0]])
    if call.outputs is not None:
        call = Call(
            outputs=tuple(TensorBits(o.dtype, o.shape, o.device, None) for o in call.outputs)
        )
    return {"calls": {"op": call}}


def observe_routing(case: Case, target: Target) -> dict[str, Any]:
    """Profiler events of one call, the target's identity checks and its switch state.

    The legacy autograd profiler costs ~0.4 ms a window on CPU (kineto ~45 ms), and only this
    property opens one: the other properties never pay for routing evidence.
    """
    samples = needle(case)
    args = operands(case, samples, target.device)
    events: tuple[str, ...] | None = None
    compiled = case.mode == "compiled"
    # Dynamo refuses to compile under a Python dispatch mode: a compiled call is not traced (its
    # aten ops are those of Inductor's code: an empty trace, so no dispatcher evidence is read)
    trace = _DispatchTrace.make() if target.dispatch_trace() and not compiled else None
    if compiled:  # compile first (on its own tensors: an op may write its operands in place),
        # so that the profiled call is the compiled program, not Dynamo's and Inductor's work
        _invoke(case, operands(case, samples, target.device), [case.shape[0]])
    if target.observe_routing() == "profiler":
        import torch

        try:
            with torch.autograd.profiler.profile(use_kineto=False) as prof:
                _, call = _invoke(case, args, [case.shape[0]], trace)
            events = tuple(dict.fromkeys(e.name for e in prof.function_events))
        except RuntimeError as exc:  # a profiler that cannot start: routing not observable
            _, call = _invoke(case, args, [case.shape[0]], trace)
            call = Call(call.outputs, call.error_type, call.error_message)
            return {
                "calls": {"op": call},
                "evidence": {"profiler_error": str(exc), **target.switch_state()},
            }
    else:
        _, call = _invoke(case, args, [case.shape[0]], trace)
    call = Call(call.outputs, call.error_type, call.error_message, events)
    if compiled and target.dispatch_trace():
        identity = target.evidence(case.op, dispatched=())
    elif trace is None:
        identity = target.evidence(case.op)
    else:  # this example's own aten ops, not every aten op of the op's family
        identity = target.evidence(case.op, dispatched=tuple(dict.fromkeys(trace.names)))
    evidence = {"identity": identity, **target.switch_state()}
    if compiled:  # routing under compile: did the call run a compiled region at all?
        evidence["mode"] = "compiled"
        if events is not None:
            evidence["compiled_regions"] = sum(e.startswith(COMPILED_REGION) for e in events)
    return {"calls": {"op": call}, "evidence": evidence}


COMPILED_REGION = "Torch-Compiled Region"
"""The profiler event Dynamo records around each compiled frame it runs."""


class _DispatchTrace:
    """The aten ops (qualified names with overload: ``aten::addmm``, ``aten::mean.dim``) that one
    call dispatched, in order, read by a ``TorchDispatchMode`` around the entry's call alone.
    Only the outermost dispatched ops are seen: the mode is off while each op runs, so what a
    kernel calls inside itself is not attributed to the entry."""

    @staticmethod
    def make() -> Any:
        from torch.utils._python_dispatch import TorchDispatchMode

        class Trace(TorchDispatchMode):
            def __init__(self) -> None:
                super().__init__()
                self.names: list[str] = []

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                self.names.append(str(func.name()))
                return func(*args, **(kwargs or {}))

        return Trace()


def export(prop: str, case: Case, target: Target) -> dict[str, Any]:
    """The exact inputs of a case (logical values, before layouts are applied) and, for the
    reference property, the expected values: what a standalone reproducer writes out."""

    info = OPS[case.op]
    groups = {"alone": needle(case)}
    from ..model.property_spec import get

    if get(prop).batched and case.batch is not None:
        groups["batch"] = batch_samples(case)
    exported: dict[str, Any] = {"groups": {}, "padded": bool(case.padded)}
    for name, samples in groups.items():
        laid_out = alone_case(case) if name == "alone" and "batch" in groups else case
        tensors = operands(laid_out, samples, "cpu", layouts=False)
        exported["groups"][name] = {
            "lengths": [rows for _, rows in samples],
            "tensors": [_exported_tensor(t) for t in tensors],
        }
    if case.batch is not None:
        exported["offset"], exported["rows"] = info.needle_output(case)
        exported["output_batch_axes"] = list(info.output_batch_axes)
    if prop == "batch_invariance" and case.batch is not None:
        window = _failing_window(case, target)
        if window is not None:  # the first window whose rows differ from the batch's
            exported["groups"]["window"] = {
                "lengths": [rows for _, rows in window.samples],
                "tensors": [_exported_tensor(t) for t in _window_logical(case, window)],
                "pairs": [list(p) for p in window.pairs],
                "label": window.label,
            }
    if prop == "row_permutation" and case.batch is not None:
        plan = _permutation(case)
        tensors = _permuted_operands(case, plan, "cpu", layouts=False)
        exported["groups"]["permuted"] = {
            "lengths": plan.moved_lengths,
            "tensors": [_exported_tensor(t) for t in tensors],
        }
        exported["unpermute"] = plan.back
    if prop == "reference":
        args = operands(case.with_padded(0), groups["alone"], "cpu")
        inputs = [to_float64(a) for a in args]
        refs = info.references(inputs, case, [case.shape[0]], target.precision(case.op))
        exported["references"] = [
            {
                "dtype": r.dtype,
                "shape": list(r.value.shape),
                "value": r.value.astype("float64").tobytes(),
                "tolerance": None
                if r.tolerance is None
                else np.broadcast_to(r.tolerance, r.value.shape).astype("float64").tobytes(),
            }
            for r in refs
        ]
    return exported


def _exported_tensor(t: Any) -> dict[str, Any]:
    return {
        "dtype": str(t.dtype).removeprefix("torch."),
        "shape": list(t.shape),
        "bytes": (bits(t)[3] if t.is_floating_point() else t.numpy()).tobytes(),
    }


_OBSERVATION_FIELDS = {"calls", "references", "evidence"}


def observe(prop: str, case: Case, target: Target, switch: str) -> Observation:
    from ..model.property_spec import get

    observer = get(prop).observer
    from . import compiled

    before = compiled.snapshot() if case.mode == "compiled" else None
    start = time.perf_counter()
    fields = observer(case, target)
    seconds = time.perf_counter() - start
    if (
        not isinstance(fields, dict)
        or not isinstance(fields.get("calls"), dict)
        or (set(fields) - _OBSERVATION_FIELDS)
    ):
        raise TypeError(  # a user's observer: say what it must return, not a dataclass error
            f"the observer of property {prop!r} returned {type(fields).__name__} with keys "
            f"{sorted(fields) if isinstance(fields, dict) else '-'}; it must return a dict with "
            f"'calls' ({{name: Call}}) and optionally 'evidence' and 'references'"
        )
    if case.mode == "compiled":  # compile time, measured apart: never counted as kernel time
        spent = compiled.spent(before) or {"seconds": 0.0, "graphs": 0}
        spent.update(compiled.state())  # a fresh-compile worker's caches and distortion
        why = compiled.piecewise(case)
        if why:  # not one graph: Dynamo runs what it cannot trace eagerly between graphs
            spent["piecewise"] = why
        seconds = max(seconds - spent["seconds"], 0.0)
        fields = {**fields, "evidence": {**(fields.get("evidence") or {}), "compile": spent}}
    return Observation(property=prop, switch=switch, seconds=seconds, **fields)
