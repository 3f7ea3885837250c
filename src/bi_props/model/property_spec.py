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

from ..execution import execute
from . import properties

if TYPE_CHECKING:
    from ..targets.base import Target
    from .case import Case
    from .catalogue import OpSpec
    from .observation import Observation
    from .properties import Verdict

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


BUILTIN = (
    PropertySpec(
        "routing",
        execute.observe_routing,
        properties.routing,
        "switch propagation and routing: enabled, each covered entry point shows positive "
        "evidence of reaching the target's kernels; disabled, none does",
        needs_hello=True,
    ),
    PropertySpec(
        "reference",
        execute.observe_reference,
        properties.reference,
        "agreement with the float64 CPU reference: bit-exact on exact inputs, else within the "
        "stated bound for the target's declared internal precision",
        values=("exact", "general", "wide"),
    ),
    PropertySpec(
        "batch_invariance",
        execute.observe_batch_invariance,
        properties.batch_invariance,
        "the needle's rows alone == the same rows inside a batch of N samples at any position, "
        "bitwise",
        control=True,
        values=("general", "wide", "exact"),
        batched=True,
        reports_unclaimed=True,
    ),
    PropertySpec(
        "determinism",
        execute.observe_determinism,
        properties.determinism,
        "the same call on the same (batched) tensors twice gives the same bits",
        values=("general", "wide", "special"),
        batched=True,
    ),
    PropertySpec(
        "parity",
        execute.observe_parity,
        properties.parity,
        "switching on changes nothing of the contract: raises or not, exception type, output "
        "dtype, shape, device",
        switches=BOTH,
        values=("general", "exact", "special"),
    ),
    PropertySpec(
        "logprobs",
        execute.observe_logprobs,
        properties.logprobs,
        "model level: the probe model's per-token logprobs of a needle alone == inside a batch, "
        "bitwise",
        control=True,
        batched=True,
        explain=properties.explain_model,
        inference_promise=True,
        reports_unclaimed=True,
    ),
    PropertySpec(
        "decode",
        execute.observe_decode,
        properties.decode,
        "model level: one decode step on the KV cache gives the prefill's logprobs, bitwise",
        control=True,
        inference_promise=True,
    ),
)

PROPERTIES: dict[str, PropertySpec] = {spec.name: spec for spec in BUILTIN}
"""Every property this process knows, by name, in registration order (built-in ones first)."""
BUILTIN_PROPERTIES = tuple(PROPERTIES)
_ORIGINS: dict[str, str] = {}


def _origin(spec: PropertySpec) -> str:
    if spec.name in BUILTIN_PROPERTIES:
        return "built into bi_props (bi_props.model.property_spec)"
    return _ORIGINS.get(spec.name, "registered earlier")


def _module(spec: PropertySpec) -> str:
    return repr(getattr(spec.observer, "__module__", None) or "an unknown module")


def register_property(spec: PropertySpec) -> PropertySpec:
    """Add a user's property to ``PROPERTIES`` of this process; returns the registered spec.

    Registering the identical spec again is a no-op. Another spec under a taken name, or a spec
    missing what running it needs, raises one ``ValueError`` saying what, where and how to fix
    it. A target module's ``EXTRA_PROPERTIES`` are registered this way in the controller and in
    every worker (before its ``EXTRA_OPS``, which may list them); a property registered by hand
    must be registered in the workers too (put it in a target's ``EXTRA_PROPERTIES``)."""
    if not isinstance(spec, PropertySpec):
        raise TypeError(
            f"register_property needs a bi_props.PropertySpec, got {type(spec).__name__}"
        )
    existing = PROPERTIES.get(spec.name)
    if existing is not None:
        if existing is spec or existing == spec:
            return existing
        raise ValueError(
            f"register_property: property name {spec.name!r} is taken: {_origin(existing)} "
            f"defines a different spec under it (this one comes from {_module(spec)}). Rename "
            f"yours (PropertySpec(name=...)) or register the same PropertySpec object (import "
            f"it instead of redefining it)"
        )
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
    if problems:
        raise ValueError(
            f"register_property: PropertySpec {spec.name!r} (from {_module(spec)}) cannot be "
            f"registered: {'; '.join(problems)}. See bi_props.PropertySpec's docstring and "
            f"docs/properties.md"
        )
    PROPERTIES[spec.name] = spec
    _ORIGINS[spec.name] = f"module {_module(spec)}"
    return spec


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
    return tuple(p for p in PROPERTIES if p not in BUILTIN_PROPERTIES)


def properties_of(op: OpSpec) -> tuple[str, ...]:
    """The properties checked on ``op``: its ``OpSpec.properties`` (in order), then the
    registered properties that select it through their ``ops``."""
    own = tuple(op.properties)
    extra = tuple(s.name for s in PROPERTIES.values() if s.ops is not None and s.name not in own)
    return own + tuple(p for p in extra if PROPERTIES[p].applies_to(op))


def unknown_ops(spec: PropertySpec, known: Any) -> list[str]:
    """The op names a spec's ``ops`` tuple gives that ``known`` lacks (a typo applies to none)."""
    if not isinstance(spec.ops, tuple):
        return []
    return [op for op in spec.ops if op not in known]


__all__ = [
    "BOTH",
    "PROPERTIES",
    "PropertySpec",
    "get",
    "properties_of",
    "register_property",
    "registered_properties",
]
