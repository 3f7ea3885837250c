"""The worker side: turns cases into tensors and runs them (the observers, the probe model).

Runs in worker processes; imports only ``bi_props.model``, torch lazily, and never Hypothesis or
pytest (import-linter holds it). The switching property's interpreter imports Hypothesis: it lives
in ``bi_props.runner.switching``.
"""
