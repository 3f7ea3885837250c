"""Spawn-isolated execution: one long-lived worker process per (target, switch state)."""
