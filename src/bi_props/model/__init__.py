"""The model of a test: cases, search spaces, op and property specs, bounds, comparison, judges.

Shared by both sides and free of torch: the controller draws cases (strategies.py and shapes.py use
Hypothesis) and judges observations with it; the worker reads op and property specs from it.
"""
