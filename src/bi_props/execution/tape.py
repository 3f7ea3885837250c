"""Worker side: localize a model-level finding to the first op whose needle rows differ.

A model-level finding (the probe model's logprobs of a needle differ alone vs inside its batch)
says *that* the model drifts, not *where*. ``localize`` replays the case twice, the needle alone
and its batch, each under a tape: a ``TorchDispatchMode`` that records every dispatched op (aten
ops, and a target's custom ops ``ns::name``, which the dispatcher sees as their own ops) and a
wrapper around the probe model's catalogue entries (``add_rms_norm``, ``attention``...: Python
functions, recorded as ``entry:<op>`` with the dispatched ops inside them as children). Each record
keeps its name, input and output shapes and dtypes, the ops its kernel dispatched inside it (the
kernel that ran: a ``ns::`` custom op, or none), and copies of its floating inputs and outputs.

The two tapes are aligned by (section, op name, occurrence within the section): the sections are
the probe model's layer parts (``layer i: norm + QKV``, ``layer i: attention``, ``layer i: o-proj
+ MLP``, ``final norm + lm_head``), which run in the same order alone and in the batch; a count
restarting in each section keeps per-sequence loops (the decode layout's KV cache) from shifting
the ops after them. A tensor is compared when its shape is the same in both (weights: bitwise,
whole) or when its dim 0 is the token count of the step (alone: the needle's tokens; batch: all
of them) and the rest of its shape agrees: then the needle's rows of the batch's tensor (at its
offset in the layout) against the alone tensor. The first op, in call order, whose compared
outputs differ while every compared floating input was equal is the first diverging op (an op
whose inputs differed already is a consequence). Data-movement ops (views, cat, copy) are
recorded for alignment but never blamed and never copied.

The first diverging op's inputs (alone and batch) go to a ``.pt`` file (``torch.save``) for an
op-level reproducer (reporting/op_repro.py). Imports nothing above ``execution``; never
Hypothesis or pytest. The worker's ``("localize", case, out_dir)`` request runs it.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from ..model.case import Case
from ..model.op_registry import ATEN_TO_OP, OPS
from ..model.target import Target
from .materialize import alone_case, batch_samples, bits, needle, operands

MOVEMENT = frozenset(
    {
        "aten::view",
        "aten::_unsafe_view",
        "aten::reshape",
        "aten::slice",
        "aten::select",
        "aten::t",
        "aten::transpose",
        "aten::permute",
        "aten::expand",
        "aten::unsqueeze",
        "aten::squeeze",
        "aten::as_strided",
        "aten::alias",
        "aten::detach",
        "aten::split",
        "aten::split_with_sizes",
        "aten::chunk",
        "aten::unbind",
        "aten::cat",
        "aten::stack",
        "aten::copy_",
        "aten::clone",
        "aten::contiguous",
        "aten::_to_copy",
        "aten::to",
        "aten::lift_fresh",
        "aten::lift_fresh_copy",
        "aten::zeros",
        "aten::zeros_like",
        "aten::new_zeros",
        "aten::empty",
        "aten::empty_like",
        "aten::empty_strided",
        "aten::new_empty",
        "aten::new_empty_strided",
        "aten::fill_",
        "aten::zero_",
        "aten::arange",
        "aten::scalar_tensor",
        "aten::_local_scalar_dense",
        "aten::index",
        "aten::index_select",
        "aten::embedding",
        "aten::repeat_interleave",
        "aten::resolve_conj",
        "aten::resolve_neg",
        "aten::select_scatter",
        "aten::slice_scatter",
        "aten::index_put_",
    }
)
"""Data movement: an element of the output is an element of an input. Never the cause (a gather
of the wrong rows shows as a consequence downstream), so recorded for alignment only."""

ENTRIES = {
    "add_rms_norm": "bi_props.ops.add_rms_norm",
    "attention": "bi_props.ops.varlen_attention",
    "mixed_attention": "bi_props.ops.mixed_attention",
    "paged_decode_attention": "bi_props.ops.paged_decode_attention",
}
"""The probe model's catalogue entry attributes (ProbeModel.__init__; each a catalogue op) and
their default entry points (a case's ``entries`` option names others)."""

INNER_KEEP = 12
"""Ops dispatched inside a kernel kept per record (the kernel's identity, not its trace)."""


@dataclass
class Record:
    index: int
    name: str  # "aten::mm", "ns::add_rms_norm", "entry:add_rms_norm"
    overload: str  # "default", "Tensor"...; the entry's dotted function name for an entry
    section: str
    parent: int | None
    key: tuple = ()
    args: Any = None  # copies (floating and integer tensors), None for movement ops
    kwargs: Any = None
    inputs: list[tuple[str, tuple[int, ...]]] = field(default_factory=list)
    outputs: list[Any] = field(default_factory=list)  # output tensors (copies)
    inner: list[str] = field(default_factory=list)
    movement: bool = False


def _tensors(tree: Any) -> list[Any]:
    import torch

    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, (list, tuple)):
        return [t for item in tree for t in _tensors(item)]
    if isinstance(tree, dict):
        return [t for item in tree.values() for t in _tensors(item)]
    return []


