#!/usr/bin/env bash
# The prepared GPU check: bi_props on a machine with an NVIDIA GPU, no internet, in under 8 minutes.
#
#   scripts/gpu_check.sh OUT_DIR [--wheels DIR] [--allow-missing] [--interpret] [--plan]
#   scripts/gpu_check.sh --check [--wheels DIR] [--interpret]
#
# What must be installed in $PYTHON (default python3; `--check` says in seconds what is missing):
#   required  Linux (/proc), Python >= 3.10 (3.10: with tomli), torch (a CUDA build that sees the GPU), triton (the
#             one torch brought, with a working CUDA driver), numpy >= 1.24, hypothesis >= 6.100,
#             pytest >= 7.4; bi_props is used from this checkout (src/) when not installed
#   sglang    SGLang's wheel (sglang-0.5.23-py3-none-any.whl), installed or in --wheels DIR; only
#             its batch_invariant_ops.py is executed, none of its dependencies is imported
#   optional  vLLM, a CUDA build already installed (it cannot be brought as a wheel here); without
#             it the vllm and scenarios parts are SKIPPED and the exit status is not affected
# --wheels DIR: wheels brought along are unpacked with `pip install --no-deps --no-index --target
# OUT_DIR/site` and put on PYTHONPATH; nothing is installed into the machine's Python.
#
# Parts, each a run of the property suite in its own session with a hard time limit (the part's
# process group and every worker it started are killed when it is cut; run_part.py); logs,
# worker logs (tmp/) and Hypothesis data (hypothesis/) stay in OUT_DIR/<part>/:
#   1. controls  stock PyTorch only (target gpu_check_stock: nothing switched), negative controls of
#                mm, bmm, log_softmax, mean (strategies/gpu-check-controls.toml): batch variance
#                of cuBLAS is expected and recorded, not a failure                     at most 65 s
#   2. sglang    SGLang's batch_invariant_ops Triton kernels on the GPU (bi_props.targets.sglang),
#                mm, addmm, bmm, log_softmax, mean, rms_norm (strategies/gpu-check.toml); fp32
#                tl.dot there is TF32 (no input_precision): declared, so the bound is TF32's at most 100 s
#   3. vllm      vLLM's batch-invariant mode (optional)                                 at most 95 s
#   4. scenarios engine scenarios on vLLM's own engine on CUDA (optional: vLLM on CUDA), not the
#                property suite: `bi-props scenarios --target vllm-engine --states off,on` over
#                strategies/scenarios-cuda.toml, CUDA graphs on as one more dimension (eager or
#                a drawn set of capture sizes), properties alone and decode_vs_prefill (their
#                twins run eagerly: where graph padding shows); searching gets a third of the
#                limit, shrinking 10 s past it, start-up the rest; its report in
#                OUT_DIR/scenarios/campaign/ (the `kernels` state installs bi_props' CPU
#                kernels: not for CUDA)                                                at most 90 s
#   5. inductor  PyTorch's own switch, torch._inductor.config.batch_invariant (bi_props' `inductor`
#                target), both states, every case compiled by Inductor (its Triton kernels):
#                bf16 sum and rms_norm, the cells of batch invariance and determinism
#                (strategies/gpu-check-inductor.toml); --interpret: Inductor's C++ backend on
#                CPU, a dry run (100-150+ s on 2 loaded cores: 240 s there)            at most 55 s
# The whole run is capped at 450 s (BI_PROPS_GPU_CHECK_TOTAL_S; 420 s before the scenarios part,
# whose 130 s came from the other parts: controls 75 -> 70, sglang 150 -> 110, vllm 120 -> 95;
# the inductor part's 55 s from controls 70 -> 65, sglang 110 -> 100 and scenarios 130 -> 90);
# a part never gets more than what is left. Limits: BI_PROPS_GPU_CHECK_<PART>_S. Not one of the
# limits has been measured on a GPU yet. OUT_DIR/summary.md is rewritten after every part: one
# row per part (status, seconds, examples or scenarios judged, findings, controls with variance,
# largest shapes) and, for a part that was cut, the tests it finished and the one it was in.
#
# --interpret (or BI_PROPS_GPU_CHECK_INTERPRET=1): the same parts on CPU under Triton's interpreter
# (TRITON_INTERPRET=1, bi_props' compat layer) with a tiny space (strategies/gpu-check-interpret
# .toml): how this script is tested without a GPU (tests/triton_lane/lane_gpu_check.py).
# --plan: print the parts' commands and limits, and exit. --allow-missing: a required part whose
# stack is absent does not make the exit status non-zero.
#
# Exit status: 0 every part ran and found nothing; 1 every part ran and some found failures
# (findings: see OUT_DIR/summary.md); 2 a part could not run (missing stack, cut at its limit,
# crash), left processes behind, or bad arguments.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPO=$(pwd)
PARTS_DIR="$REPO/scripts/gpu_check_parts"

