"""The properties: each judges Observations and returns a Verdict. numpy only, no torch.

Stable names: ``routing``, ``reference``, ``batch_invariance``, ``row_permutation``,
``determinism``, ``parity``, ``logprobs``, ``decode`` (each declared as a record in
``property_spec``, beside users' own).
Batch invariance and determinism compare bit patterns (NaN payloads and the sign of zero count);
the reference comparison is bitwise where the catalogue says exactness is sound, bounded elsewhere.
"""

from __future__ import annotations

from dataclasses import replace

from . import promise as switches
from .compare import compare_bits, compare_to_reference, ulp_summary
from .observation import Call, Hello, Observation
from .verdict import Verdict

PASS = Verdict(True)


def _judged(outputs, references=None) -> tuple[int, str]:
    """(elements compared, degenerate reason) of a passing numeric comparison: degenerate when
    no element was compared (N = 0, an empty output) or every float element of the actual and
    the desired is +0.0 (K = 0: a value no summation order can change)."""
    import numpy as np

    compared = sum(int(np.asarray(o.bits).size) for o in outputs if o.bits is not None)
    if compared == 0:
        return 0, "compared zero elements (an empty output)"
    from .compare import INTEGER_DTYPES

    floats = [o for o in outputs if o.bits is not None and o.dtype not in INTEGER_DTYPES]
    zeros = len(floats) == len(outputs) and all(not np.asarray(o.bits).any() for o in floats)
    if zeros and (references is None or all(not np.asarray(r.value).any() for r in references)):
        return compared, "every compared element is +0.0 (e.g. K = 0): nothing could differ"
    return compared, ""


def _fail(message: str, kind: str = "mismatch", error_type: str | None = None) -> Verdict:
    return Verdict(False, message, kind, error_type)


def same_outputs(a: Call, b: Call, what: str) -> Verdict:
    """Two calls that should agree bit for bit (both raising the same way also agrees); ``a``
    is the actual, ``b`` the desired. The building block of users' judges."""
    if a.raised or b.raised:
        if a.error_type == b.error_type:  # not judged: the parity and reference cells judge it
            return Verdict(
                True, compared=0, degenerate=f"not judged: both calls raised {a.error_type}"
            )
        return _fail(
            f"{what}: one call raised and the other did not, or they raised differently:\n"
            f"  first:  {a.describe_error() if a.raised else 'returned normally'}\n"
            f"  second: {b.describe_error() if b.raised else 'returned normally'}",
            "error",
            a.error_type or b.error_type,
        )
    assert a.outputs is not None and b.outputs is not None
    if len(a.outputs) != len(b.outputs):
        return _fail(f"{what}: {len(a.outputs)} outputs vs {len(b.outputs)}")
    for index, (x, y) in enumerate(zip(a.outputs, b.outputs, strict=False)):
        label = f"{what}, output {index}" if len(a.outputs) > 1 else what
        if (x.dtype, x.shape) != (y.dtype, y.shape):
            return _fail(
                f"{label}: dtype/shape {x.dtype}{list(x.shape)} vs {y.dtype}{list(y.shape)}"
            )
        assert x.bits is not None and y.bits is not None
        mismatch = compare_bits(x.bits, y.bits, x.dtype, label)
        if mismatch is not None:
            return _fail(str(mismatch))
    compared, degenerate = _judged(a.outputs)
    return Verdict(True, compared=compared, degenerate=degenerate)


def batch_invariance(obs: Observation) -> Verdict:
    """The needle's rows alone are bitwise equal to the same rows inside the batch, and every
    row of each nested window of the batch (``model.windows``, compared in the worker) to the
    same row of the whole batch: the first window that differed is judged here."""
    verdict = same_outputs(
        obs.calls["in_batch"],
        obs.calls["alone"],
        "needle rows inside the batch (actual) vs alone (desired)",
    )
    rows = obs.evidence.get("rows")
    if not verdict.ok or "window" not in obs.calls:
        extra = int(obs.evidence.get("window_elements", 0))
        if verdict.ok and extra:  # the windows compared elements the needle's comparison did not
            return replace(
                verdict, compared=(verdict.compared or 0) + extra, degenerate="", rows=rows
            )
        return replace(verdict, rows=rows)
    window = same_outputs(
        obs.calls["window_in_batch"],
        obs.calls["window"],
        f"rows inside the whole batch (actual) vs inside {obs.evidence.get('window', 'a window')}"
        " of it (desired)",
    )
    if window.ok:  # the worker saw them differ: only the same error both ways can agree here
        return replace(verdict, rows=rows)
    return replace(window, rows=rows)