def _copy(tree: Any) -> Any:
    """The same structure with every tensor copied (same strides: a kernel may depend on them)."""
    import torch

    if isinstance(tree, torch.Tensor):
        t = tree.detach()
        try:
            out = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device="cpu")
            out.copy_(t)
            return out
        except RuntimeError:  # overlapping strides (an expand): a contiguous copy
            return t.to("cpu").clone()
    if isinstance(tree, tuple):
        return tuple(_copy(item) for item in tree)
    if isinstance(tree, list):
        return [_copy(item) for item in tree]
    if isinstance(tree, dict):
        return {k: _copy(v) for k, v in tree.items()}
    return tree


class Tape:
    """One run's records, in the order their calls began."""

    def __init__(self, armed: bool = True) -> None:
        self.records: list[Record] = []
        self.armed = armed
        self.section = "embedding"
        self._stack: list[int] = []
        self._counts: dict[tuple, int] = {}

    def begin(self, name: str, overload: str, args: Any, kwargs: Any) -> Record | None:
        if not self.armed:
            return None
        parent = self._stack[-1] if self._stack else None
        scope = (self.section,) if parent is None else self.records[parent].key
        base = (*scope, name, overload)
        count = self._counts.get(base, 0)
        self._counts[base] = count + 1
        movement = name in MOVEMENT
        record = Record(
            len(self.records),
            name,
            overload,
            self.section,
            parent,
            key=(*base, count),
            inputs=[(str(t.dtype).removeprefix("torch."), tuple(t.shape)) for t in _tensors(args)],
            movement=movement,
        )
        if not movement:
            armed, self.armed = self.armed, False  # the copies are no ops of the model
            try:
                record.args, record.kwargs = _copy(args), _copy(kwargs)
            finally:
                self.armed = armed
        self.records.append(record)
        return record

    def finish(self, record: Record | None, result: Any, inner: list[str]) -> None:
        if record is None:
            return
        record.inner = inner[:INNER_KEEP]
        if not record.movement:
            armed, self.armed = self.armed, False
            try:
                record.outputs = [_copy(t) for t in _tensors(result)]
            finally:
                self.armed = armed


def _below_python(args: Any, kwargs: Any) -> Any:
    """The dispatch keys of the call's tensors below the Python mode key (None without a
    tensor): redispatched there, the op runs its kernel and the kernel's own calls are seen."""
    import torch

    tensors = _tensors((args, kwargs))
    if not tensors:
        return None
    keys = torch._C._dispatch_keys(tensors[0])
    for t in tensors[1:]:
        keys = keys | torch._C._dispatch_keys(t)
    return keys & torch._C._dispatch_keyset_full_after(torch._C.DispatchKey.Python)


_NOT_RUN = object()


def _redispatch(func: Any, keys: Any, args: Any, kwargs: Any) -> Any:
    """``func`` redispatched below the Python key, or ``_NOT_RUN`` where it cannot be (no
    tensor; a Python scalar where the schema says Tensor: the boxed redispatch does not wrap
    numbers, so the argument check fails before any kernel ran)."""
    if keys is None:
        return _NOT_RUN
    try:
        return func.redispatch(keys, *args, **kwargs)
    except RuntimeError as exc:
        if "Expected a value of type" in str(exc) or "Unable to cast" in str(exc):
            return _NOT_RUN
        raise


def _dispatch_mode(tape: Tape) -> Any:
    from torch.utils._python_dispatch import TorchDispatchMode

    class Inner(TorchDispatchMode):
        """The ops a kernel dispatches inside itself: which kernel ran."""

        def __init__(self) -> None:
            super().__init__()
            self.names: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if len(self.names) < INNER_KEEP:
                self.names.append(str(func._schema.name))
            return func(*args, **(kwargs or {}))

    class Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if not tape.armed:
                return func(*args, **kwargs)
            record = tape.begin(str(func._schema.name), func._overloadname, args, kwargs)
            inner = Inner()
            keys = _below_python(args, kwargs)
            with inner:  # the op's kernel directly (below this mode): the ops it dispatches
                result = _redispatch(func, keys, args, kwargs)
            names = inner.names if result is not _NOT_RUN else []
            if result is _NOT_RUN:  # through the dispatcher: [0] is the op itself
                with inner:
                    result = func(*args, **kwargs)
                names = inner.names[1:]
            tape.finish(record, result, names)
            return result

    return Recorder()


