"""An alias: the module moved to ``bi_props.targets.triton_cpu_backend`` (only targets and the
worker use it). This name is the same module object, for the scripts, lanes and docs."""

import sys

from ..targets import triton_cpu_backend as _module

sys.modules[__name__] = _module
