#!/usr/bin/env bash
# The Triton CI lane: the real Triton batch-invariant kernels of SGLang (and planted Triton
# kernels) run on CPU by Triton's interpreter (TRITON_INTERPRET=1), in their own virtual
# environment (.venv-triton; triton and SGLang must not leak into the main .venv).
#
#   1. tests/triton_lane/lane_compat.py: the interpreter compat layer (bi_props.targets.triton_compat)
#      against the real interpreter; FAILS (never skips) without triton;
#   2. tests/triton_lane/lane_planted.py: the property suite against a planted Triton matmul whose
#      BLOCK_K follows M (must be caught) and its honest twin (must pass);
#   3. tests/triton_lane/lane_sglang.py: the property suite against `--bi-target sglang`
#      (sglang.srt.batch_invariant_ops from the SGLang 0.5.23 wheel) and the `switching` property;
#   4. tests/triton_lane/lane_vllm_ascend.py: the property suite against `--bi-target
#      vllm-ascend-triton` (vllm-ascend 0.23.0's Triton kernels, read from the published wheel,
#      downloaded and unpacked, never installed: $BI_PROPS_VLLM_ASCEND_SRC, default
#      build/vllm-ascend-0.23.0; .ci/run has fetched it already);
#   5. tests/triton_lane/lane_gpu_check.py: scripts/gpu_check.sh --interpret end to end, with a
#      planted hanging part that must be killed with its workers.
#
# Every step has a time limit (BI_PROPS_TRITON_STEP_S=<name>:<s>,... overrides); a step that
# passes it is killed with its whole tree, the workers bi_props started in sessions of their own
# included (scripts/gpu_check_parts/run_part.py), and the lane says which step it was. The
# steps' and the lane's times are printed at the end.
#
# SGLang goes in with --no-deps and nothing else: the `sglang` target executes the wheel's
# batch_invariant_ops.py with stated stand-ins for the few names it imports from SGLang's package
# (see src/bi_props/targets/sglang.py). Importing the package itself would need about 18 more
# distributions (transformers, aiohttp, ...) and a torchvision, and PyPI's torchvision (a CUDA
# build) cannot load beside torch+cpu. `pip check` reports SGLang's pins (torch 2.14.1, ...) as
# unmet: none of them is imported here.
# Exits non-zero on any failure. Reports go to $BI_PROPS_TRITON_OUT (default build/triton-lane).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

VENV="${BI_PROPS_TRITON_VENV:-.venv-triton}"
PYTHON="${PYTHON:-python3}"
export BI_PROPS_TRITON_OUT="${BI_PROPS_TRITON_OUT:-build/triton-lane}"
start=$(date +%s)

# Time limits per step (seconds): about 3x what each took on the shared 2-core machine.
declare -A LIMIT=([venv]=900 [wheel]=300 [lane_compat]=300 [lane_planted]=900 [lane_sglang]=1500
                  [lane_vllm_ascend]=1500 [lane_gpu_check]=720)
IFS=, read -r -a overrides <<< "${BI_PROPS_TRITON_STEP_S:-}"
for kv in "${overrides[@]}"; do [ -n "$kv" ] && LIMIT[${kv%%:*}]=${kv#*:}; done
TIMES=()
STEPS_DIR="$BI_PROPS_TRITON_OUT/steps"
mkdir -p "$STEPS_DIR"

step() {  # step NAME COMMAND...: run it under its limit, killing its whole tree when it hangs
    local name="$1" t0 code; shift
    t0=$(date +%s)
    rm -rf "${STEPS_DIR:?}/$name"
    python3 scripts/gpu_check_parts/run_part.py --here --tee "$STEPS_DIR/$name" "${LIMIT[$name]}" -- "$@"
    code=$?
    TIMES+=("$name $(( $(date +%s) - t0 )) s")
    echo "Triton lane: step '$name' exit $code in $(( $(date +%s) - t0 )) s"
    if [ "$code" = 124 ]; then
        echo "Triton lane: step '$name' TIMED OUT after ${LIMIT[$name]} s (killed with its workers; log: $STEPS_DIR/$name/log)" >&2
    elif [ "$code" != 0 ]; then
        echo "Triton lane: step '$name' failed (exit $code)" >&2
    fi
    return "$code"
}
finish() {
    local joined; joined=$(printf '%s; ' "${TIMES[@]}")
    echo "Triton lane: step times: ${joined%; }"
    echo "Triton lane: exit status $1 after $(( $(date +%s) - start )) s"
    exit "$1"
}

BI_PROPS_VLLM_ASCEND_SRC="${BI_PROPS_VLLM_ASCEND_SRC:-build/vllm-ascend-0.23.0}"
export BI_PROPS_VLLM_ASCEND_SRC
step venv bash -c "set -e
    '$PYTHON' -m venv '$VENV'
    '$VENV/bin/python' -m pip install --quiet --upgrade pip
    '$VENV/bin/python' -m pip install --quiet 'torch==2.13.0'
    '$VENV/bin/python' -m pip install --quiet -e '.[triton]' 'hypothesis>=6.100' 'pytest>=7.4' 'numpy>=1.24'
    '$VENV/bin/python' -m pip install --quiet --no-deps 'sglang==0.5.23'" || finish 1
step wheel bash scripts/fetch_vllm_ascend_wheel.sh "$BI_PROPS_VLLM_ASCEND_SRC" 0.23.0 || finish 1
# shellcheck disable=SC1091
. "$VENV/bin/activate"
echo "Triton lane: environment ready in $(( $(date +%s) - start )) s"
python -c "import torch, triton; print('torch', torch.__version__, '| triton', triton.__version__)"

export TRITON_INTERPRET=1
status=0
for lane in lane_compat lane_planted lane_sglang lane_vllm_ascend lane_gpu_check; do
    step "$lane" python -m pytest "tests/triton_lane/$lane.py" -q -p no:cacheprovider --durations=5 || status=1
done
finish "$status"