usage() { sed -n '2,57p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
die() { echo "gpu_check.sh: $*" >&2; exit 2; }

OUT="" WHEELS="" ALLOW_MISSING=0 PLAN=0 CHECK=0
INTERPRET="${BI_PROPS_GPU_CHECK_INTERPRET:-0}"
while [ $# -gt 0 ]; do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --wheels) [ $# -ge 2 ] || die "--wheels needs a folder"; WHEELS="$2"; shift 2 ;;
        --wheels=*) WHEELS="${1#--wheels=}"; shift ;;
        --allow-missing) ALLOW_MISSING=1; shift ;;
        --interpret) INTERPRET=1; shift ;;
        --plan) PLAN=1; shift ;;
        --check) CHECK=1; shift ;;
        -*) die "unknown option '$1' (see --help)" ;;
        *) [ -z "$OUT" ] || die "one OUT_DIR only, got '$OUT' and '$1'"; OUT="$1"; shift ;;
    esac
done
if [ -n "$WHEELS" ] && [ ! -d "$WHEELS" ]; then
    die "--wheels '$WHEELS' is not a folder"
fi
case "$INTERPRET" in 0|1) ;; *) die "BI_PROPS_GPU_CHECK_INTERPRET must be 0 or 1, got '$INTERPRET'" ;; esac
[ "$CHECK" = 1 ] || [ -n "$OUT" ] || die "missing OUT_DIR (the folder for the reports); usage: scripts/gpu_check.sh OUT_DIR [--wheels DIR] [--allow-missing] [--interpret] [--plan] | --check"

PYTHON="${PYTHON:-python3}"
SUITE="$REPO/src/bi_props/suite/test_properties.py"
int_or_die() { case "$2" in ''|*[!0-9]*) die "$1 must be a whole number of seconds, got '$2'" ;; esac; }
TOTAL_S="${BI_PROPS_GPU_CHECK_TOTAL_S:-450}"; int_or_die BI_PROPS_GPU_CHECK_TOTAL_S "$TOTAL_S"
SCENARIOS_SPACE="$REPO/strategies/scenarios-cuda.toml"
if [ "$INTERPRET" = 1 ]; then
    SPACE="$REPO/strategies/gpu-check-interpret.toml"
    CONTROLS_SPACE="$SPACE"
    # scenarios: never runs here (it needs vLLM on CUDA): SKIPPED as optional by check_env.py
    LIMITS=(controls:"${BI_PROPS_GPU_CHECK_CONTROLS_S:-100}" sglang:"${BI_PROPS_GPU_CHECK_SGLANG_S:-200}" vllm:"${BI_PROPS_GPU_CHECK_VLLM_S:-120}" scenarios:"${BI_PROPS_GPU_CHECK_SCENARIOS_S:-60}" inductor:"${BI_PROPS_GPU_CHECK_INDUCTOR_S:-240}")
    [ -n "${BI_PROPS_GPU_CHECK_TOTAL_S:-}" ] || TOTAL_S=450
