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
  place?) counted as routing evidence, beside the profiler's or the dispatcher's;
- optionally ``UNOBSERVABLE`` (``{op: reason}``): claimed ops whose routing the library cannot
  show (no event names them, no identity check, no kernel of its own on the op's aten ops);
  their "routing not observable" is reported with the reason instead of ending the run with
  no routing verdict (exit 3);
- optionally ``MODES`` (default ``("eager", "compiled")``) and ``UNSUPPORTED_MODES``
  (``{mode: reason}``): how its ops may be called (``Case.mode``; "compiled": through
  ``torch.compile``). A mode left out is reported "not applicable" with its reason.

A module in the thinking-machines ``batch_invariant_ops`` style is accepted with no glue:
``enable_batch_invariant_mode()`` / ``disable_batch_invariant_mode()`` or a
``set_batch_invariant_mode(enabled)`` context manager (entered for the life of the worker); its
OPS are the ops it overrides (mm, addmm, log_softmax, mean) and its prefix is taken from ``ROUTES``
or left empty.

Routing needs positive evidence (properties.routing). With a ``KERNEL_PREFIX`` and no ``ROUTES``
for an op, an event of the prefix counts only where it names the op (``properties.event_names``),
or the dispatcher shows one of the op's own aten ops (``PATH_OPS``, its ``aten_names``) that the
call dispatched running the module's kernel (positive evidence only: a stock one is no failure
here, the events may show a Python-level swap). A module without ``KERNEL_PREFIX`` and
``ROUTES`` gives no profiler evidence, so its routing is read from the dispatcher instead
(``torch._C._dispatch_dump``): for each aten op on a catalogue op's path, is the active kernel for
the device's dispatch key registered from the module's own directory? Enabled, every aten op on
the op's paths that this example's call dispatched (the worker's dispatcher trace) must be (a
stock one is a routing failure naming it: ``linear`` with only ``aten::mm`` overridden fails when
a bias sends ``F.linear`` to stock ``aten::addmm``; none on the path dispatched is no evidence);
disabled, none may be (else a switch leak). This works for ``torch.library`` overrides (the
thinking-machines style), not for Python-level swaps; where the dispatcher cannot be read,
routing is "not observable". The run says so at its start.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

from ..catalogue import OPS, PRECISIONS
from ..model.declare import (
    _DECLARED,
    OP_MODULES_ENV,
    _load,
    declare_from_environment,
    declare_ops,
    declared_modules,
    register_extra_ops,
    register_extra_properties,
)
from .base import Target, TargetBroken, stock_precision, switch_requested

__all__ = [
    "OP_MODULES_ENV",
    "THINKING_MACHINES_OPS",
    "ModuleTarget",
    "declare_from_environment",
    "declare_ops",
    "declared_modules",
    "register_extra_ops",
    "register_extra_properties",
    "registration_root",
]
"""The declaration side (loading by name, EXTRA_PROPERTIES/EXTRA_OPS) lives in
``bi_props.model.declare``; it is re-exported here, where targets have always found it."""

