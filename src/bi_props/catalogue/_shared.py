"""Helpers more than one op family uses (operands, entry lookup, reproducer text)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..model.case import Case
from ..model.opspec import (
    Operand,
)


def _x_operand(case: Case) -> tuple[Operand, ...]:
    return (Operand("input", 0),)


def _x_shape(case: Case, rows: int) -> tuple[tuple[int, ...], ...]:
    return ((rows, *case.shape[1:]),)


def _rows_padded(case: Case) -> bool:
    """``OpSpec.padded`` of ops whose every row is computed on its own (norms, activations):
    any case may take the padded layout."""
    return True


def _never_exact(case: Case, acc: str = "float32") -> int:
    return 0


def _entry_function(entry: str) -> Callable[..., Any]:
    """The entry point ``module.attr`` looked up now (a swapped ``bi_props.ops`` attribute, or a
    target's own kernel named by its ``entries()``, shows). A module imported already is read
    from ``sys.modules``: Dynamo traces that lookup in a compiled case (``Case.mode``), where it
    refuses ``importlib.import_module``."""
    import sys

    module_name, _, attr = entry.rpartition(".")
    module = sys.modules.get(module_name)
    if module is None:
        import importlib

        module = importlib.import_module(module_name)
    return getattr(module, attr)


def _stock_or_import(case: Case, stock: str, name: str) -> str:
    module, _, attr = case.entry.rpartition(".")
    return stock if module == "bi_props.ops" else f"from {module} import {attr} as {name}\n"


def _dtype_kw(case: Case) -> str:
    dtype = case.opt("dtype")
    return f"torch.{dtype}" if dtype else "None"


def _fixed_repro(expression: str) -> Callable[[Case], tuple[str, str]]:
    def repro_call(case: Case) -> tuple[str, str]:
        return "", expression

    return repro_call


Shape = tuple[tuple[int, ...], dict[str, Any]]
