"""An alias: the module moved to ``bi_props.targets.triton_compat`` (only targets and the worker
use it). This name is the same module object, for the scripts, lanes and docs that import it."""

import sys

from ..targets import triton_compat as _module

sys.modules[__name__] = _module