@contextlib.contextmanager
def _probe_model_hooks(tape: Tape, arm_in: str | None):
    """Sections from the probe model's layer loop, its catalogue entries as records, and (for
    the mixed and decode layouts) the tape armed only inside the batch's one step (``arm_in``:
    ``step`` or ``decode``), not in the prefills that build each sequence's KV cache."""
    from . import probe_model

    cls = probe_model.ProbeModel
    saved = {name: cls.__dict__[name] for name in ("__init__", "_qkv", "_layer_tail", "step")}
    saved["decode"] = cls.__dict__["decode"]
    layers: list[int] = []

    def wrap_entry(op: str, function: Any, dotted: str) -> Any:

        @functools.wraps(function)
        def entry(*args: Any, **kwargs: Any) -> Any:
            record = tape.begin(f"entry:{op}", dotted, args, kwargs)
            if record is not None:
                tape._stack.append(record.index)
            try:
                result = function(*args, **kwargs)
            finally:
                if record is not None:
                    tape._stack.pop()
            tape.finish(record, result, [])
            return result

        return entry

    def init(self, flat, config, entries=None) -> None:
        saved["__init__"](self, flat, config, entries)
        layers.append(self.config.layers)
        for op, default in ENTRIES.items():
            dotted = (entries or {}).get(op, default)  # looked up by name: swaps apply
            setattr(self, op, wrap_entry(op, getattr(self, op), dotted))

    def qkv(self, x, residual, i, cos, sin):
        tape.section = f"layer {i}: norm + QKV"
        out = saved["_qkv"](self, x, residual, i, cos, sin)
        tape.section = f"layer {i}: attention"
        return out

    def tail(self, a, residual, i):
        tape.section = f"layer {i}: o-proj + MLP"
        out = saved["_layer_tail"](self, a, residual, i)
        if i == self.config.layers - 1:
            tape.section = "final norm + lm_head"
        return out

    def armed(name: str) -> Any:
        def method(self, *args: Any, **kwargs: Any) -> Any:
            if arm_in != name:
                return saved[name](self, *args, **kwargs)
            before, tape.armed, tape.section = tape.armed, True, "embedding"
            try:
                return saved[name](self, *args, **kwargs)
            finally:
                tape.armed = before

        return method

    cls.__init__, cls._qkv, cls._layer_tail = init, qkv, tail
    cls.step, cls.decode = armed("step"), armed("decode")
    try:
        yield layers
    finally:
        for name, value in saved.items():
            setattr(cls, name, value)


@dataclass(frozen=True)
class Geometry:
    """Where the needle's tokens are in the taped step: ``rows`` of them alone, at ``offset`` of
    ``total`` inside the batch."""

    rows: int
    total: int
    offset: int


def geometry(case: Case) -> Geometry:
    """The needle's rows in the probe model's taped step, per layout (catalogue/models.py)."""
    assert case.batch is not None
    samples = batch_samples(case)
    lengths = [rows for _, rows in samples]
    p, n = case.batch.position, case.shape[0]
    if case.entry == "padded":  # every sequence right-padded to the longest
        longest = max(lengths)
        return Geometry(n, longest * len(lengths), p * longest)
    if case.entry == "mixed":  # the needle decodes one token; the others prefill theirs
        queries = [1 if b == p else rows for b, rows in enumerate(lengths)]
        return Geometry(1, sum(queries), sum(queries[:p]))
    if case.entry == "decode":  # one token per sequence
        return Geometry(1, len(lengths), p)
    return Geometry(n, sum(lengths), sum(lengths[:p]))


def _run(case: Case, target: Target, samples: list[tuple[int, int]]) -> tuple[Tape, int]:
    import torch

    arm_in = {"mixed": "step", "decode": "decode"}.get(case.entry)
    tape = Tape(armed=arm_in is None)
    args = operands(case, samples, target.device)
    lengths = [rows for _, rows in samples]
    with _probe_model_hooks(tape, arm_in) as layers, torch.no_grad(), _dispatch_mode(tape):
        OPS[case.op].call(case.entry, args, case, lengths)
    return tape, (layers[0] if layers else 0)


