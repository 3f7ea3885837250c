"""Standalone reproducers: one Python file per finding, for an upstream issue.

A reproducer needs only torch and the target's own packages: no bi_props, no Hypothesis. It holds
the exact failing tensors (their bytes, zlib + base64, so nothing depends on a generator), turns
the switch on the way the target does, runs the experiment of the property (alone vs in the batch,
twice, against the embedded reference, enabled vs disabled), prints what differs (index, values, bit
patterns, ULP distance) and exits 1 when the bug reproduces, 0 when it does not, 2 when something
else went wrong. The experiment runs in a child interpreter, so a crash or a hang is observed, not
suffered.
"""

from __future__ import annotations

import base64
import textwrap
import zlib
from pathlib import Path
from typing import Any

from ..model.case import Case

# -- the op call, as source text ----------------------------------------------------------------
# Each op's spec (catalogue.OpSpec.repro_call) gives one expression over `args` (the tensors,
# layouts applied), `lengths` (rows per sample) and the case's options; tests check it against
# catalogue.OPS[op].call bit for bit.


def call_source(case: Case) -> tuple[str, str]:
    """(definitions, expression) computing the op's output(s) from ``args`` and ``lengths``."""
    from ..catalogue import OPS

    spec = OPS.get(case.op)
    if spec is None or spec.repro_call is None:
        raise NotImplementedError(
            f"no standalone reproducer for op {case.op!r} yet: re-run the case with bi_props "
            f"instead"
        )
    return spec.repro_call(case)


# -- the script ---------------------------------------------------------------------------------

_HELPERS = r'''
def tensor(blob, dtype, shape):
    """Exact bytes of a logical tensor (values as the failing run had them)."""
    raw = bytearray(zlib.decompress(base64.b64decode(blob)))
    if not raw:  # an empty tensor (frombuffer refuses empty buffers)
        return torch.empty(shape, dtype=getattr(torch, dtype))
    if dtype == "int64":
        return torch.frombuffer(raw, dtype=torch.int64).reshape(shape).clone()
    flat = torch.frombuffer(raw, dtype=torch.uint8).view(getattr(torch, dtype))
    return flat.reshape(shape).clone()


def layout(t, name):
    """The same logical tensor with the strides of the failing run."""
    if name == "contiguous" or t.dim() == 0:
        return t.contiguous()
    if name == "transposed" and t.dim() >= 2:
        return t.transpose(-1, -2).contiguous().transpose(-1, -2)
    if name == "offset":
        flat = torch.empty(t.numel() + 3, dtype=t.dtype)
        view = flat[3:].view(t.shape)
        view.copy_(t)
        return view
    wide = torch.zeros((*t.shape[:-1], 2 * t.shape[-1]), dtype=t.dtype)
    view = wide[..., ::2]
    view.copy_(t)
    return view


INT = {torch.float64: torch.int64, torch.float32: torch.int32, torch.bfloat16: torch.int16,
       torch.float16: torch.int16, torch.int64: torch.int64}  # int64: an index output


def ordered(t):
    """Bit patterns as integers in the order of the floats (for ULP distances); an integer
    output (an index) is its own order."""
    if not t.is_floating_point():
        return t.to(torch.int64)
    b = t.contiguous().view(INT[t.dtype]).to(torch.int64)
    width = t.element_size() * 8
    if width < 64:
        b = b & ((1 << width) - 1)
        sign = 1 << (width - 1)
        return torch.where(b >= sign, -(b - sign), b)
    return torch.where(b < 0, -(b & ((1 << 63) - 1)), b)


def differ(actual, desired, what):
    """numpy.testing-style report of bitwise differences; True when any bit differs."""
    if actual.dtype != desired.dtype or actual.shape != desired.shape:
        print(f"{what}: {actual.dtype}{list(actual.shape)} vs {desired.dtype}{list(desired.shape)}")
        return True
    a, d = ordered(actual), ordered(desired)
    bad = a != d
    if not bad.any():
        print(f"{what}: bitwise equal ({actual.numel()} elements)")
        return False
    first = tuple(int(i) for i in bad.nonzero()[0])
    width = actual.element_size() * 2
    mask = (1 << (width * 4)) - 1
    print(f"{what}: mismatched elements {int(bad.sum())} / {bad.numel()}")
    print(f"  first at index {first}: actual {float(actual[first])!r} "
          f"(0x{int(actual.contiguous().view(INT[actual.dtype])[first]) & mask:0{width}x}) vs "
          f"desired {float(desired[first])!r} "
          f"(0x{int(desired.contiguous().view(INT[desired.dtype])[first]) & mask:0{width}x})")
    diff = (actual.double() - desired.double()).abs()[bad]
    print(f"  max abs difference {float(diff.max()):.6g}, max ULP {int((a - d).abs()[bad].max())}")
    return True


def outside(actual, value, tolerance, what):
    """True when `actual` leaves the stated bound around the float64 reference."""
    got = actual.double()
    if tolerance is None:
        return differ(actual, value.to(actual.dtype), what + " (bit-exact reference)")
    ok = ((got - value).abs() <= tolerance) | (got.isnan() & value.isnan())
    ok |= got.isinf() & value.isinf() & (got.sign() == value.sign())
    if bool(ok.all()):
        print(f"{what}: within the stated bound")
        return False
    first = tuple(int(i) for i in (~ok).nonzero()[0])
    print(f"{what}: {int((~ok).sum())} / {ok.numel()} elements outside the bound; first at "
          f"{first}: actual {float(got[first])!r} vs reference {float(value[first])!r} "
          f"(allowed error {float(tolerance[first]):.6g})")
    return True
'''


