#!/usr/bin/env bash
# The Triton CI lane: the real Triton batch-invariant kernels of SGLang (and planted Triton
# kernels) run on CPU by Triton's interpreter (TRITON_INTERPRET=1), in their own virtual
# environment (.venv-triton; triton and SGLang must not leak into the main .venv).
#
#   1. tests/triton_lane/lane_compat.py: the interpreter compat layer (bi_props.integrations.triton_compat)
#      against the real interpreter; FAILS (never skips) without triton;
#   2. tests/triton_lane/lane_planted.py: the property suite against a planted Triton matmul whose
#      BLOCK_K follows M (must be caught) and its honest twin (must pass);
#   3. tests/triton_lane/lane_sglang.py: the property suite against `--bi-target sglang`
#      (sglang.srt.batch_invariant_ops from the SGLang 0.5.23 wheel) and the `switching` property;
#   4. tests/triton_lane/lane_vllm_ascend.py: the property suite against `--bi-target
#      vllm-ascend-triton` (vllm-ascend 0.23.0's Triton kernels, read from the published wheel,
#      downloaded and unpacked, never installed: $BI_PROPS_VLLM_ASCEND_SRC, default
#      build/vllm-ascend-0.23.0; .ci/run has fetched it already).
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

"$PYTHON" -m venv "$VENV"
# shellcheck disable=SC1091
. "$VENV/bin/activate"
python -m pip install --quiet --upgrade pip
python -m pip install --quiet "torch==2.13.0"
python -m pip install --quiet -e ".[triton]" "hypothesis>=6.100" "pytest>=7.4" "numpy>=1.24"
python -m pip install --quiet --no-deps "sglang==0.5.23"
BI_PROPS_VLLM_ASCEND_SRC="${BI_PROPS_VLLM_ASCEND_SRC:-build/vllm-ascend-0.23.0}"
export BI_PROPS_VLLM_ASCEND_SRC
bash scripts/fetch_vllm_ascend_wheel.sh "$BI_PROPS_VLLM_ASCEND_SRC" 0.23.0
echo "Triton lane: environment ready in $(( $(date +%s) - start )) s"
python -c "import torch, triton; print('torch', torch.__version__, '| triton', triton.__version__)"

export TRITON_INTERPRET=1
status=0
for lane in lane_compat lane_planted lane_sglang lane_vllm_ascend; do
    step=$(date +%s)
    python -m pytest "tests/triton_lane/$lane.py" -q -p no:cacheprovider || status=1
    echo "Triton lane: $lane took $(( $(date +%s) - step )) s"
done
echo "Triton lane: exit status $status after $(( $(date +%s) - start )) s"
exit "$status"
