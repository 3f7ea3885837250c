"""bi_props's own CPU kernels, batch-invariant by construction (see primitives.py for the rules).

They are the project's reference "correct library": ``install()`` routes the stock aten CPU entry
points through them, one-way, for the whole process.
"""

from .register import install

__all__ = ["install"]
