"""The ``ascend`` target: vllm-ascend's batch-invariant switch on an Ascend NPU.

NOT VERIFIED ON NPU HARDWARE. Written against the published vllm-ascend source (the 0.23.0 wheel;
git tags 0.13-0.25; PyPI releases up to 0.30.0rc2) and torch_npu's documented API; its pure logic
lives in ascend_routes.py (unit tested) and the vllm-ascend symbols it relies on are checked against
source trees by ``bi_props.integrations.contract``.

Two switches, chosen with ``BI_PROPS_ASCEND_SWITCH``:

- ``vllm`` (default): the real upstream switch. The controller sets ``VLLM_BATCH_INVARIANT`` before
  the worker starts; ``activate()`` calls ``vllm_ascend.batch_invariant.init_batch_invariance()`` in
  both states (disabled, it must install nothing), after standing in for the engine config that
  ``override_envs_for_invariance()`` reads (only when calling ``get_ascend_config()`` raises).
- ``cann``: ``torch_npu.npu.set_deterministic_level(3)`` (batch consistency; torch_npu >= 26.2.0,
  CANN >= 9.2.0) when the switch is on, instead of vllm-ascend's kernels.

``BI_PROPS_ASCEND_BACKEND``: ``ascendc`` (default) requires the AscendC ``batch_invariant_ops``
package, so a machine without it is reported missing, loudly; ``auto`` tests whatever vllm-ascend
finds (Triton only, or nothing at all: then the routing property fails for every claimed op).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import math
import os
from types import SimpleNamespace
from typing import Any

from .ascend_routes import (
    ASCENDC_OPS,
    BI_MODULE,
    CAUSAL_MASK_SIZE,
    CONFIG_MODULE,
    DETERMINISTIC_LEVEL,
    GET_CONFIG,
    HAS_ASCENDC,
    HAS_TRITON,
    INIT,
    INSTALL_HINTS,
    KERNEL_PREFIX,
    LIBRARY,
    STANDIN_CONFIG,
    Capabilities,
    Plan,
    Probe,
    assess,
    cann_switch_problem,
    classify_import_failure,
    entries_for,
    evaluate_checks,
    fia_arguments,
    plan,
)
from .base import SWITCH_ENV, Target, TargetBroken, TargetMissing, stock_precision, switch_requested

SWITCH_MODE_ENV = "BI_PROPS_ASCEND_SWITCH"
BACKEND_ENV = "BI_PROPS_ASCEND_BACKEND"
SWITCH_MODES = ("vllm", "cann")
BACKENDS = ("ascendc", "auto")

_MISSING = object()
_MASKS: dict[str, Any] = {}


def npu_varlen_attention(q, k, v, cu_seqlens, scale=None, causal=True):
    """The catalogue's attention entry on NPU: packed sequences through
    ``torch_npu.npu_fused_infer_attention_score`` (looked up at call time, so vllm-ascend's swap to
    ``batch_invariant_ops.npu_fused_infer_attention_score_batch_invariant`` is what runs when on).

    q (T, H, D), k/v (T, Hkv, D), ``cu_seqlens`` (B + 1,) cumulative lengths. Arguments as
    vllm-ascend 0.23.0 passes them for a prefill without KV cache (see ``fia_arguments``).
    UNVERIFIED ON HARDWARE: layout, mask and argument names are read from the published source.
    """
    import torch
    import torch_npu

    tokens, heads, head_dim = q.shape
    if scale is None:
        scale = 1.0 / math.sqrt(head_dim)
    lengths = cu_seqlens.tolist() if hasattr(cu_seqlens, "tolist") else list(cu_seqlens)
    kwargs = fia_arguments(lengths, heads, k.shape[1], scale, causal)
    if causal:
        kwargs["atten_mask"] = _causal_mask(q.device, torch)
    out, _ = torch_npu.npu_fused_infer_attention_score(query=q, key=k, value=v, **kwargs)
    return out.view(tokens, heads, v.shape[-1])


def _causal_mask(device: Any, torch: Any) -> Any:
    key = str(device)
    if key not in _MASKS:
        ones = torch.ones(CAUSAL_MASK_SIZE, CAUSAL_MASK_SIZE)
        _MASKS[key] = torch.triu(ones, diagonal=1).to(torch.int8).to(device)
    return _MASKS[key]


def _resolve(dotted: str) -> Any:
    """The object at a dotted path (``torch.Tensor.sum``, ``torch.ops.batch_invariant_ops.x``);
    ``_MISSING`` when any part is absent or raises."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except Exception:
            continue
        try:
            for name in parts[cut:]:
                obj = getattr(obj, name)
        except Exception:
            return _MISSING
        return obj
    return _MISSING


