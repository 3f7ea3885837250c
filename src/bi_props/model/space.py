"""Search spaces as data: load and validate ``strategies/<profile>.toml``.

A space says which ops, dtypes, layouts, value classes and extents a profile explores, and carries
the profile's Hypothesis settings and runner limits. Every problem is reported once, naming the
file, the key and what is wrong, because a typo in a nightly configuration should not cost a night.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from .case import COMPANION_CONTENTS, DTYPES, LAYOUTS, MODES, PARITY_DTYPES, VALUE_CLASSES
from .deployment import SCALE_POINTS, VOCAB_SIZES
from .op_registry import OPS
from .scenario import ScenarioSpace

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

PROFILES = ("cpu", "ci", "dev", "ascend", "cuda", "nightly")
MODEL_OP = "hf_model"
"""The op of a user's transformers model (catalogue/hf.py)."""
MODEL_ATTENTION = ("eager", "sdpa")
"""``[model] attention``: transformers' attn_implementation values a run may ask for."""
OPT_IN_OPS = ("engine", MODEL_OP)
"""Catalogue ops explored only where a space names them in ``[ops] include`` (a real engine, a
user's transformers model: ``bi-props model``)."""
DEFAULT_OPS = tuple(op for op in OPS if op not in OPT_IN_OPS)
"""The built-in ops a space explores by default; registered ops (a target's EXTRA_OPS) are
added to a parsed space's default (``default_ops``)."""


def default_ops() -> tuple[str, ...]:
    """Every op registered now but the opt-in ones: the built-in ones, then users'."""
    return tuple(op for op in OPS if op not in OPT_IN_OPS)


def _unknown_ops_hint(target: Any = None) -> str:
    """Why a target module's own ops may be missing (its EXTRA_OPS could not be read): the
    space's own ``[profile] target`` where it names one (other modules this process failed to
    read earlier are no reason here), else every module that could not be read."""
    from .declare import _DECLARED

    problems = [
        f"{spec}: {why}"
        for spec, why in _DECLARED.items()
        if why and (not isinstance(target, str) or spec == target)
    ]
    return f" (EXTRA_OPS not read from target module {'; '.join(problems)})" if problems else ""


THRESHOLDS = (1, 2, 8, 10, 16, 17, 32, 33, 44, 45, 64, 65, 128, 129, 255, 256, 257, 1024, 2048)
"""Batch sizes where reported kernels switch (FlashAttention-3's 10 query tokens, vLLM's rms_norm
test at 255 vs 300 rows, samplers: a top-k path at 8 rows (vLLM #50979), FlashInfer's at 44-45
co-resident sequences (vLLM #51187), tile edges and their neighbours): the batch strategy aims
the number of sequences at them, and the report counts how often each was crossed."""


class SpaceError(ValueError):
    """A search-space file that cannot be used; the message says file, key and fix."""


CONTROL_SHARE = 0.25
"""Default largest share of a campaign's budget the negative controls may use: a 60 s run on two
cores needs about a quarter for 22 controls to see variance or spend their quota of 200."""


@dataclass(frozen=True)
class Extent:
    min: int
    max: int


