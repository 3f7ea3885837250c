"""The vocabulary of a test: cases, search spaces, the op and property records and their
registries, bounds, comparison, the judges, the switch promises and the Target contract.

The bottom layer, shared by both sides: it imports nothing of bi_props above it, and neither torch,
Hypothesis nor pytest at import (pyproject.toml's import-linter contracts). The built-in records
are data above it (``bi_props.catalogue``); the case strategies too (``catalogue/strategies.py``).
"""
