"""Compiled mode (``Case.mode == "compiled"``): the entry point called as serving engines call
a model, through ``torch.compile``. Worker side; imports torch lazily, never Hypothesis.

The op's call (``OpSpec.call``, the same code eager mode runs) is wrapped in a function of its
own per (op, entry, dtype, layouts, padded): a fresh code object, so that Dynamo's cache and its
recompile limit are that key's alone, and compiled once with Inductor, ``dynamic=True`` (a
campaign does not recompile for every extent: only where Dynamo specialises, e.g. a size of 1)
and ``fullgraph=True`` (the whole call one graph, as vLLM compiles a model). Where Dynamo cannot
make the call one graph (``Unsupported``: host logic reading a tensor's values, as the attention
composites' ``cu_seqlens.tolist()``; a custom op without a fake kernel), the key is compiled
*piecewise* instead (``fullgraph=False``: Dynamo runs what it cannot trace eagerly between
compiled graphs, as engines leave attention out of the graph), and every observation of it says
so with Dynamo's reason (``evidence["compile"]["piecewise"]``; the report lists the ops): never a
silent eager fall back. The recompile limit is raised and made to fail loudly
(``fail_on_recompile_limit_hit``): past it, Dynamo would run the frame eagerly. Inductor compiles
in this process (``compile_threads = 1``: no subprocess pool in a forked worker).

Compile time is measured apart (``torch._dynamo.utils.compilation_time_metrics``) and reported
with each observation (``evidence["compile"]``), never counted as kernel time.

A worker started with ``FRESH_ENV=1`` compiles with fresh caches: a cache directory of its own
(``TORCHINDUCTOR_CACHE_DIR``, removed at exit), Inductor's caches disabled, and autotuning's
benchmark results distorted where torch has ``test_configs.distort_benchmarking_result`` (an
autotuner's pick then differs from the first process's): determinism across compiles.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from ..model.case import Case
from ..model.op_registry import OPS

FRESH_ENV = "BI_PROPS_FRESH_COMPILE"
"""Set to 1 in a worker's environment: it compiles with fresh caches (see the module)."""
COMPILE_OPTIONS = {"backend": "inductor", "dynamic": True, "fullgraph": True}
"""How a compiled case is compiled; a reproducer of a compiled-mode finding compiles the same."""
RECOMPILE_LIMIT = 4096
"""Dynamo's per-code recompile limit here (its default, 8, would end in an eager fall back)."""
DISTORT = "inverse"
"""``test_configs.distort_benchmarking_result`` in a fresh-compile worker: autotuning's timings
inverted, so that it picks what the first process did not."""

PIECEWISE_OPTIONS = {**COMPILE_OPTIONS, "fullgraph": False}
"""How a key whose call cannot be one graph is compiled (see the module)."""

_COMPILED: dict[tuple, Callable[..., Any]] = {}
_PIECEWISE: dict[tuple, str] = {}  # key -> why its call is not one graph (Dynamo's first line)
_STATE: dict[str, Any] = {}


def configure() -> dict[str, Any]:
    """Set Dynamo and Inductor up once per process (before the first compile); returns what
    was set (the fresh-compile worker's cache directory and distortion)."""
    if _STATE:
        return _STATE
    import torch._dynamo.config as dynamo_config
    import torch._inductor.config as inductor_config

    inductor_config.compile_threads = 1
    for name, value in (
        ("recompile_limit", RECOMPILE_LIMIT),
        ("cache_size_limit", RECOMPILE_LIMIT),
        ("accumulated_recompile_limit", RECOMPILE_LIMIT * 16),
        ("accumulated_cache_size_limit", RECOMPILE_LIMIT * 16),
        ("fail_on_recompile_limit_hit", True),
    ):
        if hasattr(dynamo_config, name):
            setattr(dynamo_config, name, value)
    _STATE["configured"] = True
    if os.environ.get(FRESH_ENV) == "1":
        _STATE.update(fresh_caches(inductor_config))
    return _STATE


