"""space.py: the bundled profiles load; a bad file is reported with its path, the dotted key and
the problem; a parsed space fills in defaults."""

from __future__ import annotations

from pathlib import Path

import pytest

from bi_props.catalogue import OPS
from bi_props.model.case import DTYPES, LAYOUTS, VALUE_CLASSES
from bi_props.model.space import (
    DEFAULT_OPS,
    PROFILES,
    Extent,
    Space,
    SpaceError,
    bundled_dir,
    load,
    load_profile,
    parse,
)

REPO = Path(__file__).resolve().parents[1]


def test_bundled_dir_holds_every_profile():
    directory = bundled_dir()
    assert directory.is_dir()
    names = {p.stem for p in directory.glob("*.toml")}
    assert set(PROFILES) <= names
    # In the editable checkout it is the top-level strategies/ folder.
    assert (directory / "cpu.toml").read_text() == (REPO / "strategies" / "cpu.toml").read_text()


@pytest.mark.parametrize("profile", PROFILES)
def test_every_bundled_profile_loads(profile):
    space = load_profile(profile)
    assert isinstance(space, Space)
    assert space.profile == profile
    assert space.source == str(bundled_dir() / f"{profile}.toml")
    assert space.ops and set(space.ops) <= set(OPS)
    assert set(space.dtypes) <= set(DTYPES) and space.dtypes
    assert set(space.layouts) <= set(LAYOUTS) and space.layouts
    assert set(space.values) <= set(VALUE_CLASSES) and space.values
    assert 1 <= space.rows.min <= space.rows.max
    assert 0 <= space.dim.min <= space.dim.max
    assert space.max_examples >= 1 and space.max_companions >= 1
    assert space.head_dims and all(d >= 1 for d in space.head_dims)
    assert space.description


def test_bundled_profile_values_come_from_the_file():
    ci = load_profile("ci")
    assert (ci.max_examples, ci.derandomize, ci.database) == (15, True, "none")
    assert ci.rows == Extent(1, 200) and ci.dim == Extent(0, 96)
    assert ci.boundaries == (16, 32, 64)
    assert ci.max_companions == 5 and ci.companion_rows == Extent(1, 200)
    assert ci.attention_length == Extent(1, 24) and ci.head_dims == (8, 16)
    assert ci.example_timeout_s == 60 and ci.start_timeout_s == 120
    cuda = load_profile("cuda")
    assert cuda.target == "vllm"
    assert cuda.dtypes == ("bfloat16", "float16", "float32")
    assert load_profile("nightly").target == ""


def test_load_profile_unknown_name():
    with pytest.raises(SpaceError, match="no bundled strategies for profile 'nope'"):
        load_profile("nope")


def test_parse_fills_defaults():
    space = parse({}, "mem.toml", "mine")
    assert space == Space(source="mem.toml", profile="mine")
    assert space.ops == DEFAULT_OPS and "engine" not in space.ops  # engine is opt-in
    assert space.dtypes == DTYPES and space.layouts == LAYOUTS and space.values == VALUE_CLASSES
    assert space.rows == Extent(1, 600) and space.dim == Extent(0, 256)
    assert space.max_examples == 50 and space.database == "directory"
    assert space.op_dim == {}
    assert space.dim_for("mm") == space.dim


def test_parse_keeps_given_values_and_defaults_the_rest():
    space = parse(
        {
            "hypothesis": {"max_examples": 3},
            "ops": {"include": ["mm", "sum", "softmax"], "exclude": ["sum"]},
            "dtypes": {"choices": ["float16", "float16", "bfloat16"]},
            "shapes": {"dim": {"min": 2, "max": 9}},
            "op": {"mm": {"dim": {"min": 1, "max": 4}}},
            "runner": {"example_timeout_s": 1.5},
        },
        "mem.toml",
        "mine",
    )
    assert space.max_examples == 3
    assert space.ops == ("mm", "softmax")
    assert space.dtypes == ("float16", "bfloat16")  # deduplicated, order kept
    assert space.dim == Extent(2, 9)
    assert space.dim_for("mm") == Extent(1, 4)
    assert space.dim_for("softmax") == Extent(2, 9)
    assert space.example_timeout_s == 1.5
    assert space.layouts == LAYOUTS and space.rows == Extent(1, 600)