_COMPILED = """
# The finding's case is compiled (Case.mode): the op's call through torch.compile, as bi_props
# compiled it (execution/compiled.py: Inductor, dynamic shapes, the whole call one graph).
import torch._dynamo.config  # noqa: E402

torch._dynamo.config.recompile_limit = 4096
op = torch.compile(op, backend="inductor", dynamic=True, fullgraph=True)
"""
"""A compiled case's reproducer compiles the op's call the way bi_props did; the padded cut
(below) stays outside the graph, as in bi_props."""

_PADDED = '''
_padded_op = op


def op(args, lengths):
    """A padded batch (samples, padded length, ...): each sample's real rows, packed."""
    outs = _padded_op(args, lengths)
    outs = tuple(outs) if isinstance(outs, (tuple, list)) else (outs,)
    return tuple(torch.cat([o[i, :n] for i, n in enumerate(lengths)]) for o in outs)
'''
"""A padded case's reproducer cuts each output back to the samples' real rows, as bi_props
did (``materialize.unpad``); the tensors it embeds are the padded ones, poison included."""


def _blob(data: bytes) -> str:
    return base64.b64encode(zlib.compress(data, 9)).decode("ascii")


def _tensors_source(group: dict[str, Any], layouts: tuple[str, ...]) -> str:
    lines = []
    for i, t in enumerate(group["tensors"]):
        wrapped = _wrapped_literal(_blob(t["bytes"]), "        ")
        name = layouts[i] if i < len(layouts) and t["dtype"] != "int64" else "contiguous"
        lines.append(
            f"    layout(tensor(\n{wrapped},\n        {t['dtype']!r}, {tuple(t['shape'])!r}),"
            f" {name!r}),"
        )
    return "[\n" + "\n".join(lines) + "\n]"