@dataclass(frozen=True)
class Space:
    """A validated search space. Field defaults are the values a missing key means."""

    source: str
    profile: str
    description: str = ""
    target: str = "cpu"
    # Hypothesis settings of the profile.
    max_examples: int = 50
    derandomize: bool = False
    database: str = "directory"
    print_blob: bool = True
    # Runner limits.
    example_timeout_s: float = 60.0
    start_timeout_s: float = 300.0
    control_examples: int = 200
    # Draws of each enabled batch-comparing cell's own strategy that its negative control runs
    # with the switch off, to measure p, the stock kernel's hit rate there (the power probe).
    power_examples: int = 30
    # A claimed op's enabled reference and batch-invariance cells need this many judged
    # examples (not degenerate, not order-blind), or the run exits 3: thin evidence.
    min_judged: int = 10
    # Nested windows each batch-invariance example runs beside its needle (model/windows.py;
    # 0: the needle alone). A slow target's space lowers it: each window is a kernel call.
    batch_windows: int = 5
    # Explicit known batch-variant cases an enabled batch-comparing cell runs (each with its
    # own data and with other data), the smallest first.
    known_cases: int = 24
    # the largest share of a campaign's budget the negative controls may use
    control_share: float = CONTROL_SHARE
    fork_workers: bool = True  # replacement workers forked from a loaded parent (CPU targets)
    # One determinism example in this many is also compared in a second, freshly started
    # worker (determinism across processes); 0 turns it off.
    cross_process_every: int = 8
    # What to explore.
    ops: tuple[str, ...] = DEFAULT_OPS
    # Properties whose cells and controls this space leaves out ([properties] exclude): a lane
    # whose budget and pinned findings were measured without them.
    exclude_properties: tuple[str, ...] = ()
    dtypes: tuple[str, ...] = DTYPES
    # Parity only, one example in PARITY_EXTRA_EVERY: dtypes beyond ``dtypes`` ([] turns it off).
    parity_dtypes: tuple[str, ...] = PARITY_DTYPES
    layouts: tuple[str, ...] = LAYOUTS
    values: tuple[str, ...] = VALUE_CLASSES
    # How entry points are called ([modes] choices; Case.mode): eager only by default, since a
    # compiled cell pays seconds of Inductor compile per new graph. Eager first: shrinking goes
    # there. A target's own modes narrow it (Target.modes; campaigns/modes.py).
    modes: tuple[str, ...] = ("eager",)
    # Elementwise ops (OpSpec.sweep): every bf16 and fp16 bit pattern once per campaign.
    exhaustive: bool = True
    rows: Extent = Extent(1, 600)
    dim: Extent = Extent(0, 256)
    boundaries: tuple[int, ...] = (16, 32, 64, 128, 256)
    max_companions: int = 7
    companion_rows: Extent = Extent(1, 600)
    # What companions' values may hold besides the needle's class ([batch] contents;
    # COMPANION_CONTENTS): ["plain"] turns companion content off.
    companion_contents: tuple[str, ...] = COMPANION_CONTENTS
    # Sequence ops (attention, paged decode): a batch may hold up to this many sequences, many
    # of them short, within ``max_batch_tokens`` companion tokens (the cost of one example).
    max_sequences: int = 64
    max_batch_tokens: int = 4096
    thresholds: tuple[int, ...] = THRESHOLDS
    # Ops that allow it (OpSpec.padded) draw the padded layout, a batch padded to a length
    # (Case.padded), in some examples; false: packed batches only.
    padded: bool = True
    attention_length: Extent = Extent(1, 48)
    head_dims: tuple[int, ...] = (8, 16, 32, 64)
    # A paged decode sequence's context (the needle's and each companion's), small draws.
    paged_context: int = 512
    # Deployment sizes ([scale]; model/deployment.py): one example in ``scale_every`` of an op
    # with a deployment axis (OpSpec.scale) is drawn at the sizes models run at (0: never;
    # properties comparing a batch: twice as often): vocabulary-wide last dims, long contexts,
    # far positions, steps of thousands of tokens, each on a named size or one off it, and
    # within ``max_elements`` (the example's cost).
    scale_every: int = 16
    vocab_sizes: tuple[int, ...] = VOCAB_SIZES
    scale_points: tuple[int, ...] = SCALE_POINTS
    max_context: int = 8192
    max_position: int = 65536
    max_tokens: int = 8192
    max_elements: int = 1 << 20
    op_dim: dict[str, Extent] = field(default_factory=dict)
    # A user's transformers model ([model]; the hf_model op, ``bi-props model``): a built-in
    # configuration's name, a config.json or a model directory; layers and hidden cut it down
    # where set; attention: transformers' attn_implementation (default: the configuration's).
    model_spec: str | None = None
    model_layers: int | None = None
    model_hidden: int | None = None
    model_attention: str | None = None
    # Engine scenarios (bi_props.catalogue.scenarios): their own limits, [scenarios] table.
    scenarios: ScenarioSpace = field(default_factory=ScenarioSpace)

    @property
    def asked_ops(self) -> tuple[str, ...]:
        """Ops whose model-level question the user asks of any target: a space naming a model
        ([model], ``bi-props model``) asks it of that model, whatever ops the target claims, so a
        batch-variant model with the switch on is a failure, not an unclaimed op's note."""
        return (MODEL_OP,) if self.model_spec else ()

    def dim_for(self, op: str) -> Extent:
        return self.op_dim.get(op, self.dim)

    @property
    def switch_points(self) -> tuple[int, ...]:
        """The named thresholds and the space's own tile boundaries, sorted."""
        return tuple(sorted(set(self.thresholds) | set(self.boundaries)))