else
    SPACE="$REPO/strategies/gpu-check.toml"
    CONTROLS_SPACE="$REPO/strategies/gpu-check-controls.toml"
    LIMITS=(controls:"${BI_PROPS_GPU_CHECK_CONTROLS_S:-65}" sglang:"${BI_PROPS_GPU_CHECK_SGLANG_S:-100}" vllm:"${BI_PROPS_GPU_CHECK_VLLM_S:-95}" scenarios:"${BI_PROPS_GPU_CHECK_SCENARIOS_S:-90}" inductor:"${BI_PROPS_GPU_CHECK_INDUCTOR_S:-55}")
fi
# A planted part that hangs (the hang test; BI_PROPS_GPU_CHECK_PLANT_HANG=SECONDS): a real
# controller whose worker never returns from its first example (tests/planted/planted_hang.py).
PLANT_HANG="${BI_PROPS_GPU_CHECK_PLANT_HANG:-}"
PARTS=(controls sglang vllm scenarios inductor)
INDUCTOR_SPACE="$REPO/strategies/gpu-check-inductor.toml"
if [ -n "$PLANT_HANG" ]; then
    int_or_die BI_PROPS_GPU_CHECK_PLANT_HANG "$PLANT_HANG"
    PARTS=(hang controls sglang vllm scenarios inductor)
    LIMITS+=(hang:"$PLANT_HANG")
fi
limit_of() { local kv; for kv in "${LIMITS[@]}"; do [ "${kv%%:*}" = "$1" ] && { int_or_die "the $1 part's limit" "${kv#*:}"; echo "${kv#*:}"; return; }; done; }
target_of() { case "$1" in controls) echo gpu_check_stock ;; hang) echo planted_hang ;; scenarios) echo vllm-engine ;; *) echo "$1" ;; esac; }

part_command() {  # the command line of a part (one line, for --plan and for running)
    local part="$1" target; target=$(target_of "$1")
    if [ "$part" = scenarios ]; then  # not the property suite: the engine-scenario campaign
        local budget=$(( $(limit_of scenarios) / 3 ))
        printf '%q ' "$PYTHON" -m bi_props.cli scenarios --target "$target" --space "$SCENARIOS_SPACE" \
            --states off,on --props alone,decode_vs_prefill --budget "$budget" --shrink-s 10 \
            --out "$OUT/$part/campaign"
        return
    fi
    local common=("$PYTHON" -m pytest "$SUITE" --bi-target "$target" -p no:cacheprovider -v
        --bi-report "$OUT/$part/report.json" --junitxml "$OUT/$part/junit.xml")
    case "$part" in
        controls) printf '%q ' "${common[@]}" --bi-strategies "$CONTROLS_SPACE" -k test_batch_variance_control ;;
        hang) printf '%q ' "${common[@]}" --bi-strategies "$SPACE" --bi-regressions "$REPO/tests/triton_lane/hang_case.toml" -k test_regression ;;
        inductor) printf '%q ' "${common[@]}" --bi-strategies "$INDUCTOR_SPACE" -k "test_property and (batch_invariance or determinism)" ;;
        *) printf '%q ' "${common[@]}" --bi-strategies "$SPACE" ;;
    esac
}

if [ "$PLAN" = 1 ]; then
    echo "gpu_check plan (interpret=$INTERPRET, at most ${TOTAL_S} s in all, reports in $OUT):"
    for part in "${PARTS[@]}"; do
        echo "  $part [$(target_of "$part")]: limit $(limit_of "$part") s: $(part_command "$part")"
    done
    exit 0
fi

# bi_props from this checkout when it is not installed (the pytest plugin then by name).
if ! "$PYTHON" -c "import importlib.metadata as m; m.distribution('bi_props')" 2>/dev/null; then
    export PYTHONPATH="$REPO/src${PYTHONPATH:+:$PYTHONPATH}"
    export PYTEST_ADDOPTS="${PYTEST_ADDOPTS:-} -p bi_props.plugin"