def row_permutation(obs: Observation) -> Verdict:
    """The batch with its rows (sequence ops: its sequences) in a derangement, the output put
    back in order, is bitwise equal to the batch as drawn. A batch of one row (one sequence)
    cannot be permuted: degenerate, never a pass."""
    evidence = obs.evidence
    units = int(evidence.get("units", 0))
    if units < 2:
        unit = evidence.get("unit", "row")
        return Verdict(True, compared=0, degenerate=f"one {unit} in the batch: nothing to permute")
    verdict = same_outputs(
        obs.calls["permuted"],
        obs.calls["batch"],
        f"batch output with its {units} {evidence.get('unit', 'row')}s in a derangement, "
        f"un-permuted (actual) vs in the drawn order (desired); "
        f"{evidence.get('moved_rows')} of {evidence.get('rows')} rows moved",
    )
    return verdict


def logprobs(obs: Observation) -> Verdict:
    """The needle's logprob vectors alone == inside the batch, bitwise; the first mismatching
    index is (row, vocabulary id), a row one token's vector: the probe model's positions (or the
    token it decodes), the engine's prompt positions then its generated tokens (the op's notes)."""
    return same_outputs(
        obs.calls["in_batch"],
        obs.calls["alone"],
        "needle logprobs (row, vocab id) inside the batch (actual) vs alone (desired)",
    )


def explain_model(verdict: Verdict, obs: Observation, covered: tuple[str, ...]) -> Verdict:
    """Where to look when the model drifts: catalogue ops it used that the target does not claim,
    and ops outside the catalogue that can depend on the batch (not plain data movement)."""
    from .op_registry import ATEN_BENIGN, ATEN_TO_OP

    if verdict.ok:
        return verdict
    used = obs.evidence.get("ops_used", [])
    catalogue_ops = sorted({ATEN_TO_OP[o] for o in used if o in ATEN_TO_OP})
    uncovered = sorted(set(catalogue_ops) - set(covered))
    outside = [o for o in used if o.startswith("aten::") and o not in ATEN_TO_OP]
    outside = [o for o in outside if o not in ATEN_BENIGN]
    extra = []
    alone, together = obs.calls.get("alone"), obs.calls.get("in_batch")
    if alone and together and alone.outputs and together.outputs:
        a, b = alone.outputs[0].bits, together.outputs[0].bits
        if a is not None and b is not None and a.shape == b.shape and a.ndim >= 1:
            rows = (a != b).reshape(a.shape[0], -1).any(axis=1).nonzero()[0]
            if rows.size:
                extra.append(f"first diverging token: position {int(rows[0])} of the needle")
    extra += [
        f"catalogue ops the model used: {catalogue_ops or 'none'}",
        f"of which the target does not claim: {uncovered or 'none'}",
        f"other aten ops the model used (not in the catalogue): {outside or 'none'}",
    ]
    return Verdict(
        False, verdict.message + "\n" + "\n".join(extra), verdict.kind, verdict.error_type
    )


def decode(obs: Observation) -> Verdict:
    """One decode step on the KV cache gives the prefill's logprobs for that token, bitwise."""
    call = obs.calls["op"]
    if call.raised:
        return _fail(f"the model raised {call.describe_error()}", "error", call.error_type)
    assert call.outputs is not None
    prefill, step = call.outputs
    return same_outputs(
        Call(outputs=(step,)), Call(outputs=(prefill,)), "decode step (actual) vs prefill (desired)"
    )


def determinism(obs: Observation) -> Verdict:
    """The same call on the same tensors, twice, gives the same bits."""
    return same_outputs(
        obs.calls["second"], obs.calls["first"], "second run (actual) vs first run (desired)"
    )


def reference(obs: Observation) -> Verdict:
    """Against the float64 reference: bitwise where the catalogue proves exactness, else bounded."""
    call = obs.calls["op"]
    if call.raised:
        return _fail(f"the op raised {call.describe_error()}", "error", call.error_type)
    assert call.outputs is not None and obs.references is not None
    worst: tuple[float, int, float] = (-1.0, 0, 0.0)
    for index, (out, ref) in enumerate(zip(call.outputs, obs.references, strict=False)):
        label = f"output {index}" if len(call.outputs) > 1 else "output"
        if out.dtype != ref.dtype or tuple(out.shape) != tuple(ref.value.shape):
            return _fail(
                f"{label}: contract changed: got {out.dtype}{list(out.shape)}, the op's definition "
                f"gives {ref.dtype}{list(ref.value.shape)}"
            )
        how = (
            "bit-exact (exact inputs)"
            if ref.tolerance is None
            else f"within the stated bound ({ref.precision} internals)"
        )
        assert out.bits is not None
        observed, allowed = ulp_summary(out.bits, ref.value, ref.tolerance, out.dtype)
        mismatch = compare_to_reference(
            out.bits, ref.value, ref.tolerance, out.dtype, f"{label} vs float64 reference, {how}"
        )
        if mismatch is not None:
            return Verdict(
                False,
                f"{mismatch}\n{ulp_line(observed, allowed)}",
                ulps_observed=observed,
                ulps_allowed=allowed,
            )
        use = observed / allowed if allowed > 0 else float(observed > 0)
        if use > worst[0]:
            worst = (use, observed, allowed)
    compared, degenerate = _judged(call.outputs, obs.references)
    return Verdict(
        True,
        ulps_observed=worst[1],
        ulps_allowed=worst[2],
        compared=compared,
        degenerate=degenerate,
    )