_SECTIONS: dict[str, dict[str, str]] = {
    "profile": {"description": "str", "target": "str"},
    "hypothesis": {
        "max_examples": "int",
        "derandomize": "bool",
        "database": "str",
        "print_blob": "bool",
    },
    "runner": {
        "example_timeout_s": "num",
        "start_timeout_s": "num",
        "control_examples": "int",
        "power_examples": "int",
        "min_judged": "int",
        "batch_windows": "int",
        "known_cases": "int",
        "control_share": "num",
        "fork_workers": "bool",
        "cross_process_every": "int",
    },
    "ops": {"include": "list[str]", "exclude": "list[str]"},
    "properties": {"exclude": "list[str]"},
    "dtypes": {"choices": "list[str]", "parity": "list[str]"},
    "layouts": {"choices": "list[str]"},
    "modes": {"choices": "list[str]"},
    "values": {"choices": "list[str]", "exhaustive": "bool"},
    "shapes": {"rows": "extent", "dim": "extent", "boundaries": "list[int]"},
    "batch": {
        "max_companions": "int",
        "companion_rows": "extent",
        "contents": "list[str]",
        "max_sequences": "int",
        "max_batch_tokens": "int",
        "thresholds": "list[int]",
        "padded": "bool",
    },
    "attention": {"length": "extent", "head_dims": "list[int]", "paged_context": "int"},
    "scale": {
        "every": "int",
        "vocab_sizes": "list[int]",
        "points": "list[int]",
        "max_context": "int",
        "max_position": "int",
        "max_tokens": "int",
        "max_elements": "int",
    },
    "model": {"spec": "str", "layers": "int", "hidden": "int", "attention": "str"},
    "scenarios": {
        "max_requests": "int",
        "prompt_tokens": "extent",
        "max_tokens": "int",
        "max_arrival": "int",
        "shared_blocks": "int",
        "seeded": "bool",
        "chunk_budgets": "list[int]",
        "kv_blocks": "list[int]",
        "max_num_seqs": "list[int]",
        "cuda_graph_sizes": "list[int]",
        "cuda_graph_mode": "str",
    },
}


def _fail(source: str, key: str, problem: str) -> SpaceError:
    return SpaceError(f"{source}: key '{key}': {problem}")


# Allowed ranges of the numeric keys: dotted key -> (low, high, low inclusive, what it is).
# Every number must be finite (TOML accepts nan and inf) and within its range.
RANGES: dict[str, tuple[float, float, bool, str]] = {
    "hypothesis.max_examples": (1, 10**9, True, "examples per test"),
    "runner.example_timeout_s": (0, 86400, False, "seconds"),
    "runner.start_timeout_s": (0, 86400, False, "seconds"),
    "runner.control_examples": (1, 10**9, True, "examples per negative control"),
    "runner.control_share": (0, 1, True, "a share of --budget"),
    "runner.power_examples": (0, 10**9, True, "draws of the power probe per control"),
    "runner.min_judged": (0, 10**9, True, "judged examples a claimed op's cell needs"),
    "runner.batch_windows": (0, 64, True, "windows of a batch per example"),
    "runner.known_cases": (0, 10**6, True, "known batch-variant cases a cell runs"),
    "batch.max_companions": (1, 10**6, True, "companions in a batch"),
    "batch.max_sequences": (1, 10**6, True, "sequences in a batch of a sequence op"),
    "batch.max_batch_tokens": (1, 10**9, True, "companion tokens of a many-sequence batch"),
    "runner.cross_process_every": (0, 10**6, True, "determinism examples per cross-process one"),
    "model.layers": (1, 10**4, True, "transformer layers"),
    "model.hidden": (1, 10**6, True, "hidden width"),
    "attention.paged_context": (1, 10**7, True, "KV tokens of a paged decode sequence"),
    "scale.every": (0, 10**6, True, "examples per deployment-size one (0: never)"),
    "scale.max_context": (1, 10**7, True, "keys of a deployment-size sequence"),
    "scale.max_position": (1, 10**8, True, "positions of a deployment-size rotary cache"),
    "scale.max_tokens": (1, 10**7, True, "rows of a deployment-size batch"),
    "scale.max_elements": (1, 10**11, True, "elements a deployment-size example may cost"),
    "scenarios.max_requests": (1, 64, True, "requests in a scenario"),
    "scenarios.max_tokens": (1, 256, True, "generated tokens of a request"),
    "scenarios.max_arrival": (0, 64, True, "the latest engine step a request arrives at"),
    "scenarios.shared_blocks": (0, 64, True, "KV blocks a companion shares with the needle"),
}


