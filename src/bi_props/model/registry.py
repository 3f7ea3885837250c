"""One generic ``Registry`` for records by name: the ops and the properties.

``OPS`` (``OpSpec`` by name, ``op_registry.py``) and ``PROPERTIES`` (``PropertySpec`` by name,
``property_spec.py``) are each a ``Registry``: the built-in records first (the data in
``bi_props.catalogue``), then what ``register_op`` / ``register_property`` add (a target module's
``EXTRA_OPS`` / ``EXTRA_PROPERTIES``, ``declare.py``).

The built-in records live above this layer (they name the worker's observers). A registry loads
them on its first read by importing its provider module by name (``bi_props.catalogue``), the way
an entry point is loaded: there is no import edge from here up, and a process that never reads a
registry never imports the catalogue. Importing this module imports neither torch nor Hypothesis.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Iterator, MutableMapping
from typing import Any, Generic, TypeVar

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
