"""``KernelRoute``: one CPU kernel and every way the switch routes to it, as one record.

A kernel module (linalg.py, normalization.py, ...) lists its kernels in ``ROUTES``; register.py
reads every module's list and derives what it installs: the custom op ``{namespace}::<name>``
(the profiler event), the aten overloads re-registered on the CPU key to call it, the
``bi_props.ops`` composite swapped for it, and the catalogue ops whose routing shows its event.
Adding a CPU kernel is then one record beside the kernel, not an entry in five tables.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

Forwarder = Callable[[Any], Callable[..., Any]]
"""Given ``torch.ops.<namespace>``, the function to install (it calls the custom op)."""


@dataclass(frozen=True)
class KernelRoute:
    """One kernel: ``schema`` names the custom op (``name(...) -> ...``); ``ops`` are the
    catalogue ops whose routing evidence is this kernel's profiler event; ``aten`` maps aten
    overloads to their forwarders; ``composite`` is the ``bi_props.ops`` attribute swapped for
    the kernel (``forward`` builds its replacement; by default it calls the custom op with the
    same arguments), ``data_argument`` its argument whose dtype decides the kernel's domain.
    ``all_dtypes``: the aten overrides keep integer and complex inputs too (exact integer
    products and sums, the same tree in complex arithmetic); otherwise those go to stock."""

    schema: str
    kernel: Callable[..., Any]
    ops: tuple[str, ...] = ()
    aten: Mapping[str, Forwarder] = field(default_factory=dict)
    composite: str | None = None
    forward: Forwarder | None = None
    data_argument: int = 0
    all_dtypes: bool = False

    @property
    def name(self) -> str:
        return self.schema.split("(", 1)[0]

    def composite_function(self, ns: Any) -> Callable[..., Any]:
        """The function swapped in for ``composite``: ``forward(ns)``, or a call of the custom
        op with the composite's arguments (its schema names them alike)."""
        if self.forward is not None:
            fn = self.forward(ns)
        else:
            op = getattr(ns, self.name)

            def fn(*args: Any, **kwargs: Any) -> Any:
                return op(*args, **kwargs)

            fn.__doc__ = f"Batch-invariant ``bi_props.ops.{self.composite}`` ({self.name})."
        fn.__name__ = fn.__qualname__ = str(self.composite)
        return fn


__all__ = ["Forwarder", "KernelRoute"]