def _pair(alone: Any, batch: Any, g: Geometry) -> tuple[Any, Any] | None:
    """(alone, the batch's needle part) when comparable, else None."""
    if alone.shape == batch.shape:
        return alone, batch
    if (
        alone.dim() >= 1
        and alone.shape[1:] == batch.shape[1:]
        and alone.shape[0] == g.rows
        and batch.shape[0] == g.total
    ):
        return alone, batch[g.offset : g.offset + g.rows]
    return None


def _same(a: Any, b: Any) -> bool:
    return a.dtype == b.dtype and bits(a)[3].tobytes() == bits(b)[3].tobytes()


def _differs(pairs: list[tuple[Any, Any] | None]) -> bool:
    return any(p is not None and not _same(*p) for p in pairs)


@dataclass
class _Judged:
    alone: Record
    batch: Record
    inputs_compared: int
    inputs_differ: bool
    outputs_differ: bool
    outputs: list[tuple[Any, Any] | None]


def _judge(alone: Record, batch: Record, g: Geometry) -> _Judged:
    a_in = [t for t in _tensors((alone.args, alone.kwargs)) if t.is_floating_point()]
    b_in = [t for t in _tensors((batch.args, batch.kwargs)) if t.is_floating_point()]
    ins = [_pair(a, b, g) for a, b in zip(a_in, b_in, strict=False)]
    outs = [
        _pair(a, b, g)
        for a, b in zip(alone.outputs, batch.outputs, strict=False)
        if a.is_floating_point() and b.is_floating_point()
    ]
    return _Judged(
        alone,
        batch,
        sum(p is not None for p in ins) if len(a_in) == len(b_in) else 0,
        len(a_in) != len(b_in) or _differs(ins),
        _differs(outs),
        outs,
    )


def _describe_rows(pairs: list[tuple[Any, Any] | None], g: Geometry) -> str:
    """Which needle rows of the first differing output differ, and the first element."""
    for index, pair in enumerate(pairs):
        if pair is None or _same(*pair):
            continue
        a, b = pair
        _, _, _, abits = bits(a)
        _, _, _, bbits = bits(b)
        bad = abits != bbits
        rows = np.nonzero(bad.reshape(bad.shape[0], -1).any(axis=1))[0] if bad.ndim else [0]
        first = tuple(int(i) for i in np.argwhere(bad)[0]) if bad.ndim else ()
        width = a.element_size() * 2
        where = f"output {index}" if len(pairs) > 1 else "output"
        span = _spans([int(r) for r in rows])
        part = "needle rows" if a.dim() and a.shape[0] == g.rows else "rows"
        return (
            f"{where} {part} {span} of {a.shape[0] if a.dim() else 1} differ "
            f"({int(bad.sum())} of {bad.size} elements); first at {first}: alone "
            f"{float(a[first])!r} (0x{int(abits[first]):0{width}x}), in the batch "
            f"{float(b[first])!r} (0x{int(bbits[first]):0{width}x})"
        )
    return "no compared output differs"


def _spans(rows: list[int]) -> str:
    parts = []
    for _, group in itertools.groupby(enumerate(rows), lambda p: p[1] - p[0]):
        run = [r for _, r in group]
        parts.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
    return ", ".join(parts[:6]) + (", ..." if len(parts) > 6 else "")


def _kernel(record: Record, tape: Tape, prefix: str) -> str:
    """The kernel that ran: the target's custom op dispatched inside the record (or the record
    itself when it is one), else what the record's kernel dispatched."""
    inner = list(record.inner)
    if record.name.startswith("entry:"):
        inner = [r.name for r in tape.records if r.parent == record.index]
    names = [record.name, *inner]
    ours = [n for n in names if prefix and n.startswith(prefix)]
    if ours:
        return ours[0]
    custom = [n for n in names if "::" in n and not n.startswith("aten::") and "entry:" not in n]
    if custom:
        return custom[0]
    if record.name.startswith("entry:"):
        return f"the Python entry {record.overload} itself (no {prefix or 'target'} kernel ran)"
    return f"{record.name}'s own kernel (no {prefix or 'target'} kernel ran)"


def _inner(record: Record, tape: Tape) -> list[str]:
    if record.name.startswith("entry:"):
        return [r.name for r in tape.records if r.parent == record.index]
    return list(dict.fromkeys(record.inner))


def catalogue_op(name: str) -> str | None:
    if name.startswith("entry:"):
        return name.removeprefix("entry:")
    return ATEN_TO_OP.get(name) or (
        name.split("::", 1)[1] if "::" in name and name.split("::", 1)[1] in OPS else None
    )


