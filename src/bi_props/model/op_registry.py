"""The ops by name: ``OPS`` (a ``Registry`` of ``OpSpec``), ``register_op``, the aten maps and the
suite's matrix (``cells``, ``controls``: each op's properties in each switch state).

The built-in ops are data in ``bi_props.catalogue`` (loaded on the first read); users' ops are the
same record, registered here. Importing this module imports neither torch nor Hypothesis.
"""

from __future__ import annotations

from collections.abc import MutableMapping, Sequence

from .case import Case
from .opspec import OpSpec
from .property_spec import PROPERTIES, controls_of, properties_of
from .registry import Registry, _Lazy


class _AtenMap(_Lazy):
    """``ATEN_TO_OP``: the aten ops (as the profiler names them) through which the ops are
    reached (each spec's ``aten_names``; ``register_op`` adds a user op's)."""


ATEN_TO_OP: MutableMapping[str, str] = _AtenMap()

ATEN_BENIGN = (
    "aten::add",
    "aten::sub",
    "aten::mul",
    "aten::div",
    "aten::cat",
    "aten::index",
    "aten::embedding",
    "aten::reshape",
    "aten::view",
    "aten::slice",
    "aten::select",
    "aten::zeros",
    "aten::zeros_like",
    "aten::empty",
    "aten::to",
    "aten::_to_copy",
    "aten::copy_",
    "aten::as_strided",
    "aten::t",
    "aten::transpose",
    "aten::expand",
    "aten::contiguous",
    "aten::clone",
    "aten::chunk",
    "aten::split",
    "aten::unsqueeze",
    "aten::squeeze",
    "aten::repeat_interleave",
    "aten::lift_fresh",
    "aten::detach",
    "aten::fill_",
    "aten::zero_",
    "aten::resolve_conj",
    "aten::_unsafe_view",
    "aten::empty_like",
    "aten::empty_strided",
    "aten::scalar_tensor",
    "aten::item",
    "aten::neg",
)
"""Data movement and exactly rounded elementwise ops: they cannot make a row depend on the batch."""


def _op_module(spec: OpSpec) -> str:
    return repr(spec.call.__module__)


def _check_op(spec: OpSpec) -> list[str]:
    problems = []
    if not isinstance(spec.name, str) or not spec.name.strip() or "|" in spec.name:
        problems.append(f"name {spec.name!r} must be a non-empty string without '|'")
    if not spec.entries or not all(isinstance(e, str) for e in spec.entries):
        problems.append("entries must be a non-empty tuple of entry-point names")
    if not callable(spec.draw_shape):
        problems.append("draw_shape(draw, ctx) -> (shape, options) is missing")
    unknown = [p for p in spec.properties if p not in PROPERTIES]
    if unknown:
        problems.append(
            f"properties {unknown} are unknown; choose from {list(PROPERTIES)} (a property of "
            f"your own: register it first, e.g. in the target's EXTRA_PROPERTIES)"
        )
    problems += control_example_problems(spec)
    claimed = {
        a: ATEN_TO_OP[a] for a in spec.aten_names if ATEN_TO_OP.get(a, spec.name) != spec.name
    }
    if claimed:
        problems.append(
            f"aten_names {sorted(claimed)} already map to {sorted(set(claimed.values()))}"
        )
    return problems


def control_example_problems(spec: OpSpec) -> list[str]:
    """An explicit control example that names layouts must name one per operand of its case
    (the names themselves are checked by ``ControlExample``): found when the op is registered,
    not when a campaign's control first runs it."""
    problems = []
    for i, example in enumerate(spec.control_examples):
        if not example.layouts:
            continue
        shape, options = tuple(example.shape), dict(example.options)
        probe = Case(spec.name, spec.entries[0], "float32", shape, (), "general", 0, options)
        try:
            count = len(spec.operands(probe))
        except Exception as exc:  # a user's operands() that cannot take the example's shape
            problems.append(f"control example {i}: operands() failed on it ({exc})")
            continue
        if len(example.layouts) != count:
            problems.append(
                f"control example {i} names {len(example.layouts)} layout(s) for {count} "
                "operand(s); give one per operand, or none for all contiguous"
            )
    return problems


OPS: Registry[OpSpec] = Registry(
    "op",
    OpSpec,
    _check_op,
    _op_module,
    fix="OpSpec(name=...), and the target's OPS",
    docs="docs/ops.md",
)
"""Every op this process knows, by name: the built-in ones (``bi_props.catalogue``) first."""


def _map_aten(spec: OpSpec) -> None:
    for aten in spec.aten_names:
        ATEN_TO_OP._table[aten] = spec.name  # type: ignore[attr-defined]


OPS.on_add = _map_aten
_ORIGINS = OPS.origins
"""Where each registered (non-built-in) op came from: the module of its ``call``."""


def register_op(spec: OpSpec) -> OpSpec:
    """Add a user's op to the catalogue (``OPS``) of this process; returns the registered spec.

    Registering the identical spec again is a no-op. Another spec under a taken name, a spec
    without what exploring it needs, or an aten name another op already claims raises one
    ``ValueError`` saying what, where and how to fix it. A third-party target's ``EXTRA_OPS`` are
    registered this way in the controller and in every worker when the target module loads; an
    op registered by hand must be registered in the workers too (put it in a target's
    ``EXTRA_OPS``)."""
    return OPS.register(spec)


def registered_ops() -> tuple[str, ...]:
    """The ops registered beyond the built-in ones, in registration order."""
    return OPS.registered()


def get(name: str) -> OpSpec:
    try:
        return OPS[name]
    except KeyError:
        known = ", ".join(OPS)
        raise KeyError(f"unknown op {name!r}; the catalogue has: {known}") from None


def cells(ops: Sequence[str], exclude: Sequence[str] = ()) -> list[tuple[str, str, str]]:
    """Every (op, property, switch state) the suite and ``fuzz`` run: each property the op has
    (``property_spec.properties_of``) in each of its ``switches``, but those a space leaves out
    (``exclude``: its ``[properties] exclude``). A property judging both states (parity) is one
    cell, "both"; the disabled state of a control property is a negative control (see
    ``controls``), not a cell."""
    result = []
    for op in ops:
        for prop in properties_of(OPS[op]):
            if prop in exclude:
                continue
            spec = PROPERTIES[prop]
            for switch in spec.switches:
                if spec.control and switch == "disabled":
                    continue  # a negative control (``controls``), or nothing stock could break
                result.append((op, prop, switch))
    return result


def controls(ops: Sequence[str], exclude: Sequence[str] = ()) -> list[tuple[str, str]]:
    """Every (op, property) negative control: the property searched with the switch off (but
    the properties in ``exclude``: a space's ``[properties] exclude``)."""
    return [(op, prop) for op in ops for prop in controls_of(OPS[op]) if prop not in exclude]
