"""The Target contract, re-exported where targets have always imported it from: it lives in
``bi_props.model.target`` (the layer below), so that the model and the worker's execution can
name it without importing a target."""

from __future__ import annotations

from ..model.target import (
    BUILTIN_TARGETS,
    STOCK_PRECISION,
    SWITCH_ENV,
    Target,
    TargetBroken,
    TargetMissing,
    cpu_stock_precision,
    stock_precision,
    switch_requested,
)

__all__ = [
    "BUILTIN_TARGETS",
    "STOCK_PRECISION",
    "SWITCH_ENV",
    "Target",
    "TargetBroken",
    "TargetMissing",
    "cpu_stock_precision",
    "stock_precision",
    "switch_requested",
]
