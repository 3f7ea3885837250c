"""The worker side: turns cases into tensors and runs them; also the switching property's own
interpreter.

Runs in worker processes; imports torch lazily and never imports Hypothesis or pytest.
"""