def fresh_caches(inductor_config: Any) -> dict[str, Any]:
    """A cache directory of this process' own, Inductor's caches off, autotuning distorted."""
    import atexit
    import shutil
    import tempfile

    directory = tempfile.mkdtemp(prefix="bi_props_fresh_inductor_")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = directory
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    inductor_config.force_disable_caches = True
    state: dict[str, Any] = {"cache_dir": directory, "force_disable_caches": True}
    tests = getattr(inductor_config, "test_configs", None)
    if tests is not None and hasattr(tests, "distort_benchmarking_result"):
        tests.distort_benchmarking_result = DISTORT
        state["distort_benchmarking_result"] = DISTORT
    else:
        state["distort_benchmarking_result"] = "not in this torch"
    return state


def key(case: Case) -> tuple:
    """What one compiled wrapper serves: (op, entry, dtype, layouts, padded)."""
    return (case.op, case.entry, case.dtype, tuple(case.layouts), bool(case.padded))


def _wrapper(call: Callable[..., Any], entry: str, name: str) -> Callable[..., Any]:
    def run(args, case, lengths):
        return call(entry, args, case, lengths)

    # A code object of its own: Dynamo caches (and counts recompiles) per code object.
    code = run.__code__.replace(co_name=name)
    if hasattr(code, "co_qualname"):
        code = code.replace(co_qualname=name)
    run.__code__ = code
    run.__name__ = run.__qualname__ = name
    return run


def _import_entry_module(entry: str) -> None:
    """Import the module an entry point names, before Dynamo traces the call: the catalogue
    looks entries up in ``sys.modules`` (traceable), never by importing inside the graph."""
    import importlib

    module = entry.rpartition(".")[0]
    if module and module not in sys.modules:
        try:
            importlib.import_module(module)
        except ImportError:  # "Tensor.mm", "operator.matmul": no module of that name to import
            pass


def compiled(case: Case, piecewise: bool = False) -> Callable[..., Any]:
    """The compiled wrapper of the case's call, built once per ``key`` (and once more,
    ``piecewise``, where the call cannot be one graph)."""
    k = (*key(case), piecewise)
    fn = _COMPILED.get(k)
    if fn is None:
        import re

        import torch

        configure()
        _import_entry_module(case.entry)
        tail = "_piecewise" if piecewise else ""
        name = re.sub(r"\W", "_", "bi_props_compiled_" + "_".join(map(str, k[:3])) + tail)
        options = PIECEWISE_OPTIONS if piecewise else COMPILE_OPTIONS
        fn = torch.compile(_wrapper(OPS[case.op].call, case.entry, name), **options)
        _COMPILED[k] = fn
    return fn


def call(case: Case, args: Sequence[Any], lengths: Sequence[int]) -> Any:
    """The case's call, compiled as one graph, else piecewise (``piecewise``). The op's own
    exceptions and Inductor's errors propagate: they are observed as the op raising."""
    from torch._dynamo.exc import Unsupported

    k = key(case)
    if k not in _PIECEWISE:
        try:
            return compiled(case)(list(args), case, list(lengths))
        except Unsupported as exc:  # not one graph: compiled piecewise from now on
            lines = [line for line in str(exc).splitlines() if line.strip()]
            _PIECEWISE[k] = (lines[0] if lines else type(exc).__name__)[:300]
    return compiled(case, piecewise=True)(list(args), case, list(lengths))


def piecewise(case: Case) -> str | None:
    """Why the case's call is compiled piecewise (not one graph), or None."""
    return _PIECEWISE.get(key(case))


def snapshot() -> tuple[float, int] | None:
    """(seconds compiled so far, graphs compiled so far) in this process; None before Dynamo
    was ever imported (nothing compiled)."""
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None:
        return None
    metrics = getattr(utils, "compilation_time_metrics", {}) or {}
    seconds = float(sum(metrics.get("_compile.compile_inner", ()) or ()))
    counters = getattr(utils, "counters", {}) or {}
    graphs = int(counters.get("stats", {}).get("unique_graphs", 0))
    return seconds, graphs


def spent(before: tuple[float, int] | None) -> dict[str, Any] | None:
    """What was compiled since ``before`` (``snapshot``): {"seconds", "graphs"}; None where
    nothing could have been."""
    after = snapshot()
    if after is None:
        return None
    seconds, graphs = after
    if before is not None:
        seconds, graphs = seconds - before[0], graphs - before[1]
    return {"seconds": max(seconds, 0.0), "graphs": max(graphs, 0)}


def state() -> dict[str, Any]:
    """This process' compile setup, for a report's environment."""
    return {k: v for k, v in _STATE.items() if k != "configured"}
