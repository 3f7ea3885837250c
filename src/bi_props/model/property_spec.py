"""Properties as records: ``PropertySpec`` and ``register_property``, the built-in ones included.

A property is an observer that runs in the worker (``(case, target) -> dict`` of Observation
fields: ``calls``, and optionally ``evidence`` and ``references``), a judge that runs in the
controller (``(observation) -> Verdict``), and a little data: whether its disabled state is a
negative control, which switch states it runs in, which ops it applies to, which value classes
and whether a batch of companions its cases draw. The strategies, the workers, the session, the
cells of the suite and of ``bi-props fuzz`` all read ``PROPERTIES`` here, so a user's property is
added by registering one record (a target module's ``EXTRA_PROPERTIES``), without editing bi_props.

Importing this module imports neither torch nor Hypothesis (the worker and the controller both
use it): the observers import torch when they run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .registry import Registry

if TYPE_CHECKING:
    from .case import Case
    from .observation import Observation
    from .opspec import OpSpec
    from .target import Target
    from .verdict import Verdict

SWITCH_STATES = ("enabled", "disabled")
BOTH = ("both",)
"""``switches=BOTH``: one cell that observes the case in both states and judges the pair."""
VALUE_CLASSES = ("exact", "general", "wide", "special")


@dataclass(frozen=True)
class PropertySpec:
    """One property: what the worker observes, how the controller judges it, and where it runs.

    Required:

    - ``name``: stable name (reports, known-failure files, ``OpSpec.properties``); a Python
      identifier;
    - ``observer(case, target) -> dict``: runs in the worker (import torch inside it); returns
      the fields of an ``Observation``: ``calls`` (``{name: Call}``, see ``bi_props.run_op``),
      optionally ``evidence`` (a dict of plain data) and ``references``. It must not import
      Hypothesis or pytest. An exception here is bi_props' (an internal error): the op's own
      exceptions are part of what ``run_op`` observes;
    - ``judge(observation) -> Verdict``: runs in the controller, numpy only
      (``bi_props.same_outputs`` compares two calls bit for bit);
    - ``description``: what holds, in words (reports and docs quote it).

    Optional:

    - ``control``: with the switch off the property is a negative control (searched to show
      that the search can see a violation: never a failure) instead of a cell;
    - ``switches``: the states it runs in, ``("enabled", "disabled")`` by default; ``BOTH``
      (``("both",)``) makes one cell whose judge gets ``(enabled_observation,
      disabled_observation)`` (parity);
    - ``ops``: which ops it applies to: ``None`` (the default) the ops whose
      ``OpSpec.properties`` list it; a tuple of op names; or a predicate ``(OpSpec) -> bool``
      (``lambda spec: True``: every op);
    - ``values``: the value classes its cases draw, simplest first (Hypothesis shrinks toward
      the first); those the space allows are kept, else "general";
    - ``batched``: its cases carry a batch of companions (``case.batch``) around the needle;
    - hooks for what is truly special: ``needs_hello`` (the judge is ``(observation, hello,
      op)``: routing reads the worker's hello), ``explain(verdict, observation, covered)`` (adds
      context to a failing verdict: logprobs names the ops the model used),
      ``inference_promise`` (judged whatever ops a target claims when its switch promises
      batch-invariant inference), ``reports_unclaimed`` (for an op the target does not claim,
      the enabled result answers "is it batch-variant with the switch on?").

    A spec never crosses a process boundary: every process that needs it registers it itself (a
    target module's ``EXTRA_PROPERTIES`` are registered in the controller and in every worker),
    so lambdas and closures are fine.
    """

    name: str
    observer: Callable[[Case, Target], dict[str, Any]]
    judge: Callable[..., Verdict]
    description: str = ""
    control: bool = False
    switches: tuple[str, ...] = SWITCH_STATES
    ops: tuple[str, ...] | Callable[[OpSpec], bool] | None = None
    values: tuple[str, ...] = ("general",)
    batched: bool = False
    needs_hello: bool = False
    explain: Callable[[Verdict, Observation, tuple[str, ...]], Verdict] | None = None
    inference_promise: bool = False
    reports_unclaimed: bool = False

    @property
    def both_states(self) -> bool:
        return tuple(self.switches) == BOTH

    def applies_to(self, op: OpSpec) -> bool:
        """Whether this property is checked on ``op`` (see ``ops``)."""
        if self.ops is None:
            return self.name in op.properties
        if callable(self.ops):
            return bool(self.ops(op))
        return op.name in self.ops


def _module(spec: PropertySpec) -> str:
    return repr(getattr(spec.observer, "__module__", None) or "an unknown module")


def _check(spec: PropertySpec) -> list[str]:
    problems = []
    if not isinstance(spec.name, str) or not spec.name.isidentifier():
        problems.append(f"name {spec.name!r} must be a Python identifier")
    if not callable(spec.observer):
        problems.append("observer(case, target) -> dict is missing (it runs in the worker)")
    if not callable(spec.judge):
        problems.append("judge(observation) -> Verdict is missing (it runs in the controller)")
    switches = tuple(spec.switches) if isinstance(spec.switches, (tuple, list)) else ()
    if switches != BOTH and (not switches or not set(switches) <= set(SWITCH_STATES)):
        problems.append(
            f"switches {spec.switches!r} must be states from {list(SWITCH_STATES)} or ('both',)"
        )
    if spec.control and ("disabled" not in switches or spec.needs_hello):
        problems.append(
            "a control property (control=True) is searched with the switch off and judged from "
            "that observation alone: switches must include 'disabled', needs_hello must be False"
        )
    bad_values = [v for v in spec.values if v not in VALUE_CLASSES] if spec.values else ["none"]
    if bad_values:
        problems.append(f"values {bad_values} are unknown; choose from {list(VALUE_CLASSES)}")
    ops = spec.ops
    if not (ops is None or callable(ops) or (isinstance(ops, tuple) and all(map(_is_str, ops)))):
        problems.append("ops must be None, a tuple of op names or a predicate (OpSpec) -> bool")
    return problems


PROPERTIES: Registry[PropertySpec] = Registry(
    "property",
    PropertySpec,
    _check,
    _module,
    fix="PropertySpec(name=...)",
    docs="docs/properties.md",
)
"""Every property this process knows, by name, in registration order (the built-in ones, in
``bi_props.catalogue.properties``, first)."""
_ORIGINS = PROPERTIES.origins


def register_property(spec: PropertySpec) -> PropertySpec:
    """Add a user's property to ``PROPERTIES`` of this process; returns the registered spec.

    Registering the identical spec again is a no-op. Another spec under a taken name, or a spec
    missing what running it needs, raises one ``ValueError`` saying what, where and how to fix
    it. A target module's ``EXTRA_PROPERTIES`` are registered this way in the controller and in
    every worker (before its ``EXTRA_OPS``, which may list them); a property registered by hand
    must be registered in the workers too (put it in a target's ``EXTRA_PROPERTIES``)."""
    return PROPERTIES.register(spec)


def _is_str(value: Any) -> bool:
    return isinstance(value, str)


def get(name: str) -> PropertySpec:
    """The property called ``name``; an unknown one is one KeyError naming the known ones."""
    try:
        return PROPERTIES[name]
    except KeyError:
        raise KeyError(
            f"unknown property {name!r}; known: {', '.join(PROPERTIES)} (a property of your own: "
            f"declare it in a target module's EXTRA_PROPERTIES, see docs/properties.md)"
        ) from None


def registered_properties() -> tuple[str, ...]:
    """The properties registered beyond the built-in ones, in registration order."""
    return PROPERTIES.registered()


def properties_of(op: OpSpec) -> tuple[str, ...]:
    """The properties checked on ``op``: its ``OpSpec.properties`` (in order), then the
    registered properties that select it through their ``ops``."""
    own = tuple(op.properties)
    extra = tuple(s.name for s in PROPERTIES.values() if s.ops is not None and s.name not in own)
    return own + tuple(p for p in extra if PROPERTIES[p].applies_to(op))


def controls_of(op: OpSpec) -> tuple[str, ...]:
    """The properties whose disabled state is a negative control for ``op`` (none where stock
    kernels cannot be batch-variant: ``OpSpec.negative_control``)."""
    if not op.negative_control:
        return ()
    return tuple(p for p in properties_of(op) if PROPERTIES[p].control)


def unknown_ops(spec: PropertySpec, known: Any) -> list[str]:
    """The op names a spec's ``ops`` tuple gives that ``known`` lacks (a typo applies to none)."""
    if not isinstance(spec.ops, tuple):
        return []
    return [op for op in spec.ops if op not in known]


__all__ = [
    "BOTH",
    "PROPERTIES",
    "PropertySpec",
    "controls_of",
    "get",
    "properties_of",
    "register_property",
    "registered_properties",
]


def __getattr__(name: str) -> Any:
    if name == "BUILTIN_PROPERTIES":  # the built-in names, once the provider has installed them
        PROPERTIES._ensure()
        return PROPERTIES.builtin
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
