"""vllm-ascend versions: PEP 440 ordering (no dependency) and the version each behaviour of the
``ascend`` target's switch first appears in (``ascend_routes`` re-exports all of it)."""

from __future__ import annotations

import re

# ---------------------------------------------------------------------------------------------
# Versions (PEP 440 ordering, as packaging.version orders them; no dependency)

_VERSION_RE = re.compile(
    r"""^\s*v?
    (?:(?P<epoch>\d+)!)?
    (?P<release>\d+(?:\.\d+)*)
    (?:[-_.]?(?P<pre_l>alpha|a|beta|b|preview|pre|c|rc)[-_.]?(?P<pre_n>\d*))?
    (?:-(?P<post_n1>\d+)|[-_.]?(?P<post_l>post|rev|r)[-_.]?(?P<post_n2>\d*))?
    (?:[-_.]?(?P<dev_l>dev)[-_.]?(?P<dev_n>\d*))?
    (?:\+(?P<local>[a-z0-9]+(?:[-_.][a-z0-9]+)*))?
    \s*$""",
    re.VERBOSE | re.IGNORECASE,
)
_PRE_ORDER = {"a": 0, "alpha": 0, "b": 1, "beta": 1, "c": 2, "rc": 2, "pre": 2, "preview": 2}
_INF = float("inf")


def version_key(text: str | None) -> tuple | None:
    """A sort key ordering versions as PEP 440 does (dev < pre < final < post); None if unparsable.

    The local part (``+g1234``) is ignored. CANN's ``8.3.RC1`` parses as ``8.3rc1``.
    """
    if not text:
        return None
    m = _VERSION_RE.match(str(text))
    if m is None:
        return None
    release = [int(p) for p in m["release"].split(".")]
    while len(release) > 1 and release[-1] == 0:
        release.pop()
    has_post = m["post_l"] is not None or m["post_n1"] is not None
    has_dev = m["dev_l"] is not None
    if m["pre_l"] is not None:
        pre: tuple = (_PRE_ORDER[m["pre_l"].lower()], int(m["pre_n"] or 0))
    elif has_dev and not has_post:
        pre = (-1, 0)  # 1.0.dev0 sorts before 1.0a0
    else:
        pre = (3, 0)
    post = int(m["post_n1"] or m["post_n2"] or 0) if has_post else -1
    dev = int(m["dev_n"] or 0) if has_dev else _INF
    return (int(m["epoch"] or 0), tuple(release), pre, post, dev)


def version_at_least(text: str | None, minimum: str) -> bool | None:
    """Whether ``text`` >= ``minimum``; None when ``text`` is missing or unparsable."""
    have, want = version_key(text), version_key(minimum)
    if have is None or want is None:
        return None
    return have >= want


def in_range(text: str | None, since: str | None = None, before: str | None = None) -> bool:
    """``since <= text < before`` (open ends when None); an unknown ``text`` reads as REFERENCE."""
    text = text if version_key(text) is not None else REFERENCE_VERSION
    if since is not None and not version_at_least(text, since):
        return False
    return not (before is not None and version_at_least(text, before))


# The version whose wheel the contract check reads in CI; an unknown version is taken as this one.
REFERENCE_VERSION = "0.23.0"
# First tags with each behaviour (git tags of vllm-project/vllm-ascend, read file by file).
FIRST_VERSION = "0.13.0rc2"  # vllm_ascend/batch_invariant.py appears (Triton only)
ASCENDC_SINCE = "0.15.0rc1"  # HAS_ASCENDC_BATCH_INVARIANT, AscendC registrations, attention swap
SOFTMAX_SINCE = "0.16.0rc1"  # Triton aten::softmax / aten::_softmax
SWAPS_SINCE = "0.16.0rc1"  # torch.sum -> reduce_sum, torch_npu.npu_add_rms_norm -> add_rms_norm
ASCEND_CONFIG_SINCE = "0.20.2rc1"  # override_envs_for_invariance() calls get_ascend_config()
# PyPI releases (0.26.0rc1 wheel, 0.27.1rc1 sdist): aten::sum registered up to 0.26.0rc1, then
# replaced by the torch.Tensor.sum swap (UPSTREAM.md's "0.30.0rc2, PR #14949" is later than that).
ATEN_SUM_BEFORE = "0.27.1rc1"
TENSOR_SUM_SINCE = "0.27.1rc1"
REDUCE_SUM_DTYPE_SINCE = "0.30.0rc1"  # reduce_sum(x, dim, keepdim, *, axis, dtype): last dim only
# UNVERIFIED (UPSTREAM.md): torch_npu.npu.set_deterministic_level(3) = batch consistency.
DETERMINISTIC_LEVEL = 3
DETERMINISTIC_TORCH_NPU_SINCE = "26.2.0"
DETERMINISTIC_CANN_SINCE = "9.2.0"