fi
export PYTHONPATH="$PARTS_DIR${PYTHONPATH:+:$PYTHONPATH}"  # gpu_check_stock (the controls' target)
if [ "$INTERPRET" = 1 ]; then
    export TRITON_INTERPRET=1 BI_PROPS_VLLM_TRITON=1
fi

check_args=()
[ "$INTERPRET" = 1 ] && check_args+=(--interpret)
[ -n "$WHEELS" ] && check_args+=(--wheels "$WHEELS")
if [ "$CHECK" = 1 ]; then
    exec "$PYTHON" "$PARTS_DIR/check_env.py" "${check_args[@]}"
fi

mkdir -p "$OUT" || die "cannot create '$OUT'"
OUT=$(cd "$OUT" && pwd)
start=$(date +%s)
if [ -n "$WHEELS" ]; then
    shopt -s nullglob
    wheels=("$WHEELS"/*.whl)
    if [ ${#wheels[@]} -gt 0 ]; then
        "$PYTHON" -m pip install --quiet --no-deps --no-index --target "$OUT/site" "${wheels[@]}" \
            > "$OUT/wheels.log" 2>&1 || die "could not unpack the wheels in $WHEELS (see $OUT/wheels.log)"
        export PYTHONPATH="$OUT/site:$PYTHONPATH"
    fi
fi
if [ "$INTERPRET" = 0 ]; then
    # The `switching` state machine reads the CPU dispatch key and runs its mm check on CPU
    # tensors: on a GPU it would judge the wrong key. It runs in the Triton lane instead.
    export BI_PROPS_SWITCHING=0
fi

# What is there (check_env.py --json: the same list as --check), in OUT_DIR/check.json.
"$PYTHON" "$PARTS_DIR/check_env.py" "${check_args[@]}" --json "$OUT/check.json" > "$OUT/check.txt" 2>&1
missing_of() { "$PYTHON" "$PARTS_DIR/check_env.py" --missing-for "$1" "$OUT/check.json"; }

overall=0
for part in "${PARTS[@]}"; do
    mkdir -p "$OUT/$part"
    missing=$(missing_of "$part")
    limit=$(limit_of "$part")
    left=$(( TOTAL_S - ($(date +%s) - start) - 10 ))
    if [ -n "$missing" ]; then
        printf '%s\n' "$missing" > "$OUT/$part/missing"
        case "$missing" in
            optional:*) ;;
            *) [ "$ALLOW_MISSING" = 0 ] && overall=2 ;;
        esac
        echo "gpu_check: $part: not run: $missing"
    elif [ "$left" -lt 20 ]; then
        echo "no time left (${left} s of the ${TOTAL_S} s)" > "$OUT/$part/missing"
        overall=2
        echo "gpu_check: $part: not run: no time left"
    else
        [ "$limit" -gt "$left" ] && limit=$left
        switching="${BI_PROPS_SWITCHING:-1}"
        [ "$part" = sglang ] || switching=0  # judged once, in the sglang part
        extra_path=""
        [ "$part" = hang ] && extra_path="$REPO/tests/planted:"
        # shellcheck disable=SC2046
        eval "BI_PROPS_SWITCHING=$switching PYTHONPATH=$extra_path\$PYTHONPATH" \
            "$PYTHON" "$PARTS_DIR/run_part.py" "$OUT/$part" "$limit" -- "$(part_command "$part")"
        code=$?
        echo "gpu_check: $part ($(target_of "$part")): exit $code after $(( $(date +%s) - start )) s in all"
    fi
    "$PYTHON" "$PARTS_DIR/summarize.py" "$OUT" "$(( $(date +%s) - start ))" "$ALLOW_MISSING" "${PARTS[@]}" > /dev/null
done

"$PYTHON" "$PARTS_DIR/summarize.py" "$OUT" "$(( $(date +%s) - start ))" "$ALLOW_MISSING" "${PARTS[@]}"
status=$?
[ "$overall" -gt "$status" ] && status=$overall
exit "$status"
