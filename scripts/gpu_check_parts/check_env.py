"""What scripts/gpu_check.sh needs, and whether this machine has it (``gpu_check.sh --check``).

    python3 check_env.py [--interpret] [--wheels DIR] [--json PATH]
    python3 check_env.py --missing-for PART CHECK_JSON

Prints one line per requirement (``ok``, ``MISSING`` or ``optional``, the name, what was found or
what to do) and exits 0 when every required item is there, 2 otherwise. Each probe runs in its
own interpreter with a time limit, so a hanging import (a CUDA driver that never answers) costs
seconds, not the check. ``--missing-for`` answers, from a written JSON, why a part cannot run
(empty when it can; ``optional: ...`` for a part that is skipped without failing the run).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

PROBE_S = 60.0

# name -> (probe code printing what was found; needed by parts; hint when missing)
PROBES: dict[str, tuple[str, tuple[str, ...], str]] = {
    "python": (
        "import sys, platform; v = sys.version_info; "
        "assert v >= (3, 10), 'Python ' + platform.python_version() + ' < 3.10'; "
        "print(platform.python_version())",
        ("controls", "sglang", "vllm", "scenarios", "hang", "inductor"),
        "Python >= 3.10",
    ),
    "tomllib": (
        "try:\n    import tomllib\nexcept ImportError:\n    import tomli as tomllib\n"
        "print(tomllib.__name__)",
        ("controls", "sglang", "vllm", "scenarios", "hang", "inductor"),
        "Python 3.11's tomllib, or pip install tomli on 3.10",
    ),
    "/proc": (
        "import os; assert os.path.isdir('/proc/self'), 'no /proc'; print('ok')",
        ("controls", "sglang", "vllm", "scenarios", "hang", "inductor"),
        "Linux with /proc (run_part.py finds the part's workers there)",
    ),
    "numpy": (
        "import numpy; v = tuple(int(x) for x in numpy.__version__.split('.')[:2]); "
        "assert v >= (1, 24), numpy.__version__; print(numpy.__version__)",
        ("controls", "sglang", "vllm", "scenarios", "hang", "inductor"),
        "pip install 'numpy>=1.24'",
    ),
    "hypothesis": (
        "import hypothesis; v = hypothesis.__version_info__; "
        "assert tuple(v[:2]) >= (6, 100), hypothesis.__version__; print(hypothesis.__version__)",
        ("controls", "sglang", "vllm", "scenarios", "hang", "inductor"),
        "pip install 'hypothesis>=6.100'",
    ),
    "pytest": (
        "import pytest; v = tuple(int(x) for x in pytest.__version__.split('.')[:2]); "
        "assert v >= (7, 4), pytest.__version__; print(pytest.__version__)",
        ("controls", "sglang", "vllm", "scenarios", "hang", "inductor"),
        "pip install 'pytest>=7.4'",
    ),
    "torch": (
        "import torch; print(torch.__version__, '(CUDA', torch.version.cuda, ')')",
        ("controls", "sglang", "vllm", "scenarios", "hang", "inductor"),
        "a CUDA build of torch (pip install torch, with the CUDA wheels)",
    ),
    "torch-cuda": (
        "import torch; assert torch.cuda.is_available(), 'torch.cuda.is_available() is False "
        "(CPU build, or no driver)'; print(torch.cuda.get_device_name(0), "
        "'capability', torch.cuda.get_device_capability(0))",
        ("controls", "sglang", "vllm", "scenarios", "inductor"),
        "a CUDA build of torch and a working NVIDIA driver (nvidia-smi)",
    ),
    "triton": (
        "import triton; print(triton.__version__)",
        ("sglang", "vllm", "inductor"),
        "triton (the CUDA torch wheel brings it; pip install triton)",
    ),
    "triton-driver": (
        "import triton; d = triton.runtime.driver.active; print(type(d).__name__, "
        "d.get_current_target())",
        ("sglang", "vllm", "inductor"),
        "triton must find the CUDA driver (libcuda.so) to compile kernels",
    ),
    "inductor-switch": (
        "import torch, torch._inductor.config as c; assert hasattr(c, 'batch_invariant'), "
        "'torch ' + torch.__version__ + ' has no torch._inductor.config.batch_invariant'; "
        "print(torch.__version__, 'batch_invariant')",
        ("inductor",),
        "a torch with PyTorch's batch-invariant switch, torch._inductor.config.batch_invariant "
        "(torch 2.13)",
    ),
    "c++": (
        "import os, shutil, subprocess; c = shutil.which(os.environ.get('CXX') or 'g++'); "
        "assert c, 'no C++ compiler (CXX or g++)'; "
        "print(subprocess.run([c, '--version'], capture_output=True, text=True).stdout"
        ".splitlines()[0])",
        ("inductor",),
        "a C++ compiler for Inductor's CPU backend (--interpret only): g++, or set CXX",
    ),
    "bi_props": (
        "import bi_props, bi_props.plugin; print(bi_props.__file__)",
        ("controls", "sglang", "vllm", "scenarios", "hang", "inductor"),
        "run from the checkout (src/ is put on PYTHONPATH) or pip install -e .",
    ),
    "sglang": (
        "import importlib.util as u, os; s = u.find_spec('sglang'); "
        "assert s and s.submodule_search_locations, 'SGLang not importable'; "
        "p = os.path.join(list(s.submodule_search_locations)[0], 'srt', 'batch_invariant_ops', "
        "'batch_invariant_ops.py'); assert os.path.exists(p), 'no ' + p; "
        "from importlib.metadata import version; print(version('sglang'), p)",
        ("sglang",),
        "bring SGLang's wheel: --wheels DIR with sglang-0.5.23-py3-none-any.whl "
        "(pip download --no-deps sglang==0.5.23 on a machine with internet)",
    ),
    "vllm": (
        "import importlib.util as u; assert u.find_spec('vllm'), 'vLLM not importable'; "
        "from importlib.metadata import version; print(version('vllm'))",
        ("vllm", "scenarios"),
        "optional: vLLM's CUDA build installed on this machine (pip install vllm)",
    ),
    "vllm-cuda": (
        "import os; assert os.environ.get('TRITON_INTERPRET') != '1', 'interpret mode (CPU): "
        "CUDA graphs need vLLM on CUDA'; import importlib.util as u; "
        "assert u.find_spec('vllm'), 'vLLM not importable'; "
        "from vllm.platforms import current_platform as p; "
        "assert p.is_cuda(), 'vLLM runs on ' + str(p.device_type) + ', not CUDA'; "
        "import vllm; print(vllm.__version__, 'on CUDA')",
        ("scenarios",),
        "optional: needs vLLM on CUDA (its CUDA build and a GPU): the scenarios part replays "
        "engine scenarios with CUDA graphs, which vLLM has only there",
    ),
}
OPTIONAL = {"vllm", "vllm-cuda"}
# Under --interpret (CPU, TRITON_INTERPRET=1) no GPU is needed; the interpreter is the device.
INTERPRET_SKIP = {"torch-cuda", "triton-driver"}
GPU_SKIP = {"c++"}  # the inductor part compiles Triton kernels on a GPU, C++ only on CPU
INTERPRET_PARTS = {"triton": ("sglang", "vllm")}


def probe(code: str, env: dict[str, str]) -> tuple[bool, str, float]:
    t0 = time.monotonic()
    try:
        proc = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=PROBE_S, env=env
        )
    except subprocess.TimeoutExpired:
        return False, f"no answer within {PROBE_S:g} s", time.monotonic() - t0
    seconds = time.monotonic() - t0
    if proc.returncode == 0:
        return True, proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else "ok", seconds
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    return False, (lines[-1] if lines else f"exit {proc.returncode}"), seconds


def wheel_names(folder: str | None) -> list[str]:
    if not folder:
        return []
    names = []
    for path in sorted(Path(folder).glob("*.whl")):
        try:
            with zipfile.ZipFile(path) as z:
                top = {n.split("/")[0] for n in z.namelist()}
        except zipfile.BadZipFile:
            continue
        names += sorted(t for t in top if not t.endswith((".dist-info", ".data")))
    return names


def check(interpret: bool, wheels: str | None) -> list[dict]:
    env = dict(os.environ)
    repo_src = str(Path(__file__).resolve().parents[2] / "src")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [repo_src, env.get("PYTHONPATH", "")]))
    if interpret:
        env["TRITON_INTERPRET"] = "1"
    brought = wheel_names(wheels)
    todo = [
        (name, code, INTERPRET_PARTS.get(name, parts) if interpret else parts, hint)
        for name, (code, parts, hint) in PROBES.items()
        if not (interpret and name in INTERPRET_SKIP) and not (not interpret and name in GPU_SKIP)
    ]
    with ThreadPoolExecutor(max_workers=4) as pool:  # in parallel: --check answers in seconds
        answers = {
            name: pool.submit(probe, code, env) for name, code, _, _ in todo if name not in brought
        }
        rows = []
        for name, _, parts, hint in todo:
            if name in brought:
                ok, found, seconds = True, f"in --wheels {wheels}", 0.0
            else:
                ok, found, seconds = answers[name].result()
            rows.append(
                {"name": name, "ok": ok, "found": found, "parts": list(parts),
                 "optional": name in OPTIONAL, "hint": hint, "seconds": round(seconds, 1)}
            )  # fmt: skip
    return rows


def missing_for(part: str, rows: list[dict]) -> str:
    why = [
        f"{r['name']}: {r['found']} ({r['hint']})"
        for r in rows
        if not r["ok"] and part in r["parts"]
    ]
    if not why:
        return ""
    optional = all(r["optional"] for r in rows if not r["ok"] and part in r["parts"])
    return ("optional: " if optional else "") + "; ".join(why)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--missing-for"]:
        rows = json.loads(Path(argv[2]).read_text())["requirements"]
        print(missing_for(argv[1], rows))
        return 0
    interpret = "--interpret" in argv
    wheels = argv[argv.index("--wheels") + 1] if "--wheels" in argv else None
    out = argv[argv.index("--json") + 1] if "--json" in argv else None
    t0 = time.monotonic()
    rows = check(interpret, wheels)
    mode = "interpret (CPU, TRITON_INTERPRET=1)" if interpret else "GPU"
    print(f"gpu_check --check ({mode}), {sys.executable}:")
    for r in rows:
        state = "ok" if r["ok"] else ("optional" if r["optional"] else "MISSING")
        detail = r["found"] if r["ok"] else f"{r['found']} -> {r['hint']}"
        print(f"  {state:8} {r['name']:14} {detail}  [parts: {', '.join(r['parts'])}]")
    required_missing = [r["name"] for r in rows if not r["ok"] and not r["optional"]]
    verdict = (
        "MISSING: " + ", ".join(required_missing) if required_missing else "all required there"
    )
    print(f"{verdict} ({time.monotonic() - t0:.1f} s)")
    if out:
        Path(out).write_text(json.dumps({"interpret": interpret, "requirements": rows}, indent=2))
    return 2 if required_missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