def allowed_range(key: str) -> str:
    """The allowed range of a numeric key, in words: ``[1, 1e+09]`` or ``(0, 86400]``."""
    low, high, inclusive, what = RANGES[key]
    return f"{'[' if inclusive else '('}{low:g}, {high:g}] ({what})"


def _in_range(source: str, key: str, value: Any) -> None:
    import math

    low, high, inclusive, _ = RANGES[key]
    finite = math.isfinite(value)
    above_low = value >= low if inclusive else value > low
    if not (finite and above_low and value <= high):
        problem = "must be a finite number" if not finite else "out of range"
        raise _fail(source, key, f"{problem}, got {value!r}; allowed: {allowed_range(key)}")


def _check(source: str, key: str, kind: str, value: Any) -> Any:
    ok = {
        "str": lambda v: isinstance(v, str),
        "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "num": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        "bool": lambda v: isinstance(v, bool),
        "list[str]": lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
        "list[int]": lambda v: (
            isinstance(v, list) and all(isinstance(x, int) and not isinstance(x, bool) for x in v)
        ),
        "extent": lambda v: (
            isinstance(v, dict)
            and set(v) == {"min", "max"}
            and all(isinstance(x, int) and not isinstance(x, bool) for x in v.values())
        ),
    }[kind]
    if not ok(value):
        want = {"extent": "a table like { min = 1, max = 64 }"}.get(kind, kind)
        raise _fail(source, key, f"expected {want}, got {value!r}")
    if kind == "extent":
        if not 0 <= value["min"] <= value["max"]:
            raise _fail(source, key, f"need 0 <= min <= max, got {value!r}")
        return Extent(value["min"], value["max"])
    return value


def _choices(source: str, key: str, values: list[str], allowed: tuple[str, ...]) -> tuple[str, ...]:
    unknown = [v for v in values if v not in allowed]
    if unknown:
        raise _fail(source, key, f"unknown {unknown}; choose from {list(allowed)}")
    if not values:
        raise _fail(source, key, "must not be empty")
    return tuple(dict.fromkeys(values))


