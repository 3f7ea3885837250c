"""Pure logic of the ``ascend`` target: what vllm-ascend's switch installs, per version and backend.

Nothing here imports torch, torch_npu or vllm-ascend, so all of it is unit-tested on any machine and
shared by the adapter (targets/ascend.py) and the source contract check
(bi_props/integrations/contract.py).

Where the facts come from (read, not run on an NPU):

- ``vllm_ascend/batch_invariant.py`` of the vllm-ascend 0.23.0 wheel (PyPI), lines 31-39 (Triton
  imports), 42-47 (``HAS_ASCENDC_BATCH_INVARIANT``), 50-73 (``add_rms_norm``, ``reduce_sum``), 76-93
  (``override_envs_for_invariance``), 99-137 (``enable_batch_invariant_mode``: the registrations),
  140-163 (``init_batch_invariance``); ``contract.check_contract`` re-derives the registrations from
  any source tree and compares them with :func:`registrations`, so this table cannot drift silently;
- the same file at the git tags v0.13.0rc2 .. v0.25.1rc1 and in the PyPI releases 0.26.0rc1 (wheel),
  0.27.1rc1, 0.28.0rc1, 0.29.0rc1, 0.30.0rc1, 0.30.0rc2 (sdists): the version thresholds below;
- the project's UPSTREAM.md for what no published source shows (marked UNVERIFIED below):
  ``torch_npu.npu.set_deterministic_level`` (torch_npu >= 26.2.0, CANN >= 9.2.0);
- PyTorch's dispatcher, checked on CPU with the same ``Library("aten", "IMPL").impl`` calls on the
  CPU key (torch 2.13): ``impl("aten::sum")`` names only the full-reduction overload,
  ``impl("aten::softmax")`` names no existing overload, and a non-default ``beta``/``alpha`` of
  ``addmm`` arrives as a keyword argument.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace

from .ascend_calls import (
    ADAPTER_MODULE,
    ADAPTERS_SINCE,
    CAUSAL_MASK_SIZE,
    CAUSAL_SPARSE_MODE,
    ENGINE_ENTRIES,
    ENTRIES,
    FIA_TENSOR_KEYWORDS,
    KV_CACHE_BLOCK_SIZE,
    MOE_GATING_MIN_EXPERTS,
    NO_CACHE_BLOCK_SIZE,
    PAGED_DECODE_TENSOR_KEYWORDS,
    chunked_prefill_arguments,
    entries_for,
    fia_arguments,
    fia_keywords,
    moe_gating_arguments,
    moe_init_routing_arguments,
    moe_mlp_arguments,
    paged_decode_arguments,
)
from .ascend_versions import (
    ASCEND_CONFIG_SINCE,
    ASCENDC_SINCE,
    ATEN_SUM_BEFORE,
    DETERMINISTIC_CANN_SINCE,
    DETERMINISTIC_LEVEL,
    DETERMINISTIC_TORCH_NPU_SINCE,
    FIRST_VERSION,
    REDUCE_SUM_DTYPE_SINCE,
    REFERENCE_VERSION,
    SOFTMAX_SINCE,
    SWAPS_SINCE,
    TENSOR_SUM_SINCE,
    in_range,
    version_at_least,
    version_key,
)

# ---------------------------------------------------------------------------------------------
# Capabilities and registrations

KERNEL_PREFIX = "batch_invariant_ops::"
BI_MODULE = "vllm_ascend.batch_invariant"
CONFIG_MODULE = "vllm_ascend.ascend_config"
TRITON_MATMUL = "vllm_ascend.ops.triton.batch_invariant.matmul"
TRITON_SOFTMAX = "vllm_ascend.ops.triton.batch_invariant.softmax"
ASCENDC_OPS = "torch.ops.batch_invariant_ops"
DISPATCH_KEY = "NPU"


@dataclass(frozen=True)
class Capabilities:
    """What the installed stack offers, as vllm-ascend itself sees it (plus versions)."""

    has_ascendc: bool  # vllm_ascend.batch_invariant.HAS_ASCENDC_BATCH_INVARIANT
    has_triton: bool  # vllm_ascend.batch_invariant.HAS_TRITON (vllm.triton_utils)
    vllm_ascend: str | None = None
    torch_npu: str | None = None
    cann: str | None = None

    @property
    def backend(self) -> str | None:
        if self.has_ascendc and self.has_triton:
            return "ascendc+triton"
        if self.has_ascendc:
            return "ascendc"
        return "triton" if self.has_triton else None

    def as_dict(self) -> dict[str, str]:
        return {
            "HAS_ASCENDC_BATCH_INVARIANT": str(self.has_ascendc),
            "HAS_TRITON": str(self.has_triton),
            "vllm_ascend": self.vllm_ascend or "unknown",
            "torch_npu": self.torch_npu or "unknown",
            "cann": self.cann or "unknown",
            "backend": self.backend or "none",
        }


@dataclass(frozen=True)
class Registration:
    """One thing ``enable_batch_invariant_mode()`` installs.

    ``target`` is ``aten::<op>`` (re-registered on the NPU dispatch key) or a dotted attribute
    (``torch.sum``) replaced by ``implementation`` (a dotted name).
    """

    target: str
    implementation: str
    backend: str  # "ascendc" | "triton"

    @property
    def kind(self) -> str:
        return "aten" if self.target.startswith("aten::") else "swap"

    @property
    def events(self) -> tuple[str, ...]:
        """Profiler events one call through this registration records (empty: none by name)."""
        name = self.implementation.rpartition(".")[2]
        if self.implementation.startswith(ASCENDC_OPS + "."):
            return (KERNEL_PREFIX + name,)
        if self.implementation == f"{BI_MODULE}.reduce_sum":
            # reduce_sum calls the AscendC kernel when dim is given (or the input is 1-D).
            return (KERNEL_PREFIX + "npu_reduce_sum_batch_invariant",)
        return ()  # Triton kernels and add_rms_norm: no stable event of their own


def _triton(target: str, module: str, name: str) -> Registration:
    return Registration(target, f"{module}.{name}", "triton")


def _ascendc(target: str, name: str) -> Registration:
    return Registration(target, f"{ASCENDC_OPS}.{name}", "ascendc")


def init_enables(caps: Capabilities) -> bool:
    """Whether ``init_batch_invariance()`` registers anything when the switch is on (else it only
    logs a warning): Triton or AscendC since 0.15, Triton alone before."""
    if not in_range(caps.vllm_ascend, since=ASCENDC_SINCE):
        return caps.has_triton
    return caps.has_triton or caps.has_ascendc


def registrations(caps: Capabilities) -> tuple[Registration, ...]:
    """What ``enable_batch_invariant_mode()`` installs for these capabilities, in source order.

    Independent of the switch: ``init_batch_invariance()`` calls it only when :func:`init_enables`.
    """
    v, out = caps.vllm_ascend, []
    if not in_range(v, since=ASCENDC_SINCE):  # 0.13-0.14: Triton, unconditional (init gates it)
        for op in ("mm", "addmm", "matmul", "linear", "bmm"):
            out.append(_triton(f"aten::{op}", TRITON_MATMUL, f"{op}_batch_invariant"))
        return tuple(out)
    if caps.has_triton:
        out.append(_triton("aten::addmm", TRITON_MATMUL, "addmm_batch_invariant"))
        out.append(_triton("aten::bmm", TRITON_MATMUL, "bmm_batch_invariant"))
        if in_range(v, since=SOFTMAX_SINCE):
            out.append(_triton("aten::softmax", TRITON_SOFTMAX, "softmax_batch_invariant"))
            out.append(_triton("aten::_softmax", TRITON_SOFTMAX, "softmax_batch_invariant"))
    if caps.has_ascendc:
        out.append(_ascendc("aten::mm", "npu_mm_batch_invariant"))
        out.append(_ascendc("aten::matmul", "npu_matmul_batch_invariant"))
        if in_range(v, before=ATEN_SUM_BEFORE):
            out.append(_ascendc("aten::sum", "npu_reduce_sum_batch_invariant"))
        out.append(
            _ascendc(
                "torch_npu.npu_fused_infer_attention_score",
                "npu_fused_infer_attention_score_batch_invariant",
            )
        )
        if in_range(v, since=SWAPS_SINCE):
            out.append(
                Registration("torch_npu.npu_add_rms_norm", f"{BI_MODULE}.add_rms_norm", "ascendc")
            )
            out.append(Registration("torch.sum", f"{BI_MODULE}.reduce_sum", "ascendc"))
        if in_range(v, since=TENSOR_SUM_SINCE):
            out.append(Registration("torch.Tensor.sum", f"{BI_MODULE}.reduce_sum", "ascendc"))
    elif caps.has_triton:
        for op in ("mm", "matmul", "linear"):
            out.append(_triton(f"aten::{op}", TRITON_MATMUL, f"{op}_batch_invariant"))
    return tuple(out)


# ---------------------------------------------------------------------------------------------
# The routing table: catalogue op -> Route

# Which registrations serve which catalogue op. linear is composite: aten::linear when registered,
# else it decomposes (2-D input with bias -> aten::addmm, otherwise -> aten::matmul).
_OP_TARGETS: dict[str, tuple[str, ...]] = {
    "mm": ("aten::mm",),
    "matmul": ("aten::matmul",),
    "bmm": ("aten::bmm",),
    "addmm": ("aten::addmm",),
    "linear": ("aten::linear",),
    "sum": ("aten::sum", "torch.sum", "torch.Tensor.sum"),
    "softmax": ("aten::softmax", "aten::_softmax"),
    "add_rms_norm": ("torch_npu.npu_add_rms_norm",),
    "attention": ("torch_npu.npu_fused_infer_attention_score",),
    # Engine ops whose adapter (ascend_ops) calls a function the switch swaps, looked up at call
    # time: vLLM's fused_add_rms_norm is AscendRMSNorm's npu_add_rms_norm branch, paged decode is
    # forward_fused_infer_attention's DecodeOnly call, a mixed batch its ChunkedPrefill call.
    # Claimed only where the catalogue has them.
    "fused_add_rms_norm": ("torch_npu.npu_add_rms_norm",),
    "paged_decode_attention": ("torch_npu.npu_fused_infer_attention_score",),
    "mixed_attention": ("torch_npu.npu_fused_infer_attention_score",),
}
_LINEAR_DECOMPOSED = ("aten::addmm", "aten::matmul")


@dataclass(frozen=True)
class Route:
    """How one catalogue op reaches vllm-ascend's batch-invariant kernels (when the switch is on).

    ``events``: profiler events of which at least one must appear (empty: no stable name, e.g. a
    Triton kernel or a Python-level replacement; then identity/registration evidence decides).
    ``side_events`` should also appear and ``absent_events`` must not (informational, read by
    :func:`interpret_profiler`; names as the seed's NPU test expected them, UNVERIFIED).
    ``gaps``: entry points or arguments known from the source not to reach the kernels.
    ``backend`` None: the switch is on but nothing is installed, the op cannot be routed.
    """

    op: str
    backend: str | None
    registrations: tuple[Registration, ...]
    events: tuple[str, ...] = ()
    side_events: tuple[str, ...] = ()
    absent_events: tuple[str, ...] = ()
    gaps: tuple[str, ...] = ()

    @property
    def aten(self) -> tuple[str, ...]:
        """The aten ops re-registered on the NPU dispatch key for this op."""
        return tuple(r.target for r in self.registrations if r.kind == "aten")

    @property
    def swaps(self) -> tuple[tuple[str, str], ...]:
        """(attribute, replacement) pairs of Python-level swaps for this op."""
        return tuple((r.target, r.implementation) for r in self.registrations if r.kind == "swap")


def _gaps(op: str, regs: Sequence[Registration], caps: Capabilities) -> tuple[str, ...]:
    targets = {r.target for r in regs}
    gaps: list[str] = []
    if op == "sum":
        if "torch.Tensor.sum" not in targets:
            gaps.append(
                "Tensor.sum(dim=...) dispatches to aten::sum.dim_IntList, which is not"
                " re-registered (impl('aten::sum') names only the full-reduction overload);"
                f" torch.Tensor.sum is swapped only from {TENSOR_SUM_SINCE}"
            )
        if "torch.sum" in targets:
            if in_range(caps.vllm_ascend, since=REDUCE_SUM_DTYPE_SINCE):
                gaps.append(
                    "reduce_sum uses the AscendC kernel only for the last dim of fp16/bf16/fp32 NPU"
                    " tensors without dtype=: other dims, tuples of dims, dim=None on rank > 1 and"
                    " dtype= fall back to the stock torch.sum"
                )
            else:
                gaps.append(
                    "torch.sum(x) with dim=None on a tensor of rank > 1: reduce_sum falls back to"
                    " the stock torch.sum; a dtype= argument raises TypeError (reduce_sum has no"
                    " dtype parameter)"
                )
    if op == "softmax" and "aten::softmax" in targets:
        gaps.append(
            "impl('aten::softmax') names no existing overload (softmax.int, softmax.Dimname): that"
            " registration is inert; softmax reaches the Triton kernel through aten::_softmax,"
            " whose half_to_float argument arrives as softmax_batch_invariant's dtype"
        )
    if op == "addmm" and any(r.backend == "triton" for r in regs):
        gaps.append(
            "addmm_batch_invariant(bias, a, b) has no beta/alpha parameters: a non-default beta or"
            " alpha reaches it as a keyword argument"
        )
    if op == "linear" and "aten::linear" not in targets and "aten::addmm" not in targets:
        gaps.append(
            "linear with a 2-D input and a bias decomposes to aten::addmm, which has no"
            " batch-invariant kernel without Triton"
        )
    return tuple(gaps)


def _route(op: str, regs: tuple[Registration, ...], caps: Capabilities) -> Route:
    backends = {r.backend for r in regs}
    backend = backends.pop() if len(backends) == 1 else "mixed"
    observable = all(r.events for r in regs)
    events = tuple(dict.fromkeys(e for r in regs for e in r.events)) if observable else ()
    side: tuple[str, ...] = ()
    absent: tuple[str, ...] = ()
    if op in ("add_rms_norm", "fused_add_rms_norm"):
        side, absent = ("npu::npu_rms_norm",), ("npu::npu_add_rms_norm",)
    return Route(op, backend, regs, events, side, absent, _gaps(op, regs, caps))


def routing_table(caps: Capabilities) -> dict[str, Route]:
    """Catalogue op -> Route, for the ops vllm-ascend makes batch-invariant with these capabilities.

    With neither Triton nor AscendC the switch installs nothing (``init_batch_invariance`` only
    warns), yet the ops the version would cover with both are still claimed, each with a Route of
    backend None: the routing property then fails for each of them, as a half-installed switch must.
    """
    if not init_enables(caps):
        full = routing_table(replace(caps, has_ascendc=True, has_triton=True))
        return {
            op: Route(
                op,
                None,
                (),
                gaps=(
                    "neither Triton nor the AscendC batch_invariant_ops"
                    " package is available: init_batch_invariance() only"
                    " logs a warning",
                ),
            )
            for op in full
        }
    by_target = {r.target: r for r in registrations(caps)}
    table: dict[str, Route] = {}
    for op, targets in _OP_TARGETS.items():
        if op == "linear" and "aten::linear" not in by_target:
            targets = _LINEAR_DECOMPOSED
        regs = tuple(by_target[t] for t in targets if t in by_target)
        if regs:
            table[op] = _route(op, regs, caps)
    return table


# ---------------------------------------------------------------------------------------------
# Evidence: identity and registration checks, profiler interpretation


@dataclass(frozen=True)
class Check:
    """One piece of routing evidence the adapter evaluates in the worker (True = installed).

    kind "registration": ``target`` is the torch.library key ``aten/<op>/NPU`` looked up in
    ``vllm_ascend.batch_invariant._batch_invariant_LIB._op_impls``; kind "identity": ``target`` is
    the dotted attribute, compared with ``is`` to the dotted ``expected``; kind "backend": a
    batch-invariant backend is available at all; kind "cann_level": the CANN deterministic level.
    """

    name: str
    kind: str
    target: str = ""
    expected: str = ""


def library_key(aten_op: str, dispatch_key: str = DISPATCH_KEY) -> str:
    """The key torch.library.Library.impl records in ``_op_impls`` (``aten/mm/NPU``)."""
    ns, _, name = aten_op.partition("::")
    return f"{ns}/{name}/{dispatch_key}"


def evidence_checks(route: Route | None) -> tuple[Check, ...]:
    if route is None:
        return ()
    if route.backend is None:
        return (
            Check(
                "a batch-invariant backend is installed"
                " (HAS_ASCENDC_BATCH_INVARIANT or HAS_TRITON)",
                "backend",
            ),
        )
    checks = []
    for r in route.registrations:
        if r.kind == "aten":
            checks.append(
                Check(
                    f"{r.target} registered on NPU by vllm-ascend",
                    "registration",
                    library_key(r.target),
                )
            )
        else:
            checks.append(
                Check(f"{r.target} is {r.implementation}", "identity", r.target, r.implementation)
            )
    return tuple(checks)


CANN_CHECK = Check(f"torch_npu deterministic level is {DETERMINISTIC_LEVEL}", "cann_level")


def evaluate_checks(
    checks: Iterable[Check],
    *,
    registered: Callable[[str], bool],
    same: Callable[[str, str], bool],
    backend: bool,
    cann_level: int | None = None,
) -> dict[str, bool]:
    """Evaluate checks with the worker's lookups (pure given the callables)."""
    out: dict[str, bool] = {}
    for c in checks:
        if c.kind == "registration":
            out[c.name] = bool(registered(c.target))
        elif c.kind == "identity":
            out[c.name] = bool(same(c.target, c.expected))
        elif c.kind == "backend":
            out[c.name] = bool(backend)
        elif c.kind == "cann_level":
            out[c.name] = cann_level == DETERMINISTIC_LEVEL
    return out


@dataclass(frozen=True)
class ProfilerReading:
    """What profiler events say about one call. ``proven``: True (routed), False (not routed or,
    disabled, leaked), None (events cannot decide: rely on identity/registration evidence)."""

    proven: bool | None
    reached: tuple[str, ...]
    message: str


def kernel_events(events: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(e for e in events if e.startswith(KERNEL_PREFIX)))


def interpret_profiler(
    events: Sequence[str], route: Route | None, enabled: bool
) -> ProfilerReading:
    """Judge a call's profiler event names against its route.

    Disabled: any ``batch_invariant_ops::`` event is a leak (the seed's rule: zero such events).
    Enabled: one of ``route.events`` must appear and no ``absent_events``; a route without event
    names (Triton, Python swaps) cannot be proven by events.
    """
    reached = kernel_events(events)
    if not enabled:
        if reached:
            return ProfilerReading(False, reached, f"switch leak: disabled, yet {list(reached)}")
        return ProfilerReading(True, reached, f"no {KERNEL_PREFIX} event while disabled")
    if route is None:
        return ProfilerReading(None, reached, "op not covered by the target")
    if route.backend is None:
        return ProfilerReading(False, reached, "no batch-invariant backend installed")
    bad = [e for e in route.absent_events if e in events]
    if bad:
        return ProfilerReading(False, reached, f"{bad} appeared: the stock fused kernel ran")
    if not route.events:
        return ProfilerReading(
            None,
            reached,
            f"{route.backend} route has no stable event name: judge by identity/registration",
        )
    seen = [e for e in route.events if e in events]
    if seen:
        return ProfilerReading(True, reached, f"routed: {seen}")
    return ProfilerReading(
        False, reached, f"none of {list(route.events)} appeared; kernel events: {list(reached)}"
    )


# ---------------------------------------------------------------------------------------------
# What the adapter relies on in vllm-ascend (checked against source trees by
# bi_props.integrations.contract)


@dataclass(frozen=True)
class Requirement:
    """A module-level symbol of vllm-ascend the adapter uses.

    kind "function": a ``def`` whose parameters accept the call ``signature`` (a Python parameter
    list: the names the adapter passes, in order, and the defaults it relies on; further parameters
    must have defaults); kind "name": assigned or imported at module level.
    """

    module: str
    symbol: str
    kind: str
    signature: str | None = None
    since: str | None = None
    before: str | None = None
    why: str = ""

    def applies(self, version: str | None) -> bool:
        return in_range(version, self.since, self.before)


INIT = Requirement(
    BI_MODULE,
    "init_batch_invariance",
    "function",
    "()",
    why="activate() calls it with no arguments: the real switch",
)
ENABLE = Requirement(
    BI_MODULE,
    "enable_batch_invariant_mode",
    "function",
    "()",
    why="its registrations are the routing table",
)
OVERRIDE = Requirement(
    BI_MODULE,
    "override_envs_for_invariance",
    "function",
    "()",
    why="called by init_batch_invariance; needs the engine config",
)
HAS_ASCENDC = Requirement(
    BI_MODULE,
    "HAS_ASCENDC_BATCH_INVARIANT",
    "name",
    since=ASCENDC_SINCE,
    why="capability read by the adapter",
)
HAS_TRITON = Requirement(BI_MODULE, "HAS_TRITON", "name", why="capability read by the adapter")
LIBRARY = Requirement(
    BI_MODULE,
    "_batch_invariant_LIB",
    "name",
    why="registration evidence and switch_state()['active']",
)
ADD_RMS_NORM = Requirement(
    BI_MODULE,
    "add_rms_norm",
    "function",
    "(x, residual, weight, eps)",
    since=SWAPS_SINCE,
    why="identity evidence; called as npu_add_rms_norm",
)
REDUCE_SUM = Requirement(
    BI_MODULE,
    "reduce_sum",
    "function",
    "(x, dim=None, keepdim=False)",
    since=SWAPS_SINCE,
    why="identity evidence; called as torch.sum",
)
GET_CONFIG = Requirement(
    CONFIG_MODULE,
    "get_ascend_config",
    "function",
    "()",
    since=ASCEND_CONFIG_SINCE,
    why="patched with a stand-in when no engine config exists",
)

ROPE_FORWARD = Requirement(
    "vllm_ascend.ops.rotary_embedding",
    "rope_forward_oot",
    "function",
    "(positions, query, key, cos_sin_cache, head_size, rotary_dim, is_neox_style)",
    since=ADAPTERS_SINCE,
    why="rotary_embedding's adapter calls it (AscendRotaryEmbedding's custom op runs it)",
)

REQUIREMENTS: tuple[Requirement, ...] = (
    INIT,
    ENABLE,
    OVERRIDE,
    HAS_ASCENDC,
    HAS_TRITON,
    LIBRARY,
    ADD_RMS_NORM,
    REDUCE_SUM,
    GET_CONFIG,
    ROPE_FORWARD,
)


@dataclass(frozen=True)
class CallUse:
    """A torch_npu (or vllm-ascend) call an adapter makes, and where vllm-ascend makes it too.

    The contract check looks in ``files`` (paths under the tree, a folder meaning every file in
    it), inside a ``def`` named ``function`` where one is given (the call site the adapter mirrors),
    for one call of any of ``callees`` (dotted, through the file's imports) with exactly
    ``positional`` positional arguments, every keyword of ``keywords``, and the literal value of
    each keyword in ``constants``: the adapter uses only names, keywords and modes upstream uses.
    """

    callees: tuple[str, ...]
    files: tuple[str, ...]
    positional: int
    keywords: frozenset[str] = frozenset()
    constants: tuple[tuple[str, object], ...] = ()
    adapter: str = ""
    function: str = ""
    since: str | None = ADAPTERS_SINCE
    before: str | None = None

    @property
    def name(self) -> str:
        return self.callees[0].rpartition(".")[2]

    def applies(self, version: str | None) -> bool:
        return in_range(version, self.since, self.before)


def _use(
    callee: str,
    files: tuple[str, ...],
    positional: int,
    adapter: str,
    keywords: Iterable[str] = (),
    constants: dict[str, object] | None = None,
    via: tuple[str, ...] = (),
    function: str = "",
) -> CallUse:
    constants = constants or {}
    return CallUse(
        (callee, *via),
        files,
        positional,
        frozenset(keywords) | frozenset(constants),
        tuple(sorted(constants.items())),
        adapter,
        function,
    )


_LAYERNORM = ("vllm_ascend/ops/layernorm.py",)
_DEVICE_OP = ("vllm_ascend/device/device_op.py",)
_MOE_MLP = ("vllm_ascend/ops/fused_moe/moe_mlp.py",)
_PAGED = paged_decode_arguments([1], 1, 1, 1, 1, 1.0)
_CHUNKED = chunked_prefill_arguments([1], [1], 1, 1, 1, 1, 1.0, True)
_GATING = moe_gating_arguments(1)
_ROUTING = moe_init_routing_arguments(1, 1, 1)
_MLP = moe_mlp_arguments(None)

CALL_USES: tuple[CallUse, ...] = (
    _use("torch_npu.npu_rms_norm", _LAYERNORM, 3, "npu_rms_norm", function="forward_oot"),
    _use(
        "torch_npu.npu_add_rms_norm",
        _LAYERNORM,
        4,
        "npu_fused_add_rms_norm",
        function="forward_oot",
    ),
    _use(
        "torch_npu.npu_swiglu",
        ("vllm_ascend/ops/activation.py",),
        1,
        "npu_silu_and_mul",
        function="forward_oot",
    ),
    _use(
        "torch_npu.npu_fused_infer_attention_score",
        ("vllm_ascend/attention/attention_v1.py",),
        0,
        "npu_paged_decode_attention",
        keywords=(*PAGED_DECODE_TENSOR_KEYWORDS, *_PAGED),
        constants={"input_layout": "TND", "sparse_mode": CAUSAL_SPARSE_MODE},
        via=("vllm_ascend.device.device_op.DeviceOperator.npu_fused_infer_attention_score",),
        function="forward_fused_infer_attention",
    ),
    _use(
        "torch_npu.npu_fused_infer_attention_score",
        ("vllm_ascend/attention/attention_v1.py",),
        0,
        "npu_mixed_attention",
        keywords=(*PAGED_DECODE_TENSOR_KEYWORDS, *_CHUNKED),
        constants={"input_layout": "TND", "sparse_mode": CAUSAL_SPARSE_MODE},
        via=("vllm_ascend.device.device_op.DeviceOperator.npu_fused_infer_attention_score",),
        function="forward_fused_infer_attention",
    ),
    # A non-causal mixed batch: the same call's branch for attn_metadata.causal False.
    _use(
        "torch_npu.npu_fused_infer_attention_score",
        ("vllm_ascend/attention/attention_v1.py",),
        0,
        "npu_mixed_attention",
        keywords=("query", "key", "value", "block_table", *_CHUNKED),
        constants={"input_layout": "TND", "sparse_mode": 0},
        via=("vllm_ascend.device.device_op.DeviceOperator.npu_fused_infer_attention_score",),
        function="forward_fused_infer_attention",
    ),
    # DeviceOperator.npu_fused_infer_attention_score forwards the rest through **kwargs.
    _use(
        "torch_npu.npu_fused_infer_attention_score",
        _DEVICE_OP,
        0,
        "npu_paged_decode_attention",
        keywords=("query", "key", "value", "num_key_value_heads", "num_heads", "scale"),
        function="npu_fused_infer_attention_score",
    ),
    # The modes come from two places: the literal in device_op's torch_npu call, and those its
    # callers pass (experts_selector for gating, the all-gather dispatcher for init routing).
    _use(
        "torch_npu.npu_moe_gating_top_k",
        _DEVICE_OP,
        1,
        "npu_fused_moe",
        keywords=_GATING,
        constants={"renorm": 0},
        function="moe_gating_top_k",
    ),
    _use(
        "vllm_ascend.device.device_op.DeviceOperator.moe_gating_top_k",
        ("vllm_ascend/ops/fused_moe/experts_selector.py",),
        1,
        "npu_fused_moe",
        keywords=set(_GATING) - {"bias"},
        constants={"group_select_mode": 1, "eps": 1e-20},
        function="_select_experts_with_fusion_ops",
    ),
    _use(
        "torch_npu.npu_moe_init_routing_v2",
        _DEVICE_OP,
        2,
        "npu_fused_moe",
        keywords=_ROUTING,
        function="npu_moe_init_routing",
    ),
    _use(
        "vllm_ascend.device.device_op.DeviceOperator.npu_moe_init_routing",
        ("vllm_ascend/ops/fused_moe/token_dispatcher.py",),
        2,
        "npu_fused_moe",
        keywords=_ROUTING,
        constants={"expert_tokens_num_type": 1, "expert_tokens_num_flag": True},
        function="token_dispatch",
    ),
    _use(
        "torch_npu.npu_grouped_matmul",
        _MOE_MLP,
        0,
        "npu_fused_moe",
        keywords=("x", "weight", *_MLP),
        constants={"split_item": 2, "group_type": 0},
        function="unquant_apply_mlp",
    ),
    _use("torch_npu.npu_swiglu", _MOE_MLP, 1, "npu_fused_moe", function="unquant_apply_mlp"),
    _use(
        "torch_npu.npu_moe_token_unpermute",
        _DEVICE_OP,
        0,
        "npu_fused_moe",
        keywords=("permuted_tokens", "sorted_indices", "probs"),
        function="npu_moe_token_unpermute",
    ),
)
"""Every torch_npu call of the engine adapters (ascend_ops), with the vllm-ascend 0.23.0 file that
makes the same call; ``bi_props.integrations.contract`` fails on any it cannot find."""


def call_uses_for(version: str | None) -> tuple[CallUse, ...]:
    return tuple(c for c in CALL_USES if c.applies(version))


# The engine-config stand-in: the attributes override_envs_for_invariance() touches (0.20-0.30).
STANDIN_CONFIG: dict[str, object] = {"weight_nz_mode": 1, "enable_matmul_allreduce": False}


def requirements_for(version: str | None) -> tuple[Requirement, ...]:
    return tuple(r for r in REQUIREMENTS if r.applies(version))


# ---------------------------------------------------------------------------------------------
# check(): probes -> missing / broken / ready


@dataclass(frozen=True)
class Probe:
    """One piece of the stack as found in the worker: state "ok", "missing" or "broken"."""

    piece: str
    state: str
    detail: str = ""


INSTALL_HINTS: dict[str, str] = {
    "torch_npu": "pip install the torch-npu release matching the installed torch (vllm-ascend"
    " 0.23.0 pins torch==2.10.0 and torch-npu==2.10.0.post4)",
    "cann": "install the CANN toolkit and kernels for this NPU and `source"
    " /usr/local/Ascend/ascend-toolkit/set_env.sh` (or the nnal/atb set_env.sh) before starting, so"
    " that libhccl.so and friends are on LD_LIBRARY_PATH",
    "npu_device": "no NPU is visible: check the driver (`npu-smi info`) and"
    " ASCEND_RT_VISIBLE_DEVICES",
    "vllm": "pip install the vllm release that matches vllm-ascend (vllm-ascend wheels do not"
    " declare it; on NPU machines install vllm with VLLM_TARGET_DEVICE=empty)",
    "vllm_ascend": "pip install vllm-ascend (>= 0.15 for the AscendC kernels; the contract check"
    " reads 0.23.0)",
    "batch_invariant": f"vllm-ascend >= {FIRST_VERSION} is needed (vllm_ascend.batch_invariant)",
    "batch_invariant_ops": "install the AscendC batch_invariant_ops package: run its CANN .run"
    " installer and install its torch extension (it is not on PyPI); or set"
    " BI_PROPS_ASCEND_BACKEND=auto to test what vllm-ascend finds (Triton only, or nothing)",
    "deterministic_level": f"torch_npu.npu.set_deterministic_level needs torch_npu >="
    f" {DETERMINISTIC_TORCH_NPU_SINCE} and CANN >= {DETERMINISTIC_CANN_SINCE}; or use the default"
    " switch (BI_PROPS_ASCEND_SWITCH=vllm)",
}

_MODULE_PIECES = {
    "torch_npu": "torch_npu",
    "vllm": "vllm",
    "vllm_ascend": "vllm_ascend",
    "batch_invariant_ops": "batch_invariant_ops",
}
_SHARED_LIBRARY = re.compile(r"\.so\b|shared object|cannot open|undefined symbol", re.IGNORECASE)


def classify_import_failure(piece: str, module: str, exc: BaseException) -> Probe:
    """Missing or broken, from the exception an import raised (pure over the exception).

    A ModuleNotFoundError names what is absent: the module itself or one of its dependencies
    (``vllm`` under vllm_ascend...); an ImportError of a shared library while importing torch_npu
    means the CANN toolkit is not set up; anything else is a broken install.
    """
    message = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, ModuleNotFoundError):
        absent = exc.name or ""
        if absent == module or module.startswith(absent + ".") or not absent:
            if module == BI_MODULE and absent == BI_MODULE:
                return Probe("batch_invariant", "missing", message)
            return Probe(piece, "missing", message)
        top = absent.partition(".")[0]
        detail = f"{module} needs {absent}: {message}"
        return Probe(_MODULE_PIECES.get(top, piece), "missing", detail)
    if isinstance(exc, ImportError) and piece == "torch_npu" and _SHARED_LIBRARY.search(str(exc)):
        return Probe("cann", "missing", f"torch_npu is installed but cannot load: {message}")
    return Probe(piece, "broken", f"{module} failed to import: {message}")