def _experiment(prop: str, case: Case, exported: dict[str, Any]) -> str:
    """The child's body: returns True when the property is violated."""
    groups = exported["groups"]
    alone = _tensors_source(groups["alone"], case.layouts)
    lines = [f"ALONE = {alone}", f"ALONE_LENGTHS = {groups['alone']['lengths']!r}"]
    if "batch" in groups:
        lines += [
            f"BATCH = {_tensors_source(groups['batch'], case.layouts)}",
            f"BATCH_LENGTHS = {groups['batch']['lengths']!r}",
        ]
    if prop in ("batch_invariance", "logprobs"):
        rows, offset = exported.get("rows", case.shape[0]), exported["offset"]
        axes = exported["output_batch_axes"]
        window = groups.get("window")
        if window is not None:  # the first window of the batch whose rows differed
            lines += [
                f"WINDOW = {_tensors_source(window, case.layouts)}  # {window['label']}",
                f"WINDOW_LENGTHS = {window['lengths']!r}",
                f"PAIRS = {window['pairs']!r}  # (offset in WINDOW's output, in BATCH's, rows)",
                f"WINDOW_LABEL = {window['label']!r}",
            ]
        lines.append(
            textwrap.dedent(f"""
            def gather(t, axis, spans):
                return torch.cat([t.narrow(axis, at, n) for at, n in spans], dim=axis)


            def violated():
                alone = outputs(op(ALONE, ALONE_LENGTHS))
                batch = outputs(op(BATCH, BATCH_LENGTHS))
                bad = False
                for i, (a, b, axis) in enumerate(zip(alone, batch, {axes!r})):
                    rows = b.narrow(axis, {offset}, {rows})
                    bad |= differ(rows, a, f"output {{i}}: needle rows in a batch of "
                                  f"{{len(BATCH_LENGTHS)}} (actual) vs alone (desired)")
                if "WINDOW" in globals():
                    window = outputs(op(WINDOW, WINDOW_LENGTHS))
                    for i, (w, b, axis) in enumerate(zip(window, batch, {axes!r})):
                        inside = gather(b, axis, [(at, n) for _, at, n in PAIRS])
                        mine = gather(w, axis, [(at, n) for at, _, n in PAIRS])
                        bad |= differ(inside, mine, f"output {{i}}: rows inside the batch "
                                      f"(actual) vs inside {{WINDOW_LABEL}} (desired)")
                return bad
            """)
        )
    elif prop == "row_permutation":
        axes = exported["output_batch_axes"]
        permuted = groups["permuted"]
        lines += [
            f"PERMUTED = {_tensors_source(permuted, case.layouts)}",
            f"PERMUTED_LENGTHS = {permuted['lengths']!r}",
            f"UNPERMUTE = {exported['unpermute']!r}  # where each output row of BATCH lies",
        ]
        lines.append(
            textwrap.dedent(f"""
            def violated():
                batch = outputs(op(BATCH, BATCH_LENGTHS))
                permuted = outputs(op(PERMUTED, PERMUTED_LENGTHS))
                bad = False
                for i, (b, p, axis) in enumerate(zip(batch, permuted, {axes!r})):
                    back = p.index_select(axis, torch.tensor(UNPERMUTE, dtype=torch.int64))
                    bad |= differ(back, b, f"output {{i}}: the batch with its rows permuted, "
                                  f"un-permuted (actual) vs in its drawn order (desired)")
                return bad
            """)
        )
    elif prop == "determinism":
        lines.append(
            textwrap.dedent("""
            def violated():
                first = outputs(op(BATCH, BATCH_LENGTHS))
                second = outputs(op(BATCH, BATCH_LENGTHS))
                return any(differ(b, a, f"output {i}: second run (actual) vs first (desired)")
                           for i, (a, b) in enumerate(zip(first, second)))
            """)
        )
    elif prop == "reference":
        refs = []
        for r in exported["references"]:
            tol = "None" if r["tolerance"] is None else _float64_source(r["tolerance"], r["shape"])
            refs.append(f"    ({_float64_source(r['value'], r['shape'])},\n     {tol}),")
        lines.append("REFERENCES = [  # (float64 reference, allowed error or None: bit-exact)")
        lines += refs
        lines.append("]")
        lines.append(
            textwrap.dedent("""
            def violated():
                outs = outputs(op(ALONE, ALONE_LENGTHS))
                return any(outside(o, v, t, f"output {i} vs the float64 reference")
                           for i, (o, (v, t)) in enumerate(zip(outs, REFERENCES)))
            """)
        )
    elif prop in ("parity", "routing"):
        lines.append(
            textwrap.dedent("""
            def contract():
                try:
                    with torch.autograd.profiler.profile(use_kineto=False) as prof:
                        outs = outputs(op(ALONE, ALONE_LENGTHS))
                except Exception as exc:
                    return {"raised": type(exc).__name__, "message": str(exc)[:300], "events": []}
                events = sorted({e.name for e in prof.function_events})
                return {"outputs": [[str(o.dtype), list(o.shape), str(o.device)] for o in outs],
                        "events": events}
            """)
        )
    else:
        raise NotImplementedError(f"no standalone reproducer for property {prop!r} yet")
    return "\n".join(lines)


