"""The registries: ops and properties by name, one generic ``Registry`` for both.

``OPS`` (``OpSpec`` by name) and ``PROPERTIES`` (``PropertySpec`` by name, in
``property_spec.py``) are each a ``Registry``: the built-in records first (the data in
``bi_props.catalogue``), then what ``register_op`` / ``register_property`` add (a target module's
``EXTRA_OPS`` / ``EXTRA_PROPERTIES``). ``cells`` and ``controls`` derive the suite's matrix from
them; ``ATEN_TO_OP`` maps the profiler's aten names to ops.

The built-in records live above this layer (they name the worker's observers). A registry loads
them on its first read by importing its provider module by name (``bi_props.catalogue``), the way
an entry point is loaded: there is no import edge from here up, and a process that never reads a
registry never imports the catalogue. Importing this module imports neither torch nor Hypothesis.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Iterator, MutableMapping, Sequence
from typing import Any, Generic, TypeVar

from .opspec import OpSpec

BUILTINS_PROVIDER = "bi_props.catalogue"
"""The module holding the built-in op and property records (it calls ``install_builtins``)."""

T = TypeVar("T")


class _Lazy(MutableMapping):
    """A dict that loads the built-in records before its first read or write."""

    def __init__(self) -> None:
        self._table: dict[str, Any] = {}

    def _ensure(self) -> None:
        _load_builtins()

    def __getitem__(self, key: str) -> Any:
        self._ensure()
        return self._table[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self._ensure()
        self._table[key] = value

    def __delitem__(self, key: str) -> None:
        self._ensure()
        del self._table[key]

    def __iter__(self) -> Iterator[str]:
        self._ensure()
        return iter(self._table)

    def __len__(self) -> int:
        self._ensure()
        return len(self._table)

    def __contains__(self, key: object) -> bool:
        self._ensure()
        return key in self._table

    def __repr__(self) -> str:
        self._ensure()
        return repr(self._table)


_LOADED = False


def _load_builtins() -> None:
    global _LOADED
    if not _LOADED:
        _LOADED = True  # before the import: the provider's own registrations read the tables
        importlib.import_module(BUILTINS_PROVIDER)


class Registry(_Lazy, Generic[T]):
    """Records of one kind by name: built-in ones first, then registered ones, in order.

    ``register`` is the one way in: the identical record again is a no-op; another record under a
    taken name, or one ``check`` finds problems with, raises one ``ValueError`` saying what, where
    and how to fix it."""

    def __init__(
        self,
        kind: str,
        record: type,
        check: Callable[[Any], list[str]],
        origin: Callable[[Any], str],
        fix: str,
        docs: str,
    ) -> None:
        super().__init__()
        self.kind, self.record, self._check, self._module = kind, record, check, origin
        self._fix, self._docs = fix, docs
        self.builtin: tuple[str, ...] = ()
        self.origins: dict[str, str] = {}
        self.on_add: Callable[[Any], None] = lambda spec: None

    def install_builtins(self, specs: Iterable[T]) -> None:
        """The provider's call: the built-in records, before any registered one."""
        for spec in specs:
            self._table[spec.name] = spec  # type: ignore[attr-defined]
            self.on_add(spec)
        self.builtin = tuple(self._table)

    def origin(self, spec: Any) -> str:
        if spec.name in self.builtin:
            return "built into bi_props (bi_props.catalogue)"
        return self.origins.get(spec.name, "registered earlier")

    def register(self, spec: T) -> T:
        record = self.record.__name__
        if not isinstance(spec, self.record):
            raise TypeError(
                f"register_{self.kind} needs a bi_props.{record}, got {type(spec).__name__}"
            )
        name = spec.name  # type: ignore[attr-defined]
        existing = self.get(name)
        if existing is not None:
            if existing is spec or existing == spec:
                return existing
            raise ValueError(
                f"register_{self.kind}: {self.kind} name {name!r} is taken: "
                f"{self.origin(existing)} defines a different spec under it (this one comes from "
                f"{self._module(spec)}). Rename yours ({self._fix}) or register the same {record} "
                f"object (import it instead of redefining it)"
            )
        problems = self._check(spec)
        if problems:
            raise ValueError(
                f"register_{self.kind}: {record} {name!r} (from {self._module(spec)}) cannot be "
                f"registered: {'; '.join(problems)}. See bi_props.{record}'s docstring and "
                f"{self._docs}"
            )
        self[name] = spec
        self.origins[name] = f"module {self._module(spec)}"
        self.on_add(spec)
        return spec

    def registered(self) -> tuple[str, ...]:
        """The records registered beyond the built-in ones, in registration order."""
        return tuple(name for name in self if name not in self.builtin)


# ---------------------------------------------------------------------------------------------
# Ops


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
    from .property_spec import PROPERTIES

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
    claimed = {
        a: ATEN_TO_OP[a] for a in spec.aten_names if ATEN_TO_OP.get(a, spec.name) != spec.name
    }
    if claimed:
        problems.append(
            f"aten_names {sorted(claimed)} already map to {sorted(set(claimed.values()))}"
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


def cells(ops: Sequence[str]) -> list[tuple[str, str, str]]:
    """Every (op, property, switch state) the suite and ``fuzz`` run: each property the op has
    (``property_spec.properties_of``) in each of its ``switches``. A property judging both states
    (parity) is one cell, "both"; the disabled state of a control property is a negative control
    (see ``controls``), not a cell."""
    from .property_spec import PROPERTIES, properties_of

    result = []
    for op in ops:
        for prop in properties_of(OPS[op]):
            spec = PROPERTIES[prop]
            for switch in spec.switches:
                if spec.control and switch == "disabled":
                    continue  # a negative control (``controls``), or nothing stock could break
                result.append((op, prop, switch))
    return result


def controls(ops: Sequence[str]) -> list[tuple[str, str]]:
    """Every (op, property) negative control: the property searched with the switch off."""
    return [(op, prop) for op in ops for prop in OPS[op].controls]
