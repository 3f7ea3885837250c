"""bi_props: a Hypothesis property-based differential tester for batch-invariant inference kernels.

The public API is re-exported here lazily, so that a worker process (which must import nothing from
Hypothesis or pytest) and the pytest plugin (which must stay cheap) pay only for what they use.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "Case": "bi_props.model.case",
    "Batch": "bi_props.model.case",
    "Companion": "bi_props.model.case",
    "OPS": "bi_props.model.op_registry",
    "OpSpec": "bi_props.model.opspec",
    "Operand": "bi_props.model.opspec",
    "ControlExample": "bi_props.model.opspec",
    "Reference": "bi_props.model.opspec",
    "register_op": "bi_props.model.op_registry",
    "registered_ops": "bi_props.model.op_registry",
    "sum_error": "bi_props.model.bounds",
    "output_rounding": "bi_props.model.bounds",
    "product_reference": "bi_props.model.bounds",
    "bounded_amplitude": "bi_props.model.bounds",
    "unit_roundoff": "bi_props.model.compare",
    "PropertySpec": "bi_props.model.property_spec",
    "register_property": "bi_props.model.property_spec",
    "registered_properties": "bi_props.model.property_spec",
    "Verdict": "bi_props.model.verdict",
    "same_outputs": "bi_props.model.properties",
    "Call": "bi_props.model.observation",
    "Observation": "bi_props.model.observation",
    "run_op": "bi_props.execution.execute",
    "ShapeContext": "bi_props.catalogue.strategies",
    "PROPERTIES": "bi_props.catalogue.strategies",
    "cases": "bi_props.catalogue.strategies",
    "control_cases": "bi_props.catalogue.strategies",
    "Space": "bi_props.model.space",
    "SpaceError": "bi_props.model.space",
    "load_space": "bi_props.model.space",
    "Runner": "bi_props.runner.controller",
    "WorkerCrash": "bi_props.runner.controller",
    "WorkerHang": "bi_props.runner.controller",
    "Session": "bi_props.campaigns.session",
    "Finding": "bi_props.campaigns.session",
    "PropertyFailed": "bi_props.campaigns.session",
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