def parse(data: dict[str, Any], source: str, profile: str) -> Space:
    """Validate a decoded TOML document into a Space."""
    fields: dict[str, Any] = {"source": source, "profile": profile}
    op_dim: dict[str, Extent] = {}
    target = (
        data.get("profile", {}).get("target") if isinstance(data.get("profile"), dict) else None
    )
    if isinstance(target, str):  # a third-party target's own ops (EXTRA_OPS) count from here on
        from .declare import declare_ops

        declare_ops(target)
    for section, body in data.items():
        if section == "op":
            if not isinstance(body, dict):
                raise _fail(source, "op", "expected tables like [op.mm]")
            for op, table in body.items():
                if op not in OPS:
                    raise _fail(
                        source,
                        f"op.{op}",
                        f"unknown op; the catalogue has {list(OPS)}{_unknown_ops_hint(target)}",
                    )
                if not isinstance(table, dict) or set(table) - {"dim"}:
                    raise _fail(source, f"op.{op}", "only 'dim = { min, max }' may be set here")
                if "dim" in table:
                    op_dim[op] = _check(source, f"op.{op}.dim", "extent", table["dim"])
            continue
        if section not in _SECTIONS:
            raise _fail(source, section, f"unknown section; known: {[*_SECTIONS, 'op']}")
        if not isinstance(body, dict):
            raise _fail(source, section, "expected a table")
        for key, value in body.items():
            dotted = f"{section}.{key}"
            if key not in _SECTIONS[section]:
                raise _fail(source, dotted, f"unknown key; known: {list(_SECTIONS[section])}")
            fields[(section, key)] = _check(source, dotted, _SECTIONS[section][key], value)
            if dotted in RANGES:
                _in_range(source, dotted, value)

    space: dict[str, Any] = {"source": source, "profile": profile, "op_dim": op_dim}
    simple = {
        ("profile", "description"): "description",
        ("profile", "target"): "target",
        ("hypothesis", "max_examples"): "max_examples",
        ("hypothesis", "derandomize"): "derandomize",
        ("hypothesis", "database"): "database",
        ("hypothesis", "print_blob"): "print_blob",
        ("runner", "example_timeout_s"): "example_timeout_s",
        ("runner", "start_timeout_s"): "start_timeout_s",
        ("runner", "control_examples"): "control_examples",
        ("runner", "power_examples"): "power_examples",
        ("runner", "min_judged"): "min_judged",
        ("runner", "batch_windows"): "batch_windows",
        ("runner", "known_cases"): "known_cases",
        ("runner", "control_share"): "control_share",
        ("runner", "fork_workers"): "fork_workers",
        ("runner", "cross_process_every"): "cross_process_every",
        ("shapes", "rows"): "rows",
        ("shapes", "dim"): "dim",
        ("batch", "max_companions"): "max_companions",
        ("batch", "companion_rows"): "companion_rows",
        ("batch", "max_sequences"): "max_sequences",
        ("batch", "max_batch_tokens"): "max_batch_tokens",
        ("batch", "padded"): "padded",
        ("values", "exhaustive"): "exhaustive",
        ("attention", "length"): "attention_length",
        ("attention", "paged_context"): "paged_context",
        ("scale", "every"): "scale_every",
        ("scale", "max_context"): "max_context",
        ("scale", "max_position"): "max_position",
        ("scale", "max_tokens"): "max_tokens",
        ("scale", "max_elements"): "max_elements",
        ("model", "spec"): "model_spec",
        ("model", "layers"): "model_layers",
        ("model", "hidden"): "model_hidden",
        ("model", "attention"): "model_attention",
    }
    for key, name in simple.items():
        if key in fields:
            space[name] = fields[key]
    if ("hypothesis", "database") in fields and space["database"] not in ("directory", "none"):
        raise _fail(source, "hypothesis.database", "expected 'directory' or 'none'")
    if ("shapes", "rows") in fields and space["rows"].min < 1:
        raise _fail(source, "shapes.rows", "the needle needs at least one row: min >= 1")
    if ("batch", "companion_rows") in fields and space["companion_rows"].min < 1:
        raise _fail(source, "batch.companion_rows", "min must be >= 1")
    include = fields.get(("ops", "include"), list(default_ops()))
    exclude = fields.get(("ops", "exclude"), [])
    try:
        ops = _choices(source, "ops.include", include, tuple(OPS))
        _choices(source, "ops.exclude", exclude or [ops[0]], tuple(OPS))
    except SpaceError as exc:
        raise SpaceError(f"{exc}{_unknown_ops_hint(target)}") from None
    space["ops"] = tuple(o for o in ops if o not in exclude)
    if not space["ops"]:
        raise _fail(source, "ops.exclude", "excludes every op")
    if ("properties", "exclude") in fields:
        from .property_spec import PROPERTIES

        left_out = fields["properties", "exclude"]
        unknown = [p for p in left_out if p not in PROPERTIES]
        if unknown:
            raise _fail(
                source, "properties.exclude", f"unknown {unknown}; choose from {list(PROPERTIES)}"
            )
        space["exclude_properties"] = tuple(dict.fromkeys(left_out))
    for section, allowed, name in (
        ("dtypes", DTYPES, "dtypes"),
        ("layouts", LAYOUTS, "layouts"),
        ("modes", MODES, "modes"),
        ("values", VALUE_CLASSES, "values"),
    ):
        if (section, "choices") in fields:
            space[name] = _choices(
                source, f"{section}.choices", fields[section, "choices"], allowed
            )
    if ("batch", "contents") in fields:  # plain first, always: where shrinking goes
        drawn = _choices(source, "batch.contents", fields["batch", "contents"], COMPANION_CONTENTS)
        space["companion_contents"] = ("plain", *(c for c in COMPANION_CONTENTS[1:] if c in drawn))
    if "modes" in space:  # in MODES' order whatever the file's: eager first, where shrinking goes
        space["modes"] = tuple(m for m in MODES if m in space["modes"])
    if ("dtypes", "parity") in fields:
        extra = fields["dtypes", "parity"]
        space["parity_dtypes"] = (
            _choices(source, "dtypes.parity", extra, (*PARITY_DTYPES, *DTYPES)) if extra else ()
        )
    for section, key, name, what in (
        ("shapes", "boundaries", "boundaries", "extents"),
        ("batch", "thresholds", "thresholds", "batch sizes"),
        ("scale", "vocab_sizes", "vocab_sizes", "vocabulary sizes"),
        ("scale", "points", "scale_points", "deployment sizes"),
    ):
        if (section, key) in fields:
            sizes = fields[section, key]
            if any(v < 1 for v in sizes):
                raise _fail(source, f"{section}.{key}", f"got {sizes!r}; allowed: {what} >= 1")
            if not sizes and key in ("vocab_sizes", "points"):
                raise _fail(source, f"{section}.{key}", "must not be empty")
            space[name] = tuple(sizes) if key == "boundaries" else tuple(sorted(set(sizes)))
    if ("attention", "head_dims") in fields:
        dims = fields["attention", "head_dims"]
        if not dims or any(d < 1 for d in dims):
            raise _fail(source, "attention.head_dims", "need positive head sizes")
        space["head_dims"] = tuple(dims)
    if ("model", "attention") in fields and fields["model", "attention"] not in MODEL_ATTENTION:
        raise _fail(
            source, "model.attention", f"choose from {list(MODEL_ATTENTION)} (transformers' names)"
        )
    space["scenarios"] = _scenario_space(source, fields)
    return Space(**space)