def ulp_line(observed: int, allowed: float) -> str:
    """The line reports parse (reporting/ulp.py) for a reference verdict's ulps."""
    return f"ULPs at the element nearest its bound: observed {observed}, allowed {allowed:.4g}"


def event_names(name: str) -> str | None:
    """The catalogue op a profiler event names, from its name after the target's
    ``KERNEL_PREFIX``: the op whose name, or one of whose ``aten_names`` (without ``aten::``),
    it is or starts with followed by ``_`` or ``.`` (``mm``, ``mm_splitk``, ``_log_softmax``);
    the longest such name wins (``silu_and_mul`` names silu_and_mul, not silu). None: no op."""
    from .op_registry import OPS

    best: tuple[int, str | None] = (0, None)
    for spec in OPS.values():
        for own in (spec.name, *(a.split("::", 1)[-1] for a in spec.aten_names)):
            if len(own) > best[0] and (name == own or name.startswith((own + "_", own + "."))):
                best = (len(own), spec.name)
    return best[1]


UNDER_COMPILE = "under torch.compile (Inductor, dynamic shapes, the call one graph): "
"""The head of a routing verdict's message for a compiled case (``Case.mode``)."""


def routing(obs: Observation, hello: Hello, op: str) -> Verdict:
    """``_routing``, and for a compiled case routing *under compile*: the same evidence read
    from the compiled call (Inductor may lower an op itself, or call another overload than the
    one a library overrides, bypassing its kernel), its message saying so; a call that ran no
    compiled region is no evidence of compiled routing (``not_observable``)."""
    verdict = _routing(obs, hello, op)
    if obs.evidence.get("mode") != "compiled" or verdict.kind in ("not_covered",):
        return verdict
    call = obs.calls["op"]
    if verdict.ok and obs.evidence.get("compiled_regions") == 0 and not call.raised:
        return _not_observable(
            f"routing not observable {UNDER_COMPILE.rstrip(': ')}: the call ran no compiled "
            f"region (Dynamo ran it eagerly), so it shows nothing of the compiled program"
        )
    if verdict.ok or verdict.kind == "not_observable":
        return verdict
    return Verdict(False, UNDER_COMPILE + verdict.message, verdict.kind, verdict.error_type)


