"""The property suite itself, collected from the checkout: `pytest --hypothesis-profile=cpu` runs it
against the built-in CPU target with the switch enabled and disabled."""

from bi_props.suite.test_properties import (
    test_batch_variance_control,
    test_property,
    test_regression,
)

__all__ = ["test_batch_variance_control", "test_property", "test_regression"]