def _scenario_space(source: str, fields: dict[Any, Any]) -> ScenarioSpace:
    """The [scenarios] table: defaults for missing keys, then the limits checked together."""
    values: dict[str, Any] = {}
    for key in ("max_requests", "max_tokens", "max_arrival", "shared_blocks", "seeded"):
        if ("scenarios", key) in fields:
            values[key] = fields["scenarios", key]
    if ("scenarios", "prompt_tokens") in fields:
        extent = fields["scenarios", "prompt_tokens"]
        values["prompt_min"], values["prompt_max"] = extent.min, extent.max
    if ("scenarios", "cuda_graph_mode") in fields:
        values["cuda_graph_mode"] = fields["scenarios", "cuda_graph_mode"]
    for key in ("chunk_budgets", "kv_blocks", "max_num_seqs", "cuda_graph_sizes"):
        if ("scenarios", key) in fields:
            sizes = fields["scenarios", key]
            if not sizes or any(v < 1 for v in sizes):
                raise _fail(source, f"scenarios.{key}", f"need a list of sizes >= 1, got {sizes}")
            values[key] = tuple(sorted(set(sizes)))
    limits = ScenarioSpace(**values)
    problem = limits.check()
    if problem:
        key, _, why = problem.partition(": ")
        raise _fail(source, f"scenarios.{key}", why)
    return limits


def bundled_dir() -> Path:
    """Where the shipped spaces are: inside the wheel, or the checkout's top-level strategies/."""
    packaged = resources.files("bi_props") / "_strategies"
    if packaged.is_dir():
        return Path(str(packaged))
    return Path(__file__).resolve().parents[3] / "strategies"


def load(path: str | Path, profile: str | None = None) -> Space:
    """Load and validate one search-space file."""
    path = Path(path)
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpaceError(f"{source}: no such strategies file") from None
    except OSError as exc:
        raise SpaceError(f"{source}: cannot read: {exc}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SpaceError(f"{source}: not valid TOML: {exc}") from None
    return parse(data, source, profile or path.stem)


def load_profile(profile: str) -> Space:
    """The bundled space of a named profile."""
    path = bundled_dir() / f"{profile}.toml"
    if not path.exists():
        raise SpaceError(f"{path}: no bundled strategies for profile {profile!r}; have {PROFILES}")
    return load(path, profile)