def _meta(record: Record) -> list[dict[str, Any]]:
    return [{"dtype": d, "shape": list(s)} for d, s in record.inputs]


def align(alone: Tape, batch: Tape, g: Geometry) -> dict[str, Any]:
    """The first diverging op, as indices into both tapes and the judged pair (no tensors)."""
    by_key = {r.key: r for r in alone.records}
    first_output = None
    for record in batch.records:
        if record.movement:
            continue
        other = by_key.get(record.key)
        if other is None:
            continue
        judged = _judge(other, record, g)
        if not judged.outputs_differ:
            continue
        if first_output is None:
            first_output = judged
        if judged.inputs_differ or judged.inputs_compared == 0:
            continue
        inside = None
        if record.name.startswith("entry:"):
            for child in batch.records:
                if child.parent != record.index or child.movement:
                    continue
                partner = by_key.get(child.key)
                if partner is None:
                    continue
                c = _judge(partner, child, g)
                if c.outputs_differ and not c.inputs_differ:
                    inside = c
                    break
        return {"cause": judged, "inside": inside, "first_output": first_output}
    return {"cause": None, "inside": None, "first_output": first_output}


def localize(case: Case, target: Target, out_dir: str | None = None) -> dict[str, Any]:
    """Replay the needle alone and in its batch under the tape (eagerly), align the tapes and
    name the first diverging op; with ``out_dir``, save its inputs (``localize-<op>.pt``)."""
    import torch

    if case.batch is None:
        raise ValueError(f"localize needs a batched case, not {case!r}")
    if case.mode != "eager":  # Dynamo refuses to trace under a dispatch mode: replayed eagerly
        case = replace(case, mode="eager", options=dict(case.options))
    single = alone_case(case)
    g = geometry(case)
    alone, layers = _run(single, target, needle(case))
    batch, _ = _run(case, target, batch_samples(case))
    prefix = getattr(target, "kernel_prefix", "") or ""
    found = align(alone, batch, g)
    summary: dict[str, Any] = {
        "layout": case.entry,
        "layers": layers,
        "needle_rows": g.rows,
        "batch_rows": g.total,
        "offset": g.offset,
        "calls": {"alone": len(alone.records), "batch": len(batch.records)},
        "ops": list(dict.fromkeys(r.name for r in batch.records)),
        "cause": None,
    }
    first = found["first_output"]
    if first is not None:
        summary["first_differing_output"] = {
            "op": first.batch.name,
            "section": first.batch.section,
            "index": first.batch.index,
        }
    judged = found["cause"]
    if judged is None:
        return summary
    record = judged.batch
    cause = {
        "op": record.name,
        "overload": record.overload,
        "index": record.index,
        "section": record.section,
        "catalogue_op": catalogue_op(record.name),
        "kernel": _kernel(record, batch, prefix),
        "kernel_alone": _kernel(judged.alone, alone, prefix),
        "dispatched": _inner(record, batch),
        "dispatched_alone": _inner(judged.alone, alone),
        "inputs": _meta(record),
        "inputs_alone": _meta(judged.alone),
        "rows": _describe_rows(judged.outputs, g),
    }
    reproduced = judged
    inside = found["inside"]
    if inside is not None:  # the kernel inside the catalogue entry that first differs
        cause["inside"] = {
            "op": inside.batch.name,
            "overload": inside.batch.overload,
            "index": inside.batch.index,
            "kernel": _kernel(inside.batch, batch, prefix),
            "rows": _describe_rows(inside.outputs, g),
        }
        reproduced = inside  # a dispatcher op: its reproducer needs no Python entry
    summary["cause"] = cause
    if out_dir is not None:
        r = reproduced.batch
        callable_ = r.overload if r.name.startswith("entry:") else f"{r.name}.{r.overload}"
        outputs = []
        for a, b in zip(reproduced.alone.outputs, r.outputs, strict=False):
            if a.shape == b.shape:
                outputs.append("whole")
            elif a.dim() >= 1 and a.shape[0] == g.rows and b.shape[0] == g.total:
                outputs.append("needle")
            else:
                outputs.append("skip")
        data = {
            "op": callable_,
            "alone": (reproduced.alone.args, reproduced.alone.kwargs),
            "batch": (r.args, r.kwargs),
            "needle": {"rows": g.rows, "offset": g.offset, "total": g.total},
            "outputs": outputs,
        }
        name = callable_.replace("::", "_").replace(".", "_").replace(":", "_")
        path = Path(out_dir) / f"localize-{name}.pt"
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(data, path)
        summary["saved"] = {"path": str(path), "op": callable_}
    return summary