def _routing(obs: Observation, hello: Hello, op: str) -> Verdict:
    """Switch propagation and routing, on positive evidence. Enabled: a covered op must show at
    least one of the target's own events for the op (its ``ROUTES`` for the op, else an event
    with its ``KERNEL_PREFIX`` that names the op: ``event_names``; an event naming another op is
    no evidence for this one) or a passing identity or dispatcher check, and no failing one; no
    evidence is a failure that says what was looked for, unless the target declares the op's
    routing unobservable (``Hello.unobservable``, with its reason): then ``not_observable``.
    Disabled: none of the target's events (any with its prefix), no identity in place.
    Where nothing can be looked for, the verdict is ``not_observable`` (never a pass). Where a
    switch provider (verl) set the switch, its promises about the environment are checked first."""
    call = obs.calls["op"]
    evidence = obs.evidence
    enabled = obs.switch == "enabled"
    broken = switches.broken_promises(hello.provider, obs.switch)
    if broken:
        return _fail(switches.promise_message(hello.provider, obs.switch, broken))
    active = evidence.get("active")
    if active is not enabled:
        return _fail(
            f"switch propagation: {switches.describe(hello.provider, enabled)} but the target "
            f"reports its kernels {'active' if active else 'inactive'}"
        )
    if enabled and op not in hello.covered:
        return Verdict(True, f"{op} is not claimed by target {hello.target!r}", "not_covered")
    if "profiler_error" in evidence:
        return _not_observable(f"routing not observable: {evidence['profiler_error']}")
    prefix = hello.kernel_prefix
    expected = tuple(hello.routes.get(op, ()))
    events = call.events
    identity = evidence.get("identity", {})
    declared = hello.unobservable.get(op)
    if events is None:
        looked_for = ""
    elif expected:
        looked_for = f"one of the events {list(expected)}"
    elif prefix:
        looked_for = f"an event starting with {prefix!r} that names {op}"
    else:
        looked_for = ""
    leaks = [e for e in events or () if e in expected or (prefix and e.startswith(prefix))]
    if not looked_for and not identity:
        why = (
            f"target {hello.target!r} declares it unobservable: {declared}"
            if declared
            else f"target {hello.target!r} declares no profiler events for {op} (no ROUTES, no "
            "KERNEL_PREFIX) and gives no identity evidence"
        )
        return _not_observable(f"routing not observable: {why}")
    if enabled:
        if call.raised:
            return _fail(f"the op raised {call.describe_error()}", "error", call.error_type)
        if events is not None and expected and not any(e in events for e in expected):
            return _fail(  # declared routes are a promise of their own, whatever else is seen
                f"routing: none of {list(expected)} appeared in the profiler events; "
                f"seen: {list(events)[:40]}"
            )
        missing = [name for name, ok in identity.items() if not ok]
        if missing:
            return _fail(f"routing: identity check failed: {missing}")
        if expected:
            ours = [e for e in leaks if e in expected]
        else:
            ours = [e for e in leaks if event_names(e[len(prefix) :]) == op]
        if ours or any(identity.values()):
            return PASS
        if declared:
            return _not_observable(
                f"routing not observable: target {hello.target!r} declares it unobservable: "
                f"{declared}"
            )
        foreign = [
            f"saw {e}, which names {event_names(e[len(prefix) :]) or 'no catalogue op'}, not {op}"
            for e in leaks
            if not expected
        ]
        seen = list(events or ())
        return _fail(
            f"routing: no evidence that {op} reached target {hello.target!r}'s kernels with the "
            f"switch enabled: looked for {looked_for or 'profiler events (none declared)'} in the "
            f"profiler events of the call and found none"
            + (f" ({'; '.join(dict.fromkeys(foreign))})" if foreign else "")
            + f" (seen: {seen[:40]}); identity checks: "
            f"{'none' if not identity else dict(identity)}"
        )
    if leaks:
        return _fail(f"switch leak: with the switch disabled the call reached {leaks}")
    leaked = [name for name, ok in identity.items() if ok]
    if leaked:
        return _fail(f"switch leak: with the switch disabled these are swapped: {leaked}")
    return PASS


def _not_observable(message: str) -> Verdict:
    """Neither a pass nor a failure: the session records it and every report shows it."""
    return Verdict(False, message, "not_observable")


WIDENING = "widening"
"""Parity's verdict kind for a contract the switch widened: the switch-on kernel returns where
stock raises. Recorded, shrunk and confirmed like any failure, and reported apart as "accepts
more than stock"; it fails the run only under ``--strict-contract`` (``reporting.data``)."""


def parity(enabled: Observation, disabled: Observation) -> Verdict:
    """Switching on changes no contract: raising, exception type, dtype, shape, device. It has a
    direction: narrowing (the switch-on call raises where stock returns, raises another
    exception type, or returns another dtype, shape or device) is a failure; widening (the
    switch-on call returns where stock raises) is a verdict of kind ``widening``."""
    a, b = enabled.calls["op"], disabled.calls["op"]
    if b.raised and not a.raised:
        assert a.outputs is not None
        returned = [(o.dtype, list(o.shape), o.device) for o in a.outputs]
        return _fail(
            "contract widening (accepts more than stock): enabled returned normally "
            f"{returned}; disabled (stock) raised {b.describe_error()}",
            WIDENING,
            b.error_type,
        )
    if a.raised != b.raised or a.error_type != b.error_type:
        return _fail(
            "contract parity: enabled "
            f"{a.describe_error() if a.raised else 'returned normally'}; disabled "
            f"{b.describe_error() if b.raised else 'returned normally'}",
            "error",
            a.error_type or b.error_type,
        )
    if a.raised:
        return PASS
    assert a.outputs is not None and b.outputs is not None
    sig_a = [(o.dtype, tuple(o.shape), o.device) for o in a.outputs]
    sig_b = [(o.dtype, tuple(o.shape), o.device) for o in b.outputs]
    if sig_a != sig_b:
        return _fail(f"contract parity: enabled returns {sig_a}, disabled returns {sig_b}")
    return PASS