# What thinking-machines' batch_invariant_ops overrides (aten::mm, addmm, _log_softmax, mean.dim).
THINKING_MACHINES_OPS = ("mm", "matmul", "linear", "addmm", "log_softmax", "mean")


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
        self._declared_unobservable: dict[str, str] = {}  # the module's UNOBSERVABLE
        self._modes: tuple[str, ...] = ("eager", "compiled")  # the module's MODES
        self._unsupported_modes: dict[str, str] = {}  # the module's UNSUPPORTED_MODES

    def check(self) -> None:
        obj = _load(self._spec)
        has_enable = callable(getattr(obj, "enable", None))
        tm_style = callable(getattr(obj, "enable_batch_invariant_mode", None)) or callable(
            getattr(obj, "set_batch_invariant_mode", None)
        )
        if not has_enable and not tm_style:
            raise TargetBroken(
                f"target {self._spec!r} has neither enable(enabled) nor "
                f"enable_batch_invariant_mode()/set_batch_invariant_mode(); see "
                f"'Third-party targets' in docs/targets.md"
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
        self._declared_unobservable = self._read_unobservable(obj)
        self._modes, self._unsupported_modes = self._read_modes(obj)

    def _read_modes(self, obj: Any) -> tuple[tuple[str, ...], dict[str, str]]:
        """The module's ``MODES`` and ``UNSUPPORTED_MODES``, checked."""
        from ..model.case import MODES

        declared = getattr(obj, "MODES", None)
        modes = MODES if declared is None else tuple(declared)
        if not modes or any(m not in MODES for m in modes):
            raise TargetBroken(
                f"target {self._spec!r}: MODES must be a non-empty list of {list(MODES)}, "
                f"got {declared!r}"
            )
        why = getattr(obj, "UNSUPPORTED_MODES", None) or {}
        if not isinstance(why, dict) or not all(
            m in MODES and m not in modes and isinstance(r, str) and r.strip()
            for m, r in why.items()
        ):
            raise TargetBroken(
                f"target {self._spec!r}: UNSUPPORTED_MODES must map modes missing from MODES to "
                f"the reason ({{mode: 'why'}}), got {why!r}"
            )
        return modes, {m: r.strip() for m, r in why.items()}

    def modes(self) -> tuple[str, ...]:
        """The module's ``MODES`` (default: eager and compiled)."""
        return self._modes

    def unsupported_modes(self) -> dict[str, str]:
        """The module's ``UNSUPPORTED_MODES``: why a mode it leaves out does not apply."""
        return dict(self._unsupported_modes)

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
        return self.covered_by(self._obj)

    @staticmethod
    def covered_by(obj: Any) -> tuple[str, ...]:
        if hasattr(obj, "OPS"):
            return tuple(obj.OPS)
        return THINKING_MACHINES_OPS

    def routes(self) -> dict[str, tuple[str, ...]]:
        return {op: tuple(events) for op, events in dict(getattr(self._obj, "ROUTES", {})).items()}

    def unobservable(self) -> dict[str, str]:
        """The module's ``UNOBSERVABLE``: claimed ops whose routing it cannot show, and why."""
        return dict(self._declared_unobservable)

    def _read_unobservable(self, obj: Any) -> dict[str, str]:
        table = getattr(obj, "UNOBSERVABLE", None) or {}
        claimed = set(self.covered_by(obj))
        if not isinstance(table, dict) or not all(
            isinstance(op, str) and isinstance(why, str) and why.strip()
            for op, why in table.items()
        ):
            raise TargetBroken(
                f"target {self._spec!r}: UNOBSERVABLE must map claimed op names to the reason "
                f"their routing cannot be observed ({{op: 'why'}}), got {table!r}"
            )
        unclaimed = sorted(op for op in table if op not in claimed)
        if unclaimed:
            raise TargetBroken(
                f"target {self._spec!r}: UNOBSERVABLE names ops it does not claim: {unclaimed} "
                f"(OPS: {sorted(claimed)})"
            )
        return {op: why.strip() for op, why in table.items()}

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
        from .dispatcher import cached_dumper

        self._dispatch, self._unobservable = cached_dumper(
            self._dispatch,
            self._unobservable,
            lambda exc: (
                f"target {self._spec!r} has no KERNEL_PREFIX/ROUTES and the dispatcher "
                f"cannot be read (torch._C._dispatch_dump: {exc!r})"
            ),
        )
        return self._dispatch

    def kernel_is_own(self, qualified_name: str) -> bool | None:
        """Whether the kernel that runs for an aten op on the device's key (its own, else the
        explicit composite the dispatcher falls back to) is registered from the module's
        directory; None where none runs (implicit composites, ops this torch lacks)."""
        from .dispatcher import location_path, parse_active_kernel

        dump, root = self._dumper(), self._root()
        if dump is None or root is None:
            return None
        active = parse_active_kernel(dump(qualified_name), self._dispatch_key())
        if active is None:
            return None
        location = active[1]
        path = os.path.realpath(location_path(location))
        return path == root or path.startswith(root + os.sep)

    def dispatch_trace(self) -> bool:
        """Routing reads the aten ops each example's call dispatched: prefix-less modules, and
        prefixed ones with a claimed op that ``ROUTES`` does not name (the dispatcher may show
        that op's own aten op running the module's kernel)."""
        routes = self.routes()
        return not self._own_events() or any(op not in routes for op in self.covered())

    def evidence(self, op: str, dispatched: tuple[str, ...] | None = None) -> dict[str, bool]:
        """The module's own ``evidence(op)`` (identity checks), if it has one, and for
        prefix-less modules the dispatcher's: per aten op on ``op``'s paths that this example's
        call ``dispatched`` (the worker's dispatcher trace), is its kernel the module's?"""
        own = getattr(self._obj, "evidence", None)
        checks: dict[str, bool] = {}
        if callable(own):
            try:
                checks = {str(k): bool(v) for k, v in dict(own(op) or {}).items()}
            except Exception as exc:  # a failing check, not a crash of the run
                checks = {f"{self._spec}.evidence({op!r}) raised {exc!r}": False}
        return {**checks, **self._dispatcher_evidence(op, dispatched)}

    def _dispatcher_evidence(
        self, op: str, dispatched: tuple[str, ...] | None = None
    ) -> dict[str, bool]:
        """Prefix-less modules only. Enabled: every aten op on ``op``'s paths that the call
        dispatched (``dispatched``; an overload of a path op counts), and every order-sensitive
        one it dispatched (``ORDER_SENSITIVE_OPS``: a reduction off the listed paths), must have
        the module's kernel, so a stock one (``F.linear`` with a bias reaching stock
        ``aten::addmm`` when only ``aten::mm`` is overridden) is a routing failure naming it;
        none dispatched is no evidence. Disabled: the dispatched ones and every aten op of the
        paths; any of the module's is a switch leak. Without a trace (``dispatched`` None) the
        enabled state falls back to the op's path ops as a whole: those that are the module's,
        else the first."""
        if self._own_events():
            return self._own_aten_evidence(op, dispatched)
        from .dispatcher import PATH_OPS, is_order_sensitive

        names = PATH_OPS.get(op, ())
        if dispatched is not None:
            bases = {name.split(".")[0] for name in names}
            on_path = [
                n
                for n in dispatched
                if n in names or n.split(".")[0] in bases or is_order_sensitive(n)
            ]
            looked = on_path if self._active else [*on_path, *names]
        else:
            looked = list(names)
        checks: dict[str, bool] = {}
        for name in dict.fromkeys(looked):
            own = self.kernel_is_own(name)
            if self._unobservable is not None:
                return {}
            if own is not None:
                checks[f"{name} [{self._dispatch_key()}] is registered from {self._root()}"] = own
        if self._active and dispatched is None:
            positive = {k: v for k, v in checks.items() if v}
            return positive or dict(list(checks.items())[:1])
        return checks

    def _own_aten_evidence(
        self, op: str, dispatched: tuple[str, ...] | None = None
    ) -> dict[str, bool]:
        """Prefixed modules, enabled, for an op ``ROUTES`` does not name: each of the op's own
        aten ops (``PATH_OPS``, its ``aten_names``; any overload) that the call dispatched and
        whose kernel is the module's, as a passing check. Positive evidence only: a stock kernel
        there is left to the profiler's events (a Python-level swap runs above the dispatcher),
        and another op's aten op (``aten::mm`` inside a stock ``fused_moe``) is never looked at."""
        if not self._active or dispatched is None or op in self.routes():
            return {}
        from .dispatcher import PATH_OPS

        spec = OPS.get(op)
        names = (*PATH_OPS.get(op, ()), *(spec.aten_names if spec is not None else ()))
        bases = {name.split(".")[0] for name in names}
        checks: dict[str, bool] = {}
        for name in dict.fromkeys(dispatched):
            if name.split(".")[0] not in bases:
                continue
            own = self.kernel_is_own(name)
            if self._unobservable is not None:
                return {}
            if own:
                checks[f"{name} [{self._dispatch_key()}] is registered from {self._root()}"] = True
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
