#!/usr/bin/env bash
# Download a vllm-ascend wheel from PyPI (without installing it or its dependencies) and unpack its
# Python sources, for the ascend adapter's contract check (bi_props.integrations.contract, tests/test_contract.py).
#
#   scripts/fetch_vllm_ascend_wheel.sh DIR [VERSION]     (VERSION defaults to 0.23.0)
#
# Leaves DIR/vllm_ascend/**.py and DIR/vllm_ascend-VERSION.dist-info/ and prints DIR. Does nothing
# when DIR already holds that version. The wheels are tagged manylinux_2_34 (cp310-cp312, x86_64 and
# aarch64); older platform tags are tried after it. PYTHON selects the interpreter whose pip is used.
set -euo pipefail

dir=${1:?usage: $0 DIR [VERSION]}
version=${2:-0.23.0}
python=${PYTHON:-python3}

if [ -f "$dir/vllm_ascend/batch_invariant.py" ] && [ -d "$dir/vllm_ascend-$version.dist-info" ]; then
    echo "$dir"
    exit 0
fi
mkdir -p "$dir/wheel"

errors=""
for platform in manylinux_2_34_x86_64 manylinux_2_28_x86_64 manylinux2014_x86_64 linux_x86_64 \
    manylinux_2_34_aarch64 manylinux_2_28_aarch64; do
    if out=$("$python" -m pip download --quiet --no-deps --only-binary=:all: \
        --python-version 3.11 --platform "$platform" -d "$dir/wheel" \
        "vllm-ascend==$version" 2>&1); then
        errors=""
        break
    fi
    errors="$errors
--- $platform:
$out"
done

shopt -s nullglob
wheels=("$dir"/wheel/vllm_ascend-"$version"-*.whl)
if [ ${#wheels[@]} -eq 0 ]; then
    echo "could not download vllm-ascend==$version from PyPI:$errors" >&2
    exit 1
fi

"$python" - "${wheels[0]}" "$dir" <<'PY'
import sys
import zipfile

wheel, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as archive:
    names = [
        n for n in archive.namelist()
        if (n.startswith("vllm_ascend/") and n.endswith(".py")) or ".dist-info/" in n
    ]
    archive.extractall(dest, names)
PY
echo "$dir"