def _distribution_version(*names: str) -> str | None:
    for name in names:
        try:
            return importlib.metadata.version(name)
        except Exception:
            continue
    return None


def _choice(env: str, allowed: tuple[str, ...]) -> str:
    value = os.environ.get(env, allowed[0]).strip().lower() or allowed[0]
    if value not in allowed:
        raise TargetBroken(f"{env}={value!r}: expected one of {list(allowed)}")
    return value


class AscendTarget(Target):
    one_way = "enable_batch_invariant_mode() has no disable and no idempotence guard"
    name = "ascend"
    device = "npu"
    kernel_prefix = KERNEL_PREFIX

    def __init__(self) -> None:
        self._switch = "vllm"
        self._backend = "ascendc"
        self._torch_npu: Any = None
        self._bi: Any = None
        self._caps = Capabilities(False, False)
        self._plan = Plan("vllm")
        self._standin = False
        self._cann_level_set = False
        self._notes: list[str] = []

    # -- check: find every piece, classify with ascend_routes.assess ------------------------------

    def check(self) -> None:
        self._switch = _choice(SWITCH_MODE_ENV, SWITCH_MODES)
        self._backend = _choice(BACKEND_ENV, BACKENDS)
        probes = self._probe()
        state, message = assess(probes)
        if state == "broken":
            raise TargetBroken(message)
        if state == "missing":
            raise TargetMissing(message)
        from ..catalogue import OPS

        self._plan = plan(self._caps, self._switch, tuple(OPS))

    def _probe(self) -> list[Probe]:
        probes: list[Probe] = []
        try:
            import torch_npu
        except Exception as exc:  # without CANN: ImportError on libhccl.so & co.
            return [classify_import_failure("torch_npu", "torch_npu", exc)]
        self._torch_npu = torch_npu
        import torch

        try:
            available = bool(torch.npu.is_available())
            detail = "torch.npu.is_available() is False"
        except Exception as exc:
            available, detail = False, f"torch.npu.is_available() raised {exc!r}"
        probes.append(Probe("npu_device", "ok" if available else "missing", detail))
        npu_version = _distribution_version("torch-npu", "torch_npu") or getattr(
            torch_npu, "__version__", None
        )
        self._caps = Capabilities(False, False, None, npu_version, _cann_version(torch, torch_npu))
        if self._switch == "cann":
            setter = getattr(getattr(torch_npu, "npu", None), "set_deterministic_level", None)
            if not callable(setter):
                why = cann_switch_problem(self._caps) or "torch_npu has no set_deterministic_level"
                probes.append(Probe("deterministic_level", "missing", why))
            return probes
        if importlib.util.find_spec("vllm_ascend") is None:
            return [*probes, Probe("vllm_ascend", "missing", "import vllm_ascend: not found")]
        try:
            bi = importlib.import_module(BI_MODULE)
        except Exception as exc:
            probe = classify_import_failure("vllm_ascend", BI_MODULE, exc)
            if probe.piece == "batch_invariant":
                version = _distribution_version("vllm-ascend")
                probe = Probe(probe.piece, "missing", f"vllm-ascend {version}: {probe.detail}")
            return [*probes, probe]
        self._bi = bi
        self._caps = Capabilities(
            bool(getattr(bi, HAS_ASCENDC.symbol, False)),
            bool(getattr(bi, HAS_TRITON.symbol, False)),
            _distribution_version("vllm-ascend", "vllm_ascend"),
            self._caps.torch_npu,
            self._caps.cann,
        )
        probes.append(self._probe_ascendc())
        return probes

    def _probe_ascendc(self) -> Probe:
        """The AscendC package: absent, present but not loaded by vllm-ascend (its ImportError is
        swallowed upstream), or another package of the same import name."""
        spec = importlib.util.find_spec("batch_invariant_ops")
        if spec is None:
            if self._backend == "auto":
                self._notes.append("batch_invariant_ops absent (backend=auto)")
                return Probe("batch_invariant_ops", "ok", "absent, accepted (backend=auto)")
            return Probe("batch_invariant_ops", "missing", "import batch_invariant_ops: not found")
        problem = None
        if not self._caps.has_ascendc:
            try:
                importlib.import_module("batch_invariant_ops")
                problem = "importable now, but vllm-ascend found it unimportable at its import"
            except Exception as exc:
                problem = f"installed at {spec.origin} but fails to import: {exc!r}"
        elif _resolve(f"{ASCENDC_OPS}.npu_mm_batch_invariant") is _MISSING:
            problem = (
                f"{spec.origin} registers no batch_invariant_ops::npu_mm_batch_invariant: not the"
                " AscendC package (thinking-machines' batch_invariant_ops has the same import"
                " name?)"
            )
        if problem is None:
            return Probe("batch_invariant_ops", "ok", str(spec.origin))
        if self._backend == "auto":
            self._notes.append(f"batch_invariant_ops: {problem} (accepted: backend=auto)")
            return Probe("batch_invariant_ops", "ok", problem)
        return Probe("batch_invariant_ops", "broken", problem)

    # -- activate ---------------------------------------------------------------------------------

    def activate(self) -> None:
        if self._switch == "cann":
            if switch_requested():
                try:
                    self._torch_npu.npu.set_deterministic_level(DETERMINISTIC_LEVEL)
                except Exception as exc:
                    raise TargetBroken(
                        f"torch_npu.npu.set_deterministic_level({DETERMINISTIC_LEVEL}) raised"
                        f" {exc!r}; {INSTALL_HINTS['deterministic_level']}"
                    ) from None
                self._cann_level_set = True
            return
        init = getattr(self._bi, INIT.symbol)
        restore = self._stand_in_for_config()
        try:
            init()
        except Exception as exc:
            raise TargetBroken(f"{BI_MODULE}.{INIT.symbol}() raised {exc!r}") from None
        finally:
            restore()

    def _stand_in_for_config(self):
        """Where ``get_ascend_config()`` raises (no engine), patch it for the duration of init
        with an object carrying only the attributes override_envs_for_invariance() sets."""
        try:
            config = importlib.import_module(CONFIG_MODULE)
        except Exception:
            return lambda: None
        original = getattr(config, GET_CONFIG.symbol, None)
        if not callable(original):
            return lambda: None
        try:
            original()
            return lambda: None
        except Exception:
            pass
        standin = SimpleNamespace(**STANDIN_CONFIG)

        def get_ascend_config() -> SimpleNamespace:
            return standin

        patched = [(config, original)]
        setattr(config, GET_CONFIG.symbol, get_ascend_config)
        module_level = getattr(self._bi, GET_CONFIG.symbol, None)  # a module-level import variant
        if module_level is original:
            patched.append((self._bi, original))
            setattr(self._bi, GET_CONFIG.symbol, get_ascend_config)
        self._standin = True

        def restore() -> None:
            for module, function in patched:
                setattr(module, GET_CONFIG.symbol, function)

        return restore

    # -- what the worker reports ------------------------------------------------------------------

    def promises_inference(self) -> bool:
        return True  # VLLM_BATCH_INVARIANT=1 promises batch-invariant inference

    def covered(self) -> tuple[str, ...]:
        return self._plan.covered

    def routes(self) -> dict[str, tuple[str, ...]]:
        return self._plan.routes()

    def entries(self) -> dict[str, tuple[str, ...]]:
        """torch_npu entry points (ENTRIES) and, for the vllm-ascend versions they were read for,
        the engine ops' adapters (``ascend_ops``), each only where the catalogue has the op."""
        from ..catalogue import OPS

        return entries_for(self._caps.vllm_ascend, tuple(OPS))

    def _library(self) -> Any:
        return getattr(self._bi, LIBRARY.symbol, None) if self._bi is not None else None

    def _registered(self, key: str) -> bool:
        lib = self._library()
        return lib is not None and key in getattr(lib, "_op_impls", ())

    def _cann_level(self) -> int | None:
        getter = getattr(getattr(self._torch_npu, "npu", None), "get_deterministic_level", None)
        if callable(getter):
            try:
                return int(getter())
            except Exception:
                pass
        return DETERMINISTIC_LEVEL if self._cann_level_set else None

    def _any_swap_in_place(self) -> bool:
        for route in self._plan.table.values():
            for target, implementation in route.swaps:
                got = _resolve(target)
                if got is not _MISSING and got is _resolve(implementation):
                    return True
        return False

    def evidence(self, op: str) -> dict[str, bool]:
        """Identity and registration checks of the routing table (True = vllm-ascend's kernel is
        in place), e.g. ``torch.sum is vllm_ascend.batch_invariant.reduce_sum``."""
        checks = self._plan.checks(op)
        if not checks:
            return {}

        def same(target: str, expected: str) -> bool:
            got, want = _resolve(target), _resolve(expected)
            return got is not _MISSING and got is want

        return evaluate_checks(
            checks,
            registered=self._registered,
            same=same,
            backend=self._caps.has_ascendc or self._caps.has_triton,
            cann_level=self._cann_level() if self._switch == "cann" else None,
        )

    def switch_state(self) -> dict[str, Any]:
        if self._switch == "cann":
            active = self._cann_level() == DETERMINISTIC_LEVEL
        else:
            active = self._library() is not None or self._any_swap_in_place()
        state: dict[str, Any] = {
            "active": bool(active),
            SWITCH_ENV: os.environ.get(SWITCH_ENV),
            "switch_mode": self._switch,
            "config_standin": self._standin,
            **self._caps.as_dict(),
        }
        if self._switch == "vllm":
            state["vllm.envs.VLLM_BATCH_INVARIANT"] = _vllm_envs_switch()
        return state

    def environment(self) -> dict[str, str]:
        env = super().environment()
        env.update({f"ascend_{k}": v for k, v in self._caps.as_dict().items()})
        env["ascend_switch"] = self._switch
        env["ascend_backend_required"] = self._backend
        env["vllm"] = _distribution_version("vllm") or "unknown"
        spec = importlib.util.find_spec("batch_invariant_ops")
        env["batch_invariant_ops"] = str(spec.origin) if spec is not None else "absent"
        if self._notes:
            env["ascend_notes"] = "; ".join(self._notes)
        return env

    def precision(self, op: str) -> str:
        """vllm-ascend's batch-invariant kernels (AscendC, Triton) accumulate in float32; an op
        they do not swap, or the switch off, runs stock torch_npu: "output" (unmeasured)."""
        if self.switch_state()["active"] and op in self.covered():
            return "float32"
        return stock_precision(self.device, op)


def _cann_version(torch: Any, torch_npu: Any) -> str | None:
    """``torch.version.cann`` (set by torch_npu), else torch_npu.npu.utils.get_cann_version()."""
    version = getattr(getattr(torch, "version", None), "cann", None)
    if version:
        return str(version)
    try:
        version = torch_npu.npu.utils.get_cann_version(module="CANN")
    except Exception:
        return None
    return str(version) or None


def _vllm_envs_switch() -> str:
    """The switch as vLLM itself reads it (``vllm.envs.VLLM_BATCH_INVARIANT``)."""
    try:
        import vllm.envs as envs

        return str(bool(envs.VLLM_BATCH_INVARIANT))
    except Exception as exc:
        return f"unreadable: {type(exc).__name__}"