def _wrapped_literal(text: str, indent: str, width: int = 88) -> str:
    """A long ASCII string as adjacent literals, one per line (Python joins them)."""
    chunks = [text[i : i + width] for i in range(0, len(text), width)] or [""]
    return "\n".join(f"{indent}{chunk!r}" for chunk in chunks)


def _float64_source(data: bytes, shape: list[int]) -> str:
    literal = _wrapped_literal(_blob(data), "        ")
    return f"tensor(\n{literal},\n        'float64', {tuple(shape)!r})"


_MAIN = r'''
def outputs(result):
    return tuple(result) if isinstance(result, (tuple, list)) else (result,)


def child(switch):
    """Runs in a fresh interpreter: set the switch before importing the target, then experiment."""
    os.environ["VLLM_BATCH_INVARIANT"] = "1" if switch == "enabled" else "0"
    SETUP[switch]()
    if hasattr(signal, "setitimer"):  # the example's own clock, started once the imports are done:
        signal.setitimer(signal.ITIMER_REAL, TIMEOUT_S)  # SIGALRM's default action ends a hang
    try:
        return experiment(switch)
    finally:  # the example is over: the interpreter's exit (slow on a loaded machine) is not it
        if hasattr(signal, "setitimer"):
            signal.setitimer(signal.ITIMER_REAL, 0)


def experiment(switch):
    if PROPERTY in ("parity", "routing"):
        print("CONTRACT " + json.dumps(contract()))
        return 0
    try:
        return 1 if violated() else 0
    except Exception as exc:  # the op raised: the finding itself when its kind is "error"
        print(f"[{switch}] the op raised {type(exc).__name__}: {exc}")
        return 1 if KIND == "error" else 2


def parent():
    """Run the experiment in child interpreters, so that a crash or a hang is an observation."""
    def run(switch):
        try:
            done = subprocess.run([sys.executable, __file__, "--child", switch],
                                  capture_output=True, text=True,
                                  timeout=START_TIMEOUT_S + TIMEOUT_S)
        except subprocess.TimeoutExpired:
            print(f"[{switch}] no answer within {START_TIMEOUT_S + TIMEOUT_S} s: hang")
            return "timeout", None
        sys.stdout.write(done.stdout)
        if done.returncode == -getattr(signal, "SIGALRM", 0):
            print(f"[{switch}] the example ran past {TIMEOUT_S} s: hang")
            return "timeout", None
        if done.returncode < 0:
            print(f"[{switch}] the process died: signal {-done.returncode}")
            print(done.stderr[-2000:])
            return "crash", None
        if done.returncode not in (0, 1):
            print(done.stderr[-4000:])
            return "error", None
        contract = [json.loads(line[9:]) for line in done.stdout.splitlines()
                    if line.startswith("CONTRACT ")]
        return ("violated" if done.returncode == 1 else "held"), (contract or [None])[0]

    if PROPERTY == "parity":
        (a, ca), (b, cb) = run("enabled"), run("disabled")
        if "crash" in (a, b) or "timeout" in (a, b):
            return 1 if KIND in ("crash", "timeout") else 2
        strip = lambda c: {k: v for k, v in c.items() if k in ("raised", "outputs")}
        print(f"enabled:  {strip(ca)}\ndisabled: {strip(cb)}")
        return 1 if strip(ca) != strip(cb) else 0
    outcome, contract = run(SWITCH)
    if outcome in ("crash", "timeout"):
        return 1 if KIND in ("crash", "timeout") else 2
    if outcome == "error":
        return 2
    if PROPERTY == "routing":
        reached = [e for e in contract.get("events", []) if KERNEL_PREFIX and
                   e.startswith(KERNEL_PREFIX)]
        print(f"[{SWITCH}] kernels reached: {reached or 'none'}")
        if contract.get("raised"):
            print(f"[{SWITCH}] raised {contract['raised']}: {contract['message']}")
            return 1
        return 1 if (bool(reached) != (SWITCH == "enabled")) else 0
    return 1 if outcome == "violated" else 0


if __name__ == "__main__":
    if "--child" in sys.argv:
        sys.exit(child(sys.argv[sys.argv.index("--child") + 1]))
    status = parent()
    print({0: "does NOT reproduce", 1: "REPRODUCES", 2: "error (see above)"}[status])
    sys.exit(status)
'''


