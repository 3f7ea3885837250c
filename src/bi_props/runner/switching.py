"""The ``switching`` property: a two-way switch (enable/disable calls, a context manager) treated
as state, for targets whose switch can be turned off and on in one process (SGLang's and
thinking-machines' ``batch_invariant_ops`` style).

A Hypothesis ``RuleBasedStateMachine`` drives the switch: ``enable``, ``disable``, entering and
leaving ``set_batch_invariant_mode(flag)`` (nested and re-entered), and an exception raised inside
the context. The model says what state should hold after each step: a context restores, on exit
(with or without an exception), the state that held when it was entered. After every step the
invariant compares the model with the process:

- dispatcher evidence: is the CPU kernel of ``aten::mm`` still the stock one
  (``torch._C._dispatch_dump``), and does the library's own flag agree;
- a batch-invariance check of a cheap op: with the switch expected on, a needle's rows of
  ``torch.mm`` alone equal the same rows inside a batch, bitwise.

Switches are process-global, so the machine runs in a freshly spawned interpreter
(``python -m bi_props.runner.switching TARGET``), which prints one JSON verdict. One-way
targets (vLLM, vllm-ascend, bi_props' own ``cpu``) are "not applicable": one process per switch
state.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from typing import Any


def one_way(target: str) -> str:
    """Why a built-in target's switch is one-way (its class's ``Target.one_way``), else "" (a
    module target: ``load_switch`` finds out). The target's module is imported, not its stack."""
    from ..model.target import BUILTIN_TARGETS

    if target not in BUILTIN_TARGETS:
        return ""
    module, _, attr = BUILTIN_TARGETS[target].partition(":")
    return getattr(importlib.import_module(module), attr).one_way


def applicability(target: str) -> str | None:
    """None when the property applies to ``target``, else why not."""
    why = one_way(target)
    return f"not applicable: {why}" if why else None


class NotTwoWay(RuntimeError):
    """The target has no disable: its switch is one-way (the property does not apply)."""


def load_switch(target: str) -> Any:
    """The module holding the two-way switch (enable/disable, optionally the context manager
    set_batch_invariant_mode). Raises NotTwoWay when there is no disable."""
    if target == "sglang":
        from ..targets.sglang import load_module

        return load_module()
    module = importlib.import_module(target.partition(":")[0])
    for name in ("enable_batch_invariant_mode", "disable_batch_invariant_mode"):
        if not callable(getattr(module, name, None)):
            raise NotTwoWay(f"target {target!r} has no {name}(): not a two-way switch")
    return module


