"""Third-party targets: any importable module (or ``module:attr`` object) can be tested.

The interface a library exposes (documented in the README):

- ``enable(enabled: bool) -> None``: called once in a fresh worker before any op runs; installs
  the library's kernels when True, nothing when False;
- ``OPS``: catalogue op names it claims to make batch-invariant;
- ``KERNEL_PREFIX``: the profiler-event prefix of its kernels (e.g. ``"batch_invariant_ops::"``);
- optionally ``DEVICE`` (default ``"cpu"``) and ``ROUTES`` ({op: (event, ...)});
- optionally ``PRECISION``: the kernels' internal (accumulation) precision, one of "float32",
  "bfloat16", "float16", "output" (the output's own dtype), as one string or ``{op: precision}``
  (ops not named: "float32"). With the switch off the library's kernels are not installed and
  stock PyTorch's declaration applies;
- optionally ``EXTRA_OPS``: a list of ``bi_props.OpSpec``, the library's own ops (``OPS`` may
  name them). They are registered (``register_op``) wherever the module is loaded: in the
  controller before the search space is validated and cases are drawn (``declare_ops``: the
  module is imported there, never enabled), and in every worker before the target is checked;
- optionally ``EXTRA_PROPERTIES``: a list of ``bi_props.PropertySpec``, the library's own
  properties, registered (``register_property``) wherever the module is loaded, exactly like
  ``EXTRA_OPS`` and before them (docs/properties.md);
- optionally ``ENTRIES`` (``{op: (entry, ...)}``) or ``entries()`` returning it: entry points
  that replace an op's own in this target (what its users call);
- optionally ``evidence(op) -> {check: bool}``: identity checks (is the swapped function in
  place?) counted as routing evidence, beside the profiler's or the dispatcher's.

A module in the thinking-machines ``batch_invariant_ops`` style is accepted with no glue:
``enable_batch_invariant_mode()`` / ``disable_batch_invariant_mode()`` or a
``set_batch_invariant_mode(enabled)`` context manager (entered for the life of the worker); its
OPS are the ops it overrides (mm, addmm, log_softmax, mean) and its prefix is taken from ``ROUTES``
or left empty.

Routing needs positive evidence (properties.routing). A module without ``KERNEL_PREFIX`` and
``ROUTES`` gives no profiler evidence, so its routing is read from the dispatcher instead
(``torch._C._dispatch_dump``): for each aten op on a catalogue op's path, is the active kernel for
the device's dispatch key registered from the module's own directory? Enabled, at least one must
be (else a routing failure); disabled, none may be (else a switch leak). This works for
``torch.library`` overrides (the thinking-machines style), not for Python-level swaps; where the
dispatcher cannot be read, routing is "not observable". The run says so at its start.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

from ..catalogue import OPS, PRECISIONS, OpSpec, register_op
from .base import Target, TargetBroken, TargetMissing, stock_precision, switch_requested

# What thinking-machines' batch_invariant_ops overrides (aten::mm, addmm, _log_softmax, mean.dim).
THINKING_MACHINES_OPS = ("mm", "matmul", "linear", "addmm", "log_softmax", "mean")


def _load(spec: str) -> Any:
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise TargetMissing(
                f"target module {module_name!r} is not importable ({exc}). Install it, or put it "
                f"on PYTHONPATH; a built-in target is one of: cpu, vllm, ascend."
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


_SHARED_DIRECTORIES = ("site-packages", "dist-packages")


def registration_root(path: str | None) -> str | None:
    """The file or directory whose registrations count as the module's own: a package's
    directory, or the directory of a single-file module (helpers beside it count as its own),
    except where that directory is shared with every other installed library (site-packages):
    there only the module's own file counts, or any library's kernel would pass as its own."""
    if not path:
        return None
    path = os.path.realpath(path)
    directory = os.path.dirname(path)
    if os.path.basename(path) == "__init__.py":
        return directory
    if os.path.basename(directory) in _SHARED_DIRECTORIES:
        return path
    return directory


OP_MODULES_ENV = "BI_PROPS_OP_MODULES"
"""Target modules whose EXTRA_OPS the controller registered: each worker registers them too (a
campaign over several targets draws every target's ops for each)."""

_DECLARED: dict[str, str | None] = {}


def register_extra_properties(spec: str, obj: Any) -> tuple[str, ...]:
    """Register ``obj.EXTRA_PROPERTIES`` (a list of PropertySpec); TargetBroken on anything
    wrong with them. Before ``EXTRA_OPS``: an OpSpec's ``properties`` may name them."""
    from ..model.property_spec import PropertySpec, register_property

    extra = getattr(obj, "EXTRA_PROPERTIES", ())
    try:
        specs = list(extra)
    except TypeError:
        raise TargetBroken(
            f"target {spec!r}: EXTRA_PROPERTIES must be a list of bi_props.PropertySpec, got "
            f"{extra!r}"
        ) from None
    names = []
    for prop in specs:
        if not isinstance(prop, PropertySpec):
            raise TargetBroken(
                f"target {spec!r}: EXTRA_PROPERTIES holds {prop!r}, not a "
                f"bi_props.PropertySpec; see docs/properties.md"
            )
        try:
            register_property(prop)
        except ValueError as exc:
            raise TargetBroken(f"target {spec!r}: EXTRA_PROPERTIES: {exc}") from None
        names.append(prop.name)
    return tuple(names)


def register_extra_ops(spec: str, obj: Any) -> tuple[str, ...]:
    """Register ``obj.EXTRA_PROPERTIES`` then ``obj.EXTRA_OPS`` (a list of OpSpec); TargetBroken
    on anything wrong with them, or with a property's ``ops`` naming an op no one declared."""
    from ..model.property_spec import PROPERTIES, unknown_ops

    properties = register_extra_properties(spec, obj)
    extra = getattr(obj, "EXTRA_OPS", ())
    try:
        specs = list(extra)
    except TypeError:
        raise TargetBroken(
            f"target {spec!r}: EXTRA_OPS must be a list of bi_props.OpSpec, got {extra!r}"
        ) from None
    names = []
    for op in specs:
        if not isinstance(op, OpSpec):
            raise TargetBroken(
                f"target {spec!r}: EXTRA_OPS holds {op!r}, not a bi_props.OpSpec; see docs/ops.md"
            )
        try:
            register_op(op)
        except ValueError as exc:
            raise TargetBroken(f"target {spec!r}: EXTRA_OPS: {exc}") from None
        names.append(op.name)
    for prop in properties:
        unknown = unknown_ops(PROPERTIES[prop], OPS)
        if unknown:
            raise TargetBroken(
                f"target {spec!r}: EXTRA_PROPERTIES: property {prop!r} names unknown ops "
                f"{unknown} in its ops; the catalogue has {list(OPS)}"
            )
    return tuple(names)


def declare_ops(spec: str) -> str | None:
    """Register a third-party target's EXTRA_OPS in this process (once per spec); built-in
    targets declare none. Returns None, or why the module's ops could not be read (the worker
    reports the same problem as a missing or broken target)."""
    from . import BUILTIN

    if spec in BUILTIN:
        return None
    if spec not in _DECLARED:
        try:
            register_extra_ops(spec, _load(spec))
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


class ModuleTarget(Target):
    """Adapter from the documented module interface (or the thinking-machines style)."""

    def __init__(self, spec: str) -> None:
        self.name = spec
        self._spec = spec
        self._obj: Any = None
        self._active = False
        self._context: Any = None
        self._dispatch: Any = None  # torch._C._dispatch_dump, for prefix-less modules
        self._unobservable: str | None = None

    def check(self) -> None:
        obj = _load(self._spec)
        has_enable = callable(getattr(obj, "enable", None))
        tm_style = callable(getattr(obj, "enable_batch_invariant_mode", None)) or callable(
            getattr(obj, "set_batch_invariant_mode", None)
        )
        if not has_enable and not tm_style:
            raise TargetBroken(
                f"target {self._spec!r} has neither enable(enabled) nor "
                f"enable_batch_invariant_mode()/set_batch_invariant_mode(); see the README's "
                f"'Third-party targets'"
            )
        if has_enable and not hasattr(obj, "OPS"):
            raise TargetBroken(f"target {self._spec!r} has enable() but no OPS list")
        register_extra_ops(self._spec, obj)  # before any op lookup: OPS may name them
        _DECLARED.setdefault(self._spec, None)
        unknown = [op for op in getattr(obj, "OPS", ()) if op not in OPS]
        if unknown:
            raise TargetBroken(
                f"target {self._spec!r}: OPS names unknown ops {unknown}; the catalogue has "
                f"{list(OPS)} (an op of your own: declare it in EXTRA_OPS, see docs/ops.md)"
            )
        entries = self._module_entries(obj)
        bad = [op for op in entries if op not in OPS]
        if bad:
            raise TargetBroken(f"target {self._spec!r}: ENTRIES names unknown ops {bad}")
        self._obj = obj
        self.device = str(getattr(obj, "DEVICE", "cpu"))
        self.kernel_prefix = str(getattr(obj, "KERNEL_PREFIX", ""))

    def activate(self) -> None:
        obj, enabled = self._obj, switch_requested()
        try:
            if callable(getattr(obj, "enable", None)):
                obj.enable(enabled)
            elif enabled and callable(getattr(obj, "enable_batch_invariant_mode", None)):
                obj.enable_batch_invariant_mode()
            elif enabled:
                self._context = obj.set_batch_invariant_mode(True)
                self._context.__enter__()
        except Exception as exc:
            state = "enable(True)" if enabled else "enable(False)"
            raise TargetBroken(f"target {self._spec!r}: {state} raised {exc!r}") from None
        self._active = enabled
        probe = getattr(obj, "is_batch_invariant_mode_enabled", None)
        if callable(probe):
            self._active = bool(probe())

    def repro_setup(self, enabled: bool) -> str:
        module_name, _, attr = self._spec.partition(":")
        obj = f"{module_name}.{attr}" if attr else module_name
        lines = [f"import {module_name}"]
        if callable(getattr(self._obj, "enable", None)):
            lines.append(f"{obj}.enable({enabled})")
        elif enabled and callable(getattr(self._obj, "enable_batch_invariant_mode", None)):
            lines.append(f"{obj}.enable_batch_invariant_mode()")
        elif enabled:
            lines.append(f"{obj}.set_batch_invariant_mode(True).__enter__()")
        return "\n".join(lines)

    def covered(self) -> tuple[str, ...]:
        if hasattr(self._obj, "OPS"):
            return tuple(self._obj.OPS)
        return THINKING_MACHINES_OPS

    def routes(self) -> dict[str, tuple[str, ...]]:
        return {op: tuple(events) for op, events in dict(getattr(self._obj, "ROUTES", {})).items()}

    def _module_entries(self, obj: Any) -> dict[str, tuple[str, ...]]:
        declared = getattr(obj, "entries", None)
        try:
            table = declared() if callable(declared) else getattr(obj, "ENTRIES", {})
            return {op: tuple(names) for op, names in dict(table).items()}
        except Exception as exc:
            raise TargetBroken(f"target {self._spec!r}: entries()/ENTRIES: {exc!r}") from None

    def entries(self) -> dict[str, tuple[str, ...]]:
        """The module's ``ENTRIES`` or ``entries()``: entry points replacing an op's own."""
        return self._module_entries(self._obj)

    def environment(self) -> dict[str, str]:
        env = super().environment()
        env["target_module"] = self._spec
        version = getattr(self._obj, "__version__", None)
        if version:
            env["target_version"] = str(version)
        return env

    # -- routing evidence for a module without KERNEL_PREFIX / ROUTES -----------------------------

    def _own_events(self) -> bool:
        return bool(self.kernel_prefix) or bool(getattr(self._obj, "ROUTES", None))

    def _dispatch_key(self) -> str:
        device = self.device.split(":")[0].lower()
        return {"npu": "PrivateUse1"}.get(device, device.upper())

    def _root(self) -> str | None:
        """Where the module's registrations come from (see ``registration_root``)."""
        module = importlib.import_module(self._spec.partition(":")[0])
        return registration_root(getattr(module, "__file__", None))

    def _dumper(self) -> Any:
        if self._dispatch is None and self._unobservable is None:
            try:
                import torch

                dump = torch._C._dispatch_dump
                if "schema:" not in dump("aten::mm"):
                    raise RuntimeError("unrecognised dump format")
                self._dispatch = dump
            except Exception as exc:
                self._unobservable = (
                    f"target {self._spec!r} has no KERNEL_PREFIX/ROUTES and the dispatcher "
                    f"cannot be read (torch._C._dispatch_dump: {exc!r})"
                )
        return self._dispatch

    def kernel_is_own(self, qualified_name: str) -> bool | None:
        """Whether the active kernel of an aten op on the device's key is registered from the
        module's directory; None where the op has no kernel of its own on that key."""
        from .vllm import location_path, parse_dispatch_kernel

        dump, root = self._dumper(), self._root()
        if dump is None or root is None:
            return None
        location = parse_dispatch_kernel(dump(qualified_name), self._dispatch_key())
        if location is None:
            return None
        path = os.path.realpath(location_path(location))
        return path == root or path.startswith(root + os.sep)

    def evidence(self, op: str) -> dict[str, bool]:
        """The module's own ``evidence(op)`` (identity checks), if it has one, and for
        prefix-less modules the dispatcher's: per aten op on ``op``'s paths, is its kernel
        the module's?"""
        own = getattr(self._obj, "evidence", None)
        checks: dict[str, bool] = {}
        if callable(own):
            try:
                checks = {str(k): bool(v) for k, v in dict(own(op) or {}).items()}
            except Exception as exc:  # a failing check, not a crash of the run
                checks = {f"{self._spec}.evidence({op!r}) raised {exc!r}": False}
        return {**checks, **self._dispatcher_evidence(op)}

    def _dispatcher_evidence(self, op: str) -> dict[str, bool]:
        """Prefix-less modules only: per aten op on ``op``'s paths, is the dispatcher's kernel
        the module's? Enabled: the ones that are (or, if none, the op's own aten entry as
        False, which fails routing). Disabled: all of them (any True is a switch leak)."""
        if self._own_events():
            return {}
        from .vllm import PATH_OPS

        names = PATH_OPS.get(op, ())
        checks: dict[str, bool] = {}
        for name in names:
            own = self.kernel_is_own(name)
            if self._unobservable is not None:
                return {}
            if own is not None:
                checks[f"{name} [{self._dispatch_key()}] is registered from {self._root()}"] = own
        if self._active:
            positive = {k: v for k, v in checks.items() if v}
            return positive or dict(list(checks.items())[:1])
        return checks

    def switch_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {"active": self._active}
        if not self._own_events():
            self._dumper()
            if self._unobservable is not None:
                state["profiler_error"] = self._unobservable  # read as "routing not observable"
        return state

    def routing_note(self) -> str:
        if self._own_events():
            return ""
        return (
            f"target {self._spec!r} declares no KERNEL_PREFIX and no ROUTES: its kernels show no "
            f"profiler events, so routing is judged from the dispatcher (is the active kernel of "
            f"each aten op on the path registered from {self._root()}?). Python-level swaps "
            f"are not seen this way; declare KERNEL_PREFIX/ROUTES for profiler evidence."
        )

    def precision(self, op: str) -> str:
        """The module's ``PRECISION`` for its claimed ops when enabled (float32 by default);
        stock PyTorch's on the module's device otherwise."""
        if not self._active or op not in self.covered():
            return stock_precision(self.device, op)
        declared = getattr(self._obj, "PRECISION", "float32")
        value = declared.get(op, "float32") if isinstance(declared, dict) else declared
        if value not in PRECISIONS:
            raise TargetBroken(
                f"target {self._spec!r}: PRECISION for {op} is {value!r}; declare one of "
                f"{', '.join(PRECISIONS)}"
            )
        return str(value)
