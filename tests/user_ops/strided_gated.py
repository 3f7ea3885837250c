"""A target with a property of its own: ``layout_invariance``, for the op ``my_silu_and_mul``.

No built-in property compares memory layouts: batch invariance and determinism run the needle and
its batch in the same (drawn) layout, and the reference allows a few ulps. So a kernel that takes
another arithmetic path for a strided input passes them all, while a trainer that feeds a view
and an engine that feeds a contiguous copy get different bits. The property: the needle's output
with its operands in the drawn layout (transposed, offset, strided) == with them contiguous,
bitwise. With the switch off it is a negative control (the stock composite need not promise it).

The module reuses ``fused_gated``'s op and kernel (each row is made contiguous first, so the
layout cannot matter) and declares the property in ``EXTRA_PROPERTIES``: bi_props registers it in
the controller and in every worker, wherever this module is loaded.
"""

from __future__ import annotations

from fused_gated import SILU_AND_MUL, install, kernel, stock

from bi_props import PropertySpec, register_property, run_op, same_outputs

# -- the property, declared once for bi_props ---------------------------------------------------


def observe_layouts(case, target):
    """Worker side: the needle alone twice, in its drawn layouts and all contiguous."""
    drawn = run_op(case, target)  # the op's own exceptions are observed, not raised
    contiguous = run_op(case, target, layouts=False)
    calls = {"drawn": drawn, "contiguous": contiguous}
    return {"calls": calls, "evidence": {"layouts": case.layouts}}


def judge_layouts(observation):
    """Controller side: the two calls agree bit for bit (or raise alike)."""
    layouts = list(observation.evidence["layouts"])
    return same_outputs(
        observation.calls["drawn"],
        observation.calls["contiguous"],
        f"needle with operands {layouts} (actual) vs all contiguous (desired)",
    )


LAYOUT_INVARIANCE = PropertySpec(
    name="layout_invariance",
    observer=observe_layouts,
    judge=judge_layouts,
    description=(
        "the needle's output with its operands in the drawn memory layout (transposed, offset,"
        " strided) == with them contiguous, bitwise"
    ),
    control=True,  # switch off: a negative control, never a failure
    ops=("my_silu_and_mul",),  # without ops: the ops whose OpSpec.properties list it
    values=("general", "wide"),
)
EXTRA_PROPERTIES = [LAYOUT_INVARIANCE]
register_property(LAYOUT_INVARIANCE)  # optional here (bi_props registers EXTRA_PROPERTIES)

# -- the target ---------------------------------------------------------------------------------

NAMESPACE = "strided_gated"
KERNEL_PREFIX = f"{NAMESPACE}::"
ROUTES = {"my_silu_and_mul": (f"{NAMESPACE}::silu_and_mul",)}
OPS = ["my_silu_and_mul"]
EXTRA_OPS = [SILU_AND_MUL]
ENTRIES = {"my_silu_and_mul": (f"{__name__}.silu_and_mul",)}

_impl = stock


def silu_and_mul(x):
    return _impl(x)


def enable(enabled: bool) -> None:
    global _impl
    if enabled:
        _impl = install(NAMESPACE, kernel)