def test_load_uses_the_file_stem_as_profile(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text('[profile]\ndescription = "x"\n[layouts]\nchoices = ["offset"]\n')
    space = load(path)
    assert space.profile == "mine" and space.source == str(path)
    assert space.layouts == ("offset",) and space.description == "x"
    assert load(path, "other").profile == "other"


# ---------------------------------------------------------------------------------------------
# Bad files: (toml text, dotted key or None, fragment of the problem)

BAD = {
    "invalid_toml": ("[shapes\nrows = 1\n", None, "not valid TOML"),
    "unknown_section": ("[shape]\nrows = { min = 1, max = 2 }\n", "shape", "unknown section"),
    "unknown_key": ("[shapes]\nrow = { min = 1, max = 2 }\n", "shapes.row", "unknown key"),
    "string_for_int": (
        '[hypothesis]\nmax_examples = "10"\n',
        "hypothesis.max_examples",
        "expected int",
    ),
    "bool_for_int": (
        "[hypothesis]\nmax_examples = true\n",
        "hypothesis.max_examples",
        "expected int",
    ),
    "float_for_int": ("[batch]\nmax_companions = 2.5\n", "batch.max_companions", "expected int"),
    "int_for_bool": ("[hypothesis]\nderandomize = 1\n", "hypothesis.derandomize", "expected bool"),
    "bool_for_num": (
        "[runner]\nexample_timeout_s = true\n",
        "runner.example_timeout_s",
        "expected num",
    ),
    "min_above_max": ("[shapes]\ndim = { min = 9, max = 3 }\n", "shapes.dim", "min <= max"),
    "negative_min": ("[shapes]\ndim = { min = -1, max = 3 }\n", "shapes.dim", "min <= max"),
    "missing_max": ("[shapes]\nrows = { min = 1 }\n", "shapes.rows", "{ min = 1, max = 64 }"),
    "extent_not_table": ("[attention]\nlength = 5\n", "attention.length", "a table like"),
    "zero_rows": ("[shapes]\nrows = { min = 0, max = 3 }\n", "shapes.rows", "min >= 1"),
    "unknown_dtype": (
        '[dtypes]\nchoices = ["float32", "float8"]\n',
        "dtypes.choices",
        "unknown ['float8']",
    ),
    "unknown_layout": (
        '[layouts]\nchoices = ["diagonal"]\n',
        "layouts.choices",
        "unknown ['diagonal']",
    ),
    "unknown_value_class": ('[values]\nchoices = ["huge"]\n', "values.choices", "unknown ['huge']"),
    "unknown_included_op": ('[ops]\ninclude = ["mm", "conv"]\n', "ops.include", "unknown ['conv']"),
    "unknown_excluded_op": ('[ops]\nexclude = ["conv"]\n', "ops.exclude", "unknown ['conv']"),
    "empty_dtypes": ("[dtypes]\nchoices = []\n", "dtypes.choices", "must not be empty"),
    "empty_layouts": ("[layouts]\nchoices = []\n", "layouts.choices", "must not be empty"),
    "empty_values": ("[values]\nchoices = []\n", "values.choices", "must not be empty"),
    "empty_include": ("[ops]\ninclude = []\n", "ops.include", "must not be empty"),
    "exclude_everything": (
        '[ops]\ninclude = ["mm", "sum"]\nexclude = ["sum", "mm"]\n',
        "ops.exclude",
        "excludes every op",
    ),
    "unknown_op_table": ("[op.nope]\ndim = { min = 1, max = 2 }\n", "op.nope", "unknown op"),
    "op_table_bad_key": ("[op.mm]\nrows = { min = 1, max = 2 }\n", "op.mm", "only 'dim"),
    "op_table_bad_extent": ("[op.mm]\ndim = { min = 3, max = 2 }\n", "op.mm.dim", "min <= max"),
    "op_not_table": ("op = 3\n", "op", "expected tables like [op.mm]"),
    "section_not_table": ("shapes = 3\n", "shapes", "expected a table"),
    "bad_database": (
        '[hypothesis]\ndatabase = "redis"\n',
        "hypothesis.database",
        "'directory' or 'none'",
    ),
    "zero_examples": (
        "[hypothesis]\nmax_examples = 0\n",
        "hypothesis.max_examples",
        "allowed: [1,",
    ),
    "zero_companions": ("[batch]\nmax_companions = 0\n", "batch.max_companions", "allowed: [1,"),
    # Every number finite and in range: TOML reads nan and inf as floats.
    "nan_example_timeout": (
        "[runner]\nexample_timeout_s = nan\n",
        "runner.example_timeout_s",
        "must be a finite number, got nan; allowed: (0, 86400] (seconds)",
    ),
    "inf_start_timeout": (
        "[runner]\nstart_timeout_s = inf\n",
        "runner.start_timeout_s",
        "must be a finite number, got inf; allowed: (0, 86400] (seconds)",
    ),
    "negative_control_examples": (
        "[runner]\ncontrol_examples = -5\n",
        "runner.control_examples",
        "out of range, got -5; allowed: [1,",
    ),
    "zero_example_timeout": (
        "[runner]\nexample_timeout_s = 0\n",
        "runner.example_timeout_s",
        "out of range, got 0",
    ),
    "nan_control_share": (
        "[runner]\ncontrol_share = nan\n",
        "runner.control_share",
        "must be a finite number, got nan; allowed: [0, 1]",
    ),
    "control_share_above_one": (
        "[runner]\ncontrol_share = 1.5\n",
        "runner.control_share",
        "out of range, got 1.5",
    ),
    "zero_boundary": ("[shapes]\nboundaries = [16, 0]\n", "shapes.boundaries", "extents >= 1"),
    "zero_head_dim": ("[attention]\nhead_dims = [8, 0]\n", "attention.head_dims", "positive"),
    "strings_for_ints": (
        '[shapes]\nboundaries = ["16"]\n',
        "shapes.boundaries",
        "expected list[int]",
    ),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_file_names_path_key_and_problem(tmp_path, name):
    text, key, problem = BAD[name]
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    with pytest.raises(SpaceError) as info:
        load(path)
    message = str(info.value)
    assert message.startswith(f"{path}: "), message
    if key is not None:
        assert f"key '{key}'" in message, message
    assert problem in message, message


def test_invalid_toml_reports_position(tmp_path):
    path = tmp_path / "broken.toml"
    path.write_text('[profile]\ndescription = "unterminated\n')
    with pytest.raises(SpaceError, match=r"line 2"):
        load(path)


def test_wrong_type_message_shows_the_value(tmp_path):
    path = tmp_path / "t.toml"
    path.write_text('[hypothesis]\nmax_examples = "10"\n')
    with pytest.raises(SpaceError, match=r"got '10'"):
        load(path)


def test_missing_file(tmp_path):
    path = tmp_path / "absent.toml"
    with pytest.raises(SpaceError) as info:
        load(path)
    assert str(info.value) == f"{path}: no such strategies file"


def test_unreadable_path_is_a_space_error(tmp_path):
    with pytest.raises(SpaceError, match=str(tmp_path)):
        load(tmp_path)  # a directory: cannot be read as a file


def test_space_error_is_a_value_error():
    assert issubclass(SpaceError, ValueError)
    with pytest.raises(ValueError, match=r"mem\.toml: key 'dtypes\.choices'"):
        parse({"dtypes": {"choices": ["int8"]}}, "mem.toml", "p")


def test_cross_process_every_is_read_and_validated(tmp_path):
    assert parse({"runner": {"cross_process_every": 0}}, "m.toml", "p").cross_process_every == 0
    assert parse({}, "m.toml", "p").cross_process_every == 8
    with pytest.raises(SpaceError, match=r"key 'runner.cross_process_every': out of range"):
        parse({"runner": {"cross_process_every": -1}}, "m.toml", "p")
