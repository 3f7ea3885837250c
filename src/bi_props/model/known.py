"""Known failures and regression cases, as data.

Known failures (like array-api-tests' xfails file) name upstream bugs by signature: target, op,
property, switch, kind and exception type. Listed failures are still run; a matching finding is
reported as *known*, and a listed failure whose case no longer fails is reported as *fixed*.

Regression cases are explicit examples the suite always runs first: Hypothesis' example database is
only a cache, a regressions file is a promise.

    [[known]]                      # known_failures.toml
    target = "vllm"
    op = "bmm"
    property = "parity"
    switch = "both"
    kind = "error"
    error_type = "TypeError"       # optional: any exception type when absent
    reason = "Triton kernels registered on CPU, where Triton has no backend"
    link = "https://..."           # optional
    case = "Case(...)"             # optional: re-run to tell 'still failing' from 'fixed';
                                   # it names its failure class (dtype/layout/values/size)
    case_class = "bfloat16/strided/finite/medium"  # optional: the class without a case

    [[case]]                       # regressions.toml
    op = "mm"
    property = "batch_invariance"
    switch = "enabled"
    case = "Case(op='mm', ...)"
    note = "split-K switched at M=64"
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .case import Case, class_of, parse_case

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

KINDS = ("mismatch", "crash", "timeout", "error")
SWITCHES = ("enabled", "disabled", "both")


class DataFileError(ValueError):
    """A known-failures or regressions file that cannot be used (file, entry, key, problem)."""


@dataclass(frozen=True)
class KnownFailure:
    target: str
    op: str
    property: str
    switch: str
    kind: str
    error_type: str | None = None
    reason: str = ""
    link: str = ""
    case: str | None = None
    # The failure class it names (``case.case_class``: "dtype/layout/values/size"); from its
    # ``case`` when it records one; absent: every class of the cell (say so on purpose).
    case_class: str | None = None

    def failure_class(self) -> str | None:
        if self.case_class:
            return self.case_class
        return class_of(self.case) or None if self.case else None

    def matches(self, signature: tuple) -> bool:
        """Whether a finding's signature (``Finding.signature()``: target, op, property,
        switch, kind, error type and failure class) is this known failure."""
        target, op, prop, switch, kind, error_type, *rest = signature
        wanted = self.failure_class()
        return (
            self.target in ("*", target)
            and (self.op, self.property, self.switch, self.kind) == (op, prop, switch, kind)
            and (self.error_type is None or self.error_type == error_type)
            and (wanted is None or not rest or rest[0] in ("", wanted))
        )

    def cell(self) -> tuple[str, str, str]:
        return (self.op, self.property, self.switch)


@dataclass(frozen=True)
class Regression:
    op: str
    property: str
    switch: str
    case: Case
    note: str = ""


def _read(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataFileError(f"{path}: no such file") from None
    except tomllib.TOMLDecodeError as exc:
        raise DataFileError(f"{path}: not valid TOML: {exc}") from None


def _entries(path: Path, data: dict[str, Any], table: str) -> list[dict[str, Any]]:
    unknown = set(data) - {table}
    if unknown:
        raise DataFileError(f"{path}: unknown top-level keys {sorted(unknown)}; use [[{table}]]")
    entries = data.get(table, [])
    if not isinstance(entries, list):
        raise DataFileError(f"{path}: '{table}' must be an array of tables ([[{table}]])")
    return entries


def _check_cell(path: Path, where: str, entry: dict[str, Any], required: tuple[str, ...]) -> None:
    from .op_registry import OPS
    from .property_spec import properties_of

    for key in required:
        if not isinstance(entry.get(key), str):
            raise DataFileError(f"{path}: {where}: key '{key}' is required (a string)")
    if entry["op"] not in OPS:
        raise DataFileError(f"{path}: {where}: key 'op': unknown op {entry['op']!r}")
    applicable = properties_of(OPS[entry["op"]])
    if entry["property"] not in applicable:
        raise DataFileError(
            f"{path}: {where}: key 'property': {entry['property']!r} does not apply to "
            f"{entry['op']!r} (choose from {list(applicable)})"
        )
    if entry["switch"] not in SWITCHES:
        raise DataFileError(f"{path}: {where}: key 'switch': choose from {list(SWITCHES)}")


def load_known(path: str | Path) -> list[KnownFailure]:
    path = Path(path)
    known = []
    fields = set(KnownFailure.__dataclass_fields__)
    for i, entry in enumerate(_entries(path, _read(path), "known")):
        where = f"[[known]] #{i + 1}"
        extra = set(entry) - fields
        if extra:
            raise DataFileError(f"{path}: {where}: unknown keys {sorted(extra)}")
        _check_cell(path, where, entry, ("target", "op", "property", "switch", "kind"))
        if entry["kind"] not in KINDS:
            raise DataFileError(f"{path}: {where}: key 'kind': choose from {list(KINDS)}")
        if "case" in entry:
            try:
                parse_case(entry["case"])
            except ValueError as exc:
                raise DataFileError(f"{path}: {where}: key 'case': {exc}") from None
        known.append(KnownFailure(**entry))
    return known


def load_regressions(path: str | Path) -> list[Regression]:
    path = Path(path)
    result = []
    for i, entry in enumerate(_entries(path, _read(path), "case")):
        where = f"[[case]] #{i + 1}"
        extra = set(entry) - {"op", "property", "switch", "case", "note"}
        if extra:
            raise DataFileError(f"{path}: {where}: unknown keys {sorted(extra)}")
        _check_cell(path, where, entry, ("op", "property", "switch", "case"))
        try:
            case = parse_case(entry["case"])
        except ValueError as exc:
            raise DataFileError(f"{path}: {where}: key 'case': {exc}") from None
        if case.op != entry["op"]:
            raise DataFileError(f"{path}: {where}: the case is for op {case.op!r}, not the entry's")
        result.append(
            Regression(entry["op"], entry["property"], entry["switch"], case, entry.get("note", ""))
        )
    return result


def _toml_string(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def promote(finding: dict[str, Any], path: str | Path, note: str = "") -> str:
    """Append a finding to a regressions file as a permanent case; returns the entry's text."""
    path = Path(path)
    entry = "\n".join(
        [
            "",
            "[[case]]",
            f"op = {_toml_string(finding['op'])}",
            f"property = {_toml_string(finding['property'])}",
            f"switch = {_toml_string(finding['switch'])}",
            f"case = {_toml_string(finding['case'])}",
            f"note = {_toml_string(note or finding.get('message', '').splitlines()[0])}",
            "",
        ]
    )
    with path.open("a", encoding="utf-8") as f:
        f.write(entry)
    load_regressions(path)  # what was written must load
    return entry
