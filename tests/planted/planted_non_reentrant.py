"""Planted two-way switch, bug class *non-re-entrant context manager* (for the ``switching``
property). Like ``planted_two_way``, but ``set_batch_invariant_mode`` is written as SGLang's and
thinking-machines' are: on exit it destroys the library whatever it found at entry and restores
only the saved flag, and it has no ``finally``. So ``with set_batch_invariant_mode(): ...`` inside
an enabled mode leaves the flag on with no override registered. Expected finding: switching."""

from __future__ import annotations

import contextlib

import planted_two_way as base

OPS = ["mm"]
enable_batch_invariant_mode = base.enable_batch_invariant_mode
_MODE = False


def disable_batch_invariant_mode() -> None:
    global _MODE
    base.disable_batch_invariant_mode()
    _MODE = False


def is_batch_invariant_mode_enabled() -> bool:
    return _MODE or base.is_batch_invariant_mode_enabled()


@contextlib.contextmanager
def set_batch_invariant_mode(enabled: bool = True):
    global _MODE
    old = (is_batch_invariant_mode_enabled(), base._LIB)
    (enable_batch_invariant_mode if enabled else disable_batch_invariant_mode)()
    yield  # BUG: no try/finally
    if base._LIB is not None:
        base._LIB._destroy()  # BUG: destroys the library it may not have created
    _MODE, base._LIB = old[0], old[1]
