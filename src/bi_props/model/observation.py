"""What a worker sends back: bit patterns and facts, no tensors, no torch.

Properties judge these in the controller, so a property can combine observations made in different
processes (parity compares the enabled worker's with the disabled worker's).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .opspec import Reference


@dataclass(frozen=True)
class TensorBits:
    dtype: str
    shape: tuple[int, ...]
    device: str
    bits: np.ndarray | None  # unsigned-integer view of the storage; None when not needed


@dataclass(frozen=True)
class Call:
    """One call of an entry point: its outputs, or the exception it raised."""

    outputs: tuple[TensorBits, ...] | None = None
    error_type: str | None = None
    error_message: str | None = None
    events: tuple[str, ...] | None = None

    @property
    def raised(self) -> bool:
        return self.error_type is not None

    def describe_error(self) -> str:
        return f"{self.error_type}: {self.error_message}"


@dataclass(frozen=True)
class Observation:
    """Everything one property needs from one worker for one case."""

    property: str
    switch: str
    calls: dict[str, Call]
    references: tuple[Reference, ...] | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0


@dataclass(frozen=True)
class Hello:
    """A worker's first message: which target it loaded, in which state, and what it covers."""

    target: str
    switch: str
    status: str  # "ready" | "missing" | "broken"
    message: str = ""
    device: str = "cpu"
    kernel_prefix: str = ""
    covered: tuple[str, ...] = ()
    entries: dict[str, tuple[str, ...]] = field(default_factory=dict)
    routes: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # Ops whose routing the target declares it cannot show, with why (Target.unobservable):
    # "not observable" there is reported with the reason, and is no missing routing verdict.
    unobservable: dict[str, str] = field(default_factory=dict)
    environment: dict[str, str] = field(default_factory=dict)
    repro: dict[str, str] = field(default_factory=dict)  # switch state -> switch-on code
    pid: int = 0
    # Whether replacement workers may be forked from this loaded process (runner/worker.py says
    # when they may not, and ``fork_note`` why).
    forkable: bool = False
    fork_note: str = ""
    # What the switch provider did before the target loaded (switches.py); empty for "env".
    provider: dict[str, Any] = field(default_factory=dict)
    # Whether the switch promises batch-invariant inference (Target.promises_inference, or a
    # switch provider such as verl that promises it): model-level properties are then judged.
    promises_inference: bool = False
    # How routing is observed when the target's own events cannot show it (Target.routing_note).
    routing_note: str = ""
    # The target's declared internal precision per op in this switch state (Target.precision).
    precision: dict[str, str] = field(default_factory=dict)
    # How the target's ops may be called (Target.modes: "eager", "compiled"), and why the others
    # do not apply (Target.unsupported_modes): a mode a space asks for and the target does not
    # support is reported "not applicable" with that reason (model/modes.py).
    modes: tuple[str, ...] = ("eager", "compiled")
    unsupported_modes: dict[str, str] = field(default_factory=dict)
