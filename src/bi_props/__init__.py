"""bi_props: a Hypothesis property-based differential tester for batch-invariant inference kernels.

The public API is re-exported here lazily, so that a worker process (which must import nothing from
Hypothesis or pytest) and the pytest plugin (which must stay cheap) pay only for what they use.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "Case": "bi_props.case",
    "Batch": "bi_props.case",
    "Companion": "bi_props.case",
    "OPS": "bi_props.catalogue",
    "OpSpec": "bi_props.catalogue",
    "Operand": "bi_props.catalogue",
    "Reference": "bi_props.catalogue",
    "register_op": "bi_props.catalogue",
    "registered_ops": "bi_props.catalogue",
    "sum_error": "bi_props.catalogue",
    "output_rounding": "bi_props.catalogue",
    "product_reference": "bi_props.catalogue",
    "bounded_amplitude": "bi_props.catalogue",
    "unit_roundoff": "bi_props.compare",
    "PropertySpec": "bi_props.property_spec",
    "register_property": "bi_props.property_spec",
    "registered_properties": "bi_props.property_spec",
    "Verdict": "bi_props.properties",
    "same_outputs": "bi_props.properties",
    "Call": "bi_props.observation",
    "Observation": "bi_props.observation",
    "run_op": "bi_props.execute",
    "ShapeContext": "bi_props.strategies",
    "PROPERTIES": "bi_props.strategies",
    "cases": "bi_props.strategies",
    "Space": "bi_props.space",
    "SpaceError": "bi_props.space",
    "load_space": "bi_props.space",
    "Runner": "bi_props.runner.controller",
    "WorkerCrash": "bi_props.runner.controller",
    "WorkerHang": "bi_props.runner.controller",
    "Session": "bi_props.session",
    "Finding": "bi_props.session",
    "PropertyFailed": "bi_props.session",
}

__all__ = [*_EXPORTS, "__version__"]

_LIVE = ("PROPERTIES",)
"""Derived from a registry on each access (a property registered later is in it): never cached."""


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'bi_props' has no attribute {name!r}")
    attr = "load" if name == "load_space" else name
    value = getattr(importlib.import_module(module), attr)
    if name not in _LIVE:
        globals()[name] = value
    return value
