"""The ``switching`` property: a two-way switch (enable/disable calls, a context manager) treated
as state, for targets whose switch can be turned off and on in one process (SGLang's and
thinking-machines' ``batch_invariant_ops`` style).

A Hypothesis ``RuleBasedStateMachine`` drives the switch: ``enable``, ``disable``, entering and
leaving ``set_batch_invariant_mode(flag)`` (nested and re-entered), and an exception raised inside
the context. The model says what state should hold after each step: a context restores, on exit
(with or without an exception), the state that held when it was entered. After every step the
invariant compares the model with the process:

- dispatcher evidence: is every aten registration the switch makes (``switch_surface``: recorded
  from ``torch.library.Library.impl`` during one enable; SGLang's mm, mm.out, addmm, _log_softmax,
  mean.dim, rms_norm, mm.dtype, bmm) still the stock kernel (``torch._C._dispatch_dump``), is
  every Python function it swaps (``torch.bmm``, anything in ``torch``, ``torch.nn.functional``,
  ``torch.Tensor``) still the stock one, and does the library's own flag agree;
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


def switch_surface(module: Any) -> tuple[dict[str, str], dict[tuple[str, str], Any]]:
    """What turning the switch on changes, from one enable between two disables: every aten
    registration (qualified name -> its stock ``_dispatch_dump``, read just before the library
    registers it) and every swapped function of ``torch``, ``torch.nn.functional`` and
    ``torch.Tensor`` ((owner, name) -> its stock value). Falls back to ``aten::mm`` when no
    registration went through ``torch.library.Library.impl``. Leaves the switch off."""
    import torch

    owners = _swap_owners()
    module.disable_batch_invariant_mode()
    before = {
        (name, attr): value for name, owner in owners.items() for attr, value in vars(owner).items()
    }
    stock: dict[str, str] = {}
    original = torch.library.Library.impl

    def impl(self, op_name, *args, **kwargs):
        name = op_name if "::" in str(op_name) else f"{self.ns}::{op_name}"
        stock.setdefault(name, torch._C._dispatch_dump(name))
        return original(self, op_name, *args, **kwargs)

    torch.library.Library.impl = impl
    try:
        module.enable_batch_invariant_mode()
    finally:
        torch.library.Library.impl = original
    swapped = {
        key: value for key, value in before.items() if vars(owners[key[0]]).get(key[1]) is not value
    }
    module.disable_batch_invariant_mode()
    if not stock:
        stock["aten::mm"] = torch._C._dispatch_dump("aten::mm")
    return stock, swapped


def _swap_owners() -> dict[str, Any]:
    import torch

    return {
        "torch": torch,
        "torch.nn.functional": torch.nn.functional,
        "torch.Tensor": torch.Tensor,
    }


def run_machine(module: Any, max_examples: int = 30, seed: int = 0) -> dict[str, Any]:
    """Run the state machine against ``module`` in this process; the verdict as a dict."""
    import torch
    from hypothesis import HealthCheck, settings
    from hypothesis import strategies as st
    from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

    stock, swapped = switch_surface(module)
    owners = _swap_owners()
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
            overridden = [n for n, dump in stock.items() if torch._C._dispatch_dump(n) != dump]
            replaced = [
                f"{o}.{a}" for (o, a), v in swapped.items() if vars(owners[o]).get(a) is not v
            ]
            registered = bool(overridden)
            flag = getattr(module, "is_batch_invariant_mode_enabled", lambda: registered)()
            expected = "on" if self.on else "off"
            key = next(iter(stock))
            if self.on:
                wrong = [n for n in stock if n not in overridden]
                wrong += [f"{o}.{a}" for o, a in swapped if f"{o}.{a}" not in replaced]
            else:
                wrong = overridden + replaced
            assert not wrong, (
                f"switch state: the model expects {expected}, but "
                + (f"{key}'s CPU kernel is " if wrong[0] == key else f"{wrong[0]} is ")
                + ("the stock one" if self.on else "a registered override")
                + (f" (and {len(wrong) - 1} more: {', '.join(wrong[1:])})" if wrong[1:] else "")
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
    # What the invariant compared: every registration and swapped function (the report shows it).
    compared = [*stock, *(f"{o}.{a}" for o, a in swapped)]
    try:
        Switching.TestCase("runTest").runTest()
    except AssertionError as exc:  # Hypothesis attaches the minimal steps as notes
        notes = [n for n in getattr(exc, "__notes__", []) if n.strip()]
        return {"ok": False, "message": "\n".join([str(exc), *notes]), "compared": compared}
    except Exception as exc:  # e.g. state that leaked past disable() makes replays differ
        return {"ok": False, "message": f"the state machine failed: {exc!r}", "compared": compared}
    return {"ok": True, "message": "", "compared": compared}


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