def assess(probes: Sequence[Probe]) -> tuple[str, str]:
    """("ready" | "missing" | "broken", message naming each piece and how to install it)."""
    broken = [p for p in probes if p.state == "broken"]
    missing = [p for p in probes if p.state == "missing"]
    if not broken and not missing:
        return "ready", ""
    lines = []
    if broken:
        lines.append("the ascend target's stack is installed but broken:")
        lines += [f"  - {p.piece}: {p.detail}" for p in broken]
    if missing:
        lines.append("the ascend target cannot run here; missing:")
        for p in missing:
            lines.append(f"  - {p.piece}: {p.detail}")
            lines.append(f"    install: {INSTALL_HINTS.get(p.piece, '')}")
    return ("broken" if broken else "missing"), "\n".join(lines)


def cann_switch_problem(caps: Capabilities) -> str | None:
    """Why the CANN switch cannot be used, from versions alone (None: no objection)."""
    low = []
    if version_at_least(caps.torch_npu, DETERMINISTIC_TORCH_NPU_SINCE) is False:
        low.append(f"torch_npu {caps.torch_npu} < {DETERMINISTIC_TORCH_NPU_SINCE}")
    if version_at_least(caps.cann, DETERMINISTIC_CANN_SINCE) is False:
        low.append(f"CANN {caps.cann} < {DETERMINISTIC_CANN_SINCE}")
    return "; ".join(low) or None