def script(
    finding: dict[str, Any],
    case: Case,
    exported: dict[str, Any],
    setup: dict[str, str],
    kernel_prefix: str = "",
    environment: dict[str, str] | None = None,
    timeout_s: float = 120.0,
    start_timeout_s: float = 300.0,
) -> str:
    """The text of a standalone reproducer for one finding. ``timeout_s`` bounds the example
    itself (a child's own timer, started after its imports); ``start_timeout_s`` more bounds the
    child's start, so a slow import on a loaded machine is not called a hang."""
    prop, switch = finding["property"], finding["switch"]
    definitions, expression = call_source(case)
    first_lines = "\n".join(finding.get("message", "").splitlines()[:6])
    env = ", ".join(f"{k} {v}" for k, v in (environment or {}).items())

    def setup_function(state: str) -> str:
        # "pass" last: a setup that is only a comment (the cpu target's switch-off) still compiles
        body = textwrap.indent(f"{setup.get(state, '') or ''}\npass", "    ")
        return f"def setup_{state}():\n{body}\n"

    title = (
        f"Reproducer: target {finding.get('target')!r}, op {case.op!r}, property {prop!r} "
        f"[{switch}], {finding.get('kind')}."
    )
    return f'''#!/usr/bin/env python3
"""{title}

{textwrap.indent(first_lines, "    ").strip()}

Case: {case!r}
Found with: {env or "(environment not recorded)"}
Needs torch and the target's own packages only (not bi_props, not Hypothesis).
Exit status: 1 the bug reproduces, 0 it does not, 2 something else went wrong.
Generated by bi_props.
"""

import base64
import json
import os
import signal
import subprocess
import sys
import zlib

import torch
import torch.nn.functional as F

PROPERTY = {prop!r}
SWITCH = {"enabled" if switch == "both" else switch!r}
KIND = {finding.get("kind")!r}
KERNEL_PREFIX = {kernel_prefix!r}
TIMEOUT_S = {timeout_s!r}  # the example, in the child once it has imported everything
START_TIMEOUT_S = {start_timeout_s!r}  # the child's interpreter start and imports
{_HELPERS}
{definitions}

def op(args, lengths):
    return {expression}
{_COMPILED if case.mode == "compiled" else ""}{_PADDED if exported.get("padded") else ""}

{setup_function("enabled")}

{setup_function("disabled")}

SETUP = {{"enabled": setup_enabled, "disabled": setup_disabled}}

{_experiment(prop, case, exported)}
{_MAIN}'''


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path
