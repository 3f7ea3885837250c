"""Loading a target module by name and declaring its records: a third-party target's
``EXTRA_PROPERTIES`` and ``EXTRA_OPS`` registered in this process (the controller before the space
is validated and cases are drawn, every worker before the target is checked).

The module is imported by name (``importlib``), never enabled: this is the model's side of the
module interface (``bi_props.targets.module`` adapts the module to a Target). Importing this
module imports neither torch nor Hypothesis.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

from .op_registry import OPS, register_op
from .opspec import OpSpec
from .property_spec import PROPERTIES, PropertySpec, register_property, unknown_ops
from .target import BUILTIN_TARGETS, TargetBroken, TargetMissing, builtin_names


def load(spec: str) -> Any:
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise TargetMissing(
                f"target module {module_name!r} is not importable ({exc}). Install it, or put it "
                f"on PYTHONPATH; a built-in target is one of: {builtin_names()}."
            ) from None
        raise TargetBroken(f"target module {module_name!r} failed to import: {exc!r}") from None
    except Exception as exc:
        raise TargetBroken(f"target module {module_name!r} failed to import: {exc!r}") from None
    if not attr:
        return module
    try:
        return getattr(module, attr)
    except AttributeError:
        raise TargetBroken(
            f"target {spec!r}: module {module_name!r} has no attribute {attr!r}"
        ) from None


OP_MODULES_ENV = "BI_PROPS_OP_MODULES"
"""Target modules whose EXTRA_OPS the controller registered: each worker registers them too (a
campaign over several targets draws every target's ops for each)."""

_DECLARED: dict[str, str | None] = {}


def _register_extra(spec: str, obj: Any, attr: str, record: type, register: Any, docs: str):
    """Register each record of ``obj.<attr>`` (a list of ``record``) with ``register``: the one
    declaration loop behind EXTRA_PROPERTIES and EXTRA_OPS. TargetBroken on anything wrong."""
    extra = getattr(obj, attr, ())
    try:
        specs = list(extra)
    except TypeError:
        raise TargetBroken(
            f"target {spec!r}: {attr} must be a list of bi_props.{record.__name__}, got {extra!r}"
        ) from None
    names = []
    for item in specs:
        if not isinstance(item, record):
            raise TargetBroken(
                f"target {spec!r}: {attr} holds {item!r}, not a bi_props.{record.__name__}; see "
                f"{docs}"
            )
        try:
            register(item)
        except ValueError as exc:
            raise TargetBroken(f"target {spec!r}: {attr}: {exc}") from None
        names.append(item.name)
    return tuple(names)


def register_extra_properties(spec: str, obj: Any) -> tuple[str, ...]:
    """Register ``obj.EXTRA_PROPERTIES`` (a list of PropertySpec); TargetBroken on anything
    wrong with them. Before ``EXTRA_OPS``: an OpSpec's ``properties`` may name them."""
    return _register_extra(
        spec, obj, "EXTRA_PROPERTIES", PropertySpec, register_property, "docs/properties.md"
    )


def register_extra_ops(spec: str, obj: Any) -> tuple[str, ...]:
    """Register ``obj.EXTRA_PROPERTIES`` then ``obj.EXTRA_OPS`` (a list of OpSpec); TargetBroken
    on anything wrong with them, or with a property's ``ops`` naming an op no one declared."""
    properties = register_extra_properties(spec, obj)
    names = _register_extra(spec, obj, "EXTRA_OPS", OpSpec, register_op, "docs/ops.md")
    for prop in properties:
        unknown = unknown_ops(PROPERTIES[prop], OPS)
        if unknown:
            raise TargetBroken(
                f"target {spec!r}: EXTRA_PROPERTIES: property {prop!r} names unknown ops "
                f"{unknown} in its ops; the catalogue has {list(OPS)}"
            )
    return names


def declare_ops(spec: str) -> str | None:
    """Register a third-party target's EXTRA_OPS in this process (once per spec); built-in
    targets declare none. Returns None, or why the module's ops could not be read (the worker
    reports the same problem as a missing or broken target)."""
    if spec in BUILTIN_TARGETS:
        return None
    if spec not in _DECLARED:
        try:
            register_extra_ops(spec, load(spec))
            _DECLARED[spec] = None
        except (TargetMissing, TargetBroken) as exc:
            _DECLARED[spec] = str(exc)
    return _DECLARED[spec]


def declared_modules() -> tuple[str, ...]:
    """The target modules whose EXTRA_OPS this process registered (for the workers' environment)."""
    return tuple(s for s, problem in _DECLARED.items() if problem is None)


def declare_from_environment(own: str) -> None:
    """In a worker: register the EXTRA_OPS of the modules the controller registered, except the
    target's own (its ``check`` does that)."""
    for spec in filter(None, os.environ.get(OP_MODULES_ENV, "").split(",")):
        if spec != own:
            problem = declare_ops(spec)
            if problem is not None:
                raise TargetBroken(f"the ops of target module {spec!r} cannot be loaded: {problem}")


_load = load