def run_machine(module: Any, max_examples: int = 30, seed: int = 0) -> dict[str, Any]:
    """Run the state machine against ``module`` in this process; the verdict as a dict."""
    import torch
    from hypothesis import HealthCheck, settings
    from hypothesis import strategies as st
    from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

    stock = torch._C._dispatch_dump("aten::mm")
    g = torch.Generator().manual_seed(seed)
    needle = torch.randn(3, 67, generator=g)
    batch = torch.cat([needle, torch.randn(61, 67, generator=g)])
    weight = torch.randn(67, 33, generator=g)

    has_context = callable(getattr(module, "set_batch_invariant_mode", None))

    class Boom(Exception):
        """Raised inside a context by the machine."""

    class Switching(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            module.disable_batch_invariant_mode()
            self.on = False
            self.contexts: list[tuple[Any, bool]] = []  # (context manager, state at entry)

        @rule()
        def enable(self) -> None:
            module.enable_batch_invariant_mode()
            self.on = True

        @rule()
        def disable(self) -> None:
            module.disable_batch_invariant_mode()
            self.on = False

        @precondition(lambda self: has_context and len(self.contexts) < 4)
        @rule(flag=st.booleans())
        def enter(self, flag: bool) -> None:
            manager = module.set_batch_invariant_mode(flag)
            manager.__enter__()
            self.contexts.append((manager, self.on))
            self.on = flag

        @precondition(lambda self: bool(self.contexts))
        @rule()
        def leave(self) -> None:
            manager, before = self.contexts.pop()
            manager.__exit__(None, None, None)
            self.on = before

        @precondition(lambda self: has_context)
        @rule(flag=st.booleans())
        def raise_inside(self, flag: bool) -> None:
            before = self.on
            try:
                with module.set_batch_invariant_mode(flag):
                    raise Boom()
            except Boom:
                pass
            self.on = before

        @invariant()
        def state_matches_model(self) -> None:
            registered = torch._C._dispatch_dump("aten::mm") != stock
            flag = getattr(module, "is_batch_invariant_mode_enabled", lambda: registered)()
            expected = "on" if self.on else "off"
            assert registered == self.on, (
                f"switch state: the model expects {expected}, but aten::mm's CPU kernel is "
                f"{'a registered override' if registered else 'the stock one'}"
            )
            assert bool(flag) == self.on, (
                f"switch state: the model expects {expected}, but "
                f"is_batch_invariant_mode_enabled() says {bool(flag)}"
            )
            if self.on:
                alone, inside = torch.mm(needle, weight), torch.mm(batch, weight)[:3]
                assert torch.equal(alone, inside), (
                    "switch state: expected on, but torch.mm is batch-variant (needle rows "
                    "alone vs inside a batch of 64 rows differ)"
                )

        def teardown(self) -> None:
            while self.contexts:
                manager, _ = self.contexts.pop()
                try:
                    manager.__exit__(None, None, None)
                except Exception:
                    pass
            module.disable_batch_invariant_mode()

    Switching.TestCase.settings = settings(
        max_examples=max_examples,
        stateful_step_count=8,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
        print_blob=False,
    )
    try:
        Switching.TestCase("runTest").runTest()
    except AssertionError as exc:  # Hypothesis attaches the minimal steps as notes
        notes = [n for n in getattr(exc, "__notes__", []) if n.strip()]
        return {"ok": False, "message": "\n".join([str(exc), *notes])}
    except Exception as exc:  # e.g. state that leaked past disable() makes replays differ
        return {"ok": False, "message": f"the state machine failed: {exc!r}"}
    return {"ok": True, "message": ""}


def judge(target: str, max_examples: int = 30, timeout_s: float = 900) -> dict[str, Any]:
    """The property for ``target``, run in a freshly spawned interpreter (switches are
    process-global). Returns {"ok": bool | None, "message": str}; ok None = not applicable."""
    why = applicability(target)
    if why:
        return {"ok": None, "message": why}
    proc = subprocess.run(
        [sys.executable, "-m", "bi_props.runner.switching", target, str(max_examples)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=dict(os.environ),
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode not in (0, 1) or not lines:
        return {"ok": False, "message": f"the switching worker failed:\n{proc.stderr[-3000:]}"}
    verdict = json.loads(lines[-1])
    return verdict  # ok None: not applicable (a module without disable)


SWITCHING_ENV = "BI_PROPS_SWITCHING"
# The finding's cell: the switch is no catalogue op, and the property spans both states.
FINDING_OP, FINDING_SWITCH = "(switch)", "both"


def session_verdict(target: str, max_examples: int = 15) -> dict[str, Any]:
    """What a session's report records under ``switching``: one-way targets "not applicable"
    (nothing run); two-way ones judged in a spawned interpreter, unless BI_PROPS_SWITCHING=0."""
    why = applicability(target)
    if why:
        return {"ok": None, "message": why}
    if os.environ.get(SWITCHING_ENV, "1").strip() == "0":
        return {"ok": None, "message": f"not run: {SWITCHING_ENV}=0"}
    try:
        return judge(target, max_examples)
    except subprocess.TimeoutExpired as exc:
        return {"ok": False, "message": f"the switching worker timed out after {exc.timeout} s"}


def finding_fields(target: str, verdict: dict[str, Any]) -> dict[str, Any] | None:
    """A failed verdict as the fields of a session Finding (property ``switching``)."""
    if verdict.get("ok") is not False:
        return None
    message = str(verdict.get("message", ""))
    steps = message.partition("Failing test case: ")[2].strip()
    return {
        "target": target,
        "op": FINDING_OP,
        "property": "switching",
        "switch": FINDING_SWITCH,
        "kind": "mismatch" if message.startswith("switch state:") else "error",
        "case": steps or "(no step sequence)",
        "message": message,
        "reproduced_in_fresh_process": None,
    }


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m bi_props.runner.switching TARGET [MAX_EXAMPLES]", file=sys.stderr)
        return 2
    from ..targets import triton_compat

    triton_compat.install_from_env()
    try:
        module = load_switch(argv[0])
    except NotTwoWay as exc:
        print(json.dumps({"ok": None, "message": f"not applicable: {exc}"}))
        return 0
    verdict = run_machine(module, int(argv[1]) if len(argv) > 1 else 30)
    print(json.dumps(verdict))
    return 0 if verdict["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