@dataclass(frozen=True)
class Plan:
    """The table the adapter serves: covered ops, routes and evidence checks (pure)."""

    switch: str
    table: dict[str, Route] = field(default_factory=dict)
    covered: tuple[str, ...] = ()

    def routes(self) -> dict[str, tuple[str, ...]]:
        return {op: r.events for op, r in self.table.items()}

    def checks(self, op: str) -> tuple[Check, ...]:
        if self.switch == "cann":
            return (CANN_CHECK,) if op in self.covered else ()
        return evidence_checks(self.table.get(op))


def plan(caps: Capabilities, switch: str, catalogue_ops: Sequence[str]) -> Plan:
    """vllm switch: the routing table's ops; cann switch: the whole catalogue (level 3 promises
    batch consistency process-wide), routed by stock kernels with no event names."""
    if switch == "cann":
        return Plan("cann", {}, tuple(catalogue_ops))
    table = routing_table(caps)
    return Plan("vllm", table, tuple(op for op in catalogue_ops if op in table))


# The versions (ascend_versions.py) and the NPU calls (ascend_calls.py) are re-exported here.
__all__ = [
    "ADAPTERS_SINCE",
    "ADAPTER_MODULE",
    "ADD_RMS_NORM",
    "ASCENDC_OPS",
    "ASCENDC_SINCE",
    "ASCEND_CONFIG_SINCE",
    "ATEN_SUM_BEFORE",
    "BI_MODULE",
    "CALL_USES",
    "CANN_CHECK",
    "CAUSAL_MASK_SIZE",
    "CAUSAL_SPARSE_MODE",
    "CONFIG_MODULE",
    "DETERMINISTIC_CANN_SINCE",
    "DETERMINISTIC_LEVEL",
    "DETERMINISTIC_TORCH_NPU_SINCE",
    "DISPATCH_KEY",
    "ENABLE",
    "ENGINE_ENTRIES",
    "ENTRIES",
    "FIA_TENSOR_KEYWORDS",
    "FIRST_VERSION",
    "GET_CONFIG",
    "HAS_ASCENDC",
    "HAS_TRITON",
    "INIT",
    "INSTALL_HINTS",
    "KERNEL_PREFIX",
    "KV_CACHE_BLOCK_SIZE",
    "LIBRARY",
    "MOE_GATING_MIN_EXPERTS",
    "NO_CACHE_BLOCK_SIZE",
    "OVERRIDE",
    "PAGED_DECODE_TENSOR_KEYWORDS",
    "REDUCE_SUM",
    "REDUCE_SUM_DTYPE_SINCE",
    "REFERENCE_VERSION",
    "REQUIREMENTS",
    "ROPE_FORWARD",
    "SOFTMAX_SINCE",
    "STANDIN_CONFIG",
    "SWAPS_SINCE",
    "TENSOR_SUM_SINCE",
    "TRITON_MATMUL",
    "TRITON_SOFTMAX",
    "CallUse",
    "Capabilities",
    "Check",
    "Plan",
    "Probe",
    "ProfilerReading",
    "Registration",
    "Requirement",
    "Route",
    "assess",
    "call_uses_for",
    "cann_switch_problem",
    "chunked_prefill_arguments",
    "classify_import_failure",
    "entries_for",
    "evaluate_checks",
    "evidence_checks",
    "fia_arguments",
    "fia_keywords",
    "in_range",
    "init_enables",
    "interpret_profiler",
    "kernel_events",
    "library_key",
    "moe_gating_arguments",
    "moe_init_routing_arguments",
    "moe_mlp_arguments",
    "paged_decode_arguments",
    "plan",
    "registrations",
    "requirements_for",
    "routing_table",
    "version_at_least",
    "version_key",
]
