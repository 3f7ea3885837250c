"""The contract check: does a vllm-ascend source tree still offer what the ascend adapter relies on?

``check_contract(root)`` reads Python source with ``ast`` (nothing is imported, so it runs on any
machine, on an unzipped wheel, a git checkout or an installed package's directory) and reports a
``Problem`` for each difference:

- every requirement of ``ascend_routes.REQUIREMENTS`` that applies to the tree's version: the module
  exists, the symbol is defined (``def``, assignment or import at module level) and a function's
  parameters accept the call the adapter makes (names, order, the defaults it relies on);
- ``enable_batch_invariant_mode()``, interpreted for each combination of HAS_ASCENDC_BATCH_INVARIANT
  and HAS_TRITON, registers on the NPU dispatch key and swaps exactly what
  ``ascend_routes.registrations`` says for that version (the routing table's source of truth), and
  every vllm-ascend implementation it names is defined where it says;
- ``init_batch_invariance()`` calls ``enable_batch_invariant_mode()`` exactly when
  ``ascend_routes.init_enables`` says, and never with the switch off;
- ``override_envs_for_invariance()`` takes ``get_ascend_config`` from ``vllm_ascend.ascend_config``
  (where the adapter patches it) and touches only attributes the adapter's stand-in models;
- some call of ``torch_npu.npu_fused_infer_attention_score`` under ``vllm_ascend/attention`` passes
  every keyword the adapter's attention entry (``npu_varlen_attention``) passes;
- every torch_npu / vllm-ascend call of the engine ops' adapters (``ascend_routes.CALL_USES``, used
  by ``targets/ascend_ops.py``) is made by vllm-ascend too, in the file named there, with the same
  number of positional arguments, every keyword the adapter passes and the same literal modes; a
  missing file, callee or keyword is a problem (never skipped).

``check_installed()`` finds an installed vllm_ascend without importing it (for ``bi-props doctor``).
``python -m bi_props.integrations.contract [DIR]`` prints the problems and exits 1 when there are
any.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import itertools
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..targets.ascend_routes import (
    BI_MODULE,
    CONFIG_MODULE,
    DISPATCH_KEY,
    ENABLE,
    GET_CONFIG,
    HAS_ASCENDC,
    HAS_TRITON,
    INIT,
    OVERRIDE,
    REFERENCE_VERSION,
    STANDIN_CONFIG,
    CallUse,
    Capabilities,
    Registration,
    Requirement,
    call_uses_for,
    fia_keywords,
    init_enables,
    registrations,
    requirements_for,
)

PACKAGE = "vllm_ascend"
_SWITCH_NAMES = ("VLLM_BATCH_INVARIANT", "vllm_is_batch_invariant")


@dataclass(frozen=True)
class Problem:
    """One difference between the tree and what the adapter relies on."""

    file: str  # relative to the tree, e.g. "vllm_ascend/batch_invariant.py"
    symbol: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}: {self.symbol}: {self.message}"


# ---------------------------------------------------------------------------------------------
# Locating the package and its modules


def package_dir(root: Path) -> Path | None:
    """The ``vllm_ascend`` package directory in ``root`` (a tree holding it, or the package)."""
    root = Path(root)
    if (root / PACKAGE / "__init__.py").is_file() or (root / PACKAGE).is_dir():
        return root / PACKAGE
    if root.name == PACKAGE or (root / "batch_invariant.py").is_file():
        return root
    return None


def _module_path(pkg: Path, module: str) -> tuple[Path, str]:
    """(path on disk, display path) of a dotted vllm_ascend module."""
    parts = module.split(".")[1:]
    file = pkg.joinpath(*parts).with_suffix(".py") if parts else pkg / "__init__.py"
    if not file.is_file() and parts and (pkg.joinpath(*parts) / "__init__.py").is_file():
        file = pkg.joinpath(*parts) / "__init__.py"
    return file, "/".join([PACKAGE, *file.relative_to(pkg).parts])


def read_version(pkg: Path) -> str | None:
    """The tree's version: ``vllm_ascend/_version.py`` (setuptools-scm), else a sibling
    ``vllm_ascend-*.dist-info/METADATA``."""
    version_file = pkg / "_version.py"
    if version_file.is_file():
        try:
            tree = ast.parse(version_file.read_text(encoding="utf-8"))
        except SyntaxError:
            tree = None
        for node in ast.walk(tree) if tree else ():
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
                names = _assigned_names(node)
                if names & {"__version__", "version"} and isinstance(node.value.value, str):
                    return node.value.value
    for metadata in sorted(pkg.parent.glob("vllm_ascend-*.dist-info/METADATA")):
        for line in metadata.read_text(encoding="utf-8", errors="replace").splitlines():
            if line.startswith("Version:"):
                return line.partition(":")[2].strip()
    return None


def _assigned_names(node: ast.AST) -> set[str]:
    names: set[str] = set()
    targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
    for target in targets:
        for leaf in ast.walk(target) if target is not None else ():
            if isinstance(leaf, ast.Name):
                names.add(leaf.id)
    return names


class _Module:
    """One parsed module: its top-level statements (through if/try), names and imports."""

    def __init__(self, name: str, path: Path, display: str) -> None:
        self.name, self.display = name, display
        self.tree = ast.parse(path.read_text(encoding="utf-8"), filename=display)
        self.functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}
        self.names: set[str] = set()
        self.aliases: dict[str, str] = {}  # local name -> dotted origin
        for stmt in _top_level(self.tree.body):
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.functions[stmt.name] = stmt
                self.names.add(stmt.name)
                self.aliases[stmt.name] = f"{name}.{stmt.name}"
            elif isinstance(stmt, ast.ClassDef):
                self.names.add(stmt.name)
            elif isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                self.names |= _assigned_names(stmt)
            elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
                for local, origin in _imports(stmt, name):
                    self.names.add(local)
                    self.aliases[local] = origin

    def dotted(self, node: ast.AST) -> str | None:
        """``torch.ops.x.y`` for an attribute chain; a bare name through this module's imports."""
        parts: list[str] = []
        while isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name):
            return None
        head = self.aliases.get(node.id, node.id)
        return ".".join([head, *reversed(parts)])


def _top_level(body: list[ast.stmt]) -> Iterator[ast.stmt]:
    for stmt in body:
        yield stmt
        if isinstance(stmt, ast.If):
            yield from _top_level(stmt.body)
            yield from _top_level(stmt.orelse)
        elif isinstance(stmt, ast.Try):
            yield from _top_level(stmt.body)
            for handler in stmt.handlers:
                yield from _top_level(handler.body)
            yield from _top_level(stmt.orelse)
            yield from _top_level(stmt.finalbody)


def _imports(stmt: ast.Import | ast.ImportFrom, module: str) -> Iterator[tuple[str, str]]:
    if isinstance(stmt, ast.Import):
        for alias in stmt.names:
            if alias.asname:
                yield alias.asname, alias.name
            else:
                top = alias.name.partition(".")[0]
                yield top, top
        return
    base = stmt.module or ""
    if stmt.level:  # relative import inside vllm_ascend
        package = module.split(".")[: -stmt.level] if module.count(".") >= stmt.level else []
        base = ".".join([*package, base] if base else package)
    for alias in stmt.names:
        yield alias.asname or alias.name, f"{base}.{alias.name}"


# ---------------------------------------------------------------------------------------------
# Signatures


def _signature_text(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    return "(" + ast.unparse(fn.args) + ")"


def _signature_problem(fn: ast.FunctionDef | ast.AsyncFunctionDef, wanted: str) -> str | None:
    """Why ``fn`` does not accept the call described by the parameter list ``wanted``."""
    spec = ast.parse(f"def _{wanted}: pass").body[0].args  # type: ignore[attr-defined]
    want = [*spec.posonlyargs, *spec.args]
    want_defaults = dict(
        zip([a.arg for a in want][len(want) - len(spec.defaults) :], spec.defaults, strict=True)
    )
    args = fn.args
    have = [*args.posonlyargs, *args.args]
    have_defaults = dict(
        zip([a.arg for a in have][len(have) - len(args.defaults) :], args.defaults, strict=True)
    )
    found = _signature_text(fn)
    if [a.arg for a in have[: len(want)]] != [a.arg for a in want]:
        if len(have) < len(want) and args.vararg is not None:
            return None
        return f"parameters differ: the adapter calls {wanted}, found {found}"
    for name, default in want_defaults.items():
        if name not in have_defaults:
            return f"{name!r} has no default: the adapter relies on {wanted}, found {found}"
        if ast.dump(have_defaults[name]) != ast.dump(default):
            return f"default of {name!r} changed: the adapter relies on {wanted}, found {found}"
    extra = [a.arg for a in have[len(want) :] if a.arg not in have_defaults]
    extra += [a.arg for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is None]
    if extra:
        return f"new required parameters {extra}: the adapter calls {wanted}, found {found}"
    return None


# ---------------------------------------------------------------------------------------------
# Interpreting the switch's functions


class _Unknown(Exception):
    pass


def _evaluate(node: ast.expr, env: dict[str, bool], module: _Module) -> bool:
    if isinstance(node, ast.Constant):
        return bool(node.value)
    if isinstance(node, ast.BoolOp):
        values = [_evaluate(v, env, module) for v in node.values]
        return all(values) if isinstance(node.op, ast.And) else any(values)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return not _evaluate(node.operand, env, module)
    if isinstance(node, ast.Name) and node.id in env:
        return env[node.id]
    target = node.func if isinstance(node, ast.Call) else node
    dotted = module.dotted(target) or ""
    if dotted.rpartition(".")[2] in _SWITCH_NAMES:
        return env["switch"]
    raise _Unknown(ast.unparse(node))


@dataclass(frozen=True)
class _Effect:
    kind: str  # "impl" | "swap" | "call"
    target: str
    value: str = ""
    key: str = ""


def _effects(body: list[ast.stmt], env: dict[str, bool], module: _Module) -> Iterator[_Effect]:
    """What a function body does under ``env``: ``lib.impl(...)`` calls, attribute assignments,
    bare-name calls; conditions are evaluated, other statements skipped."""
    for stmt in body:
        if isinstance(stmt, ast.If):
            branch = stmt.body if _evaluate(stmt.test, env, module) else stmt.orelse
            yield from _effects(branch, env, module)
        elif isinstance(stmt, (ast.With, ast.Try)):
            yield from _effects(stmt.body, env, module)
        elif isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call):
            call = stmt.value
            if isinstance(call.func, ast.Attribute) and call.func.attr == "impl" and call.args:
                yield _impl_effect(call, module)
            elif isinstance(call.func, ast.Name):
                yield _Effect("call", call.func.id)
        elif isinstance(stmt, ast.Assign):
            value = module.dotted(stmt.value) or ast.unparse(stmt.value)
            for target in stmt.targets:
                if isinstance(target, ast.Attribute):
                    yield _Effect("swap", module.dotted(target) or ast.unparse(target), value)


def _impl_effect(call: ast.Call, module: _Module) -> _Effect:
    args = list(call.args)
    keywords = {k.arg: k.value for k in call.keywords if k.arg}
    op = args[0].value if isinstance(args[0], ast.Constant) else ast.unparse(args[0])
    fn = args[1] if len(args) > 1 else keywords.get("fn")
    key = args[2] if len(args) > 2 else keywords.get("dispatch_key")
    value = (module.dotted(fn) or ast.unparse(fn)) if fn is not None else "?"
    key_text = key.value if isinstance(key, ast.Constant) else (ast.unparse(key) if key else "")
    return _Effect("impl", str(op), value, str(key_text))


def _caps_label(ascendc: bool, triton: bool) -> str:
    return f"HAS_ASCENDC_BATCH_INVARIANT={ascendc}, HAS_TRITON={triton}"


# ---------------------------------------------------------------------------------------------
# The check


class _Tree:
    def __init__(self, pkg: Path) -> None:
        self.pkg = pkg
        self._modules: dict[str, _Module | Problem] = {}

    def module(self, name: str) -> _Module | Problem:
        if name not in self._modules:
            path, display = _module_path(self.pkg, name)
            if not path.is_file():
                self._modules[name] = Problem(display, name, "module missing")
            else:
                try:
                    self._modules[name] = _Module(name, path, display)
                except SyntaxError as exc:
                    self._modules[name] = Problem(display, name, f"does not parse: {exc}")
        return self._modules[name]


def _check_requirement(tree: _Tree, req: Requirement) -> Problem | None:
    module = tree.module(req.module)
    if isinstance(module, Problem):
        return Problem(module.file, req.symbol, f"{module.message} (needed: {req.why})")
    if req.kind == "name":
        if req.symbol not in module.names:
            return Problem(
                module.display,
                req.symbol,
                f"not assigned or imported at module level (needed: {req.why})",
            )
        return None
    fn = module.functions.get(req.symbol)
    if fn is None:
        what = "defined, but not as a function" if req.symbol in module.names else "missing"
        return Problem(module.display, req.symbol, f"function {what} (needed: {req.why})")
    if req.signature is not None:
        why = _signature_problem(fn, req.signature)
        if why:
            return Problem(module.display, req.symbol, why)
    return None


def _check_registrations(tree: _Tree, version: str | None) -> list[Problem]:
    module = tree.module(BI_MODULE)
    if isinstance(module, Problem):
        return []  # reported by the requirements
    enable = module.functions.get(ENABLE.symbol)
    init = module.functions.get(INIT.symbol)
    problems: list[Problem] = []
    implementations: set[str] = set()
    for ascendc, triton in itertools.product((True, False), repeat=2):
        label = _caps_label(ascendc, triton)
        caps = Capabilities(ascendc, triton, version)
        env = {HAS_ASCENDC.symbol: ascendc, HAS_TRITON.symbol: triton, "switch": True}
        expected = {(r.target, r.implementation) for r in registrations(caps)}
        implementations |= {r.implementation for r in registrations(caps)}
        if enable is not None:
            try:
                effects = list(_effects(enable.body, env, module))
            except _Unknown as exc:
                problems.append(
                    Problem(
                        module.display, ENABLE.symbol, f"cannot interpret the condition `{exc}`"
                    )
                )
                break
            found = set()
            for e in effects:
                if e.kind == "impl":
                    found.add((e.target, e.value))
                    if e.key != DISPATCH_KEY:
                        problems.append(
                            Problem(
                                module.display,
                                ENABLE.symbol,
                                f"{e.target} is registered on dispatch key {e.key!r}, the adapter"
                                f" expects {DISPATCH_KEY!r}",
                            )
                        )
                elif e.kind == "swap":
                    found.add((e.target, e.value))
            for target, value in sorted(found - expected):
                problems.append(
                    Problem(
                        module.display,
                        ENABLE.symbol,
                        f"with {label} the source installs {target} -> {value};"
                        f" the adapter's routing table for {version} does not",
                    )
                )
            for target, value in sorted(expected - found):
                problems.append(
                    Problem(
                        module.display,
                        ENABLE.symbol,
                        f"with {label} the adapter's routing table for {version}"
                        f" expects {target} -> {value}; the source does not"
                        f" install it",
                    )
                )
        if init is not None:
            problems += _check_init(module, init, env, init_enables(caps), label)
    for implementation in sorted(implementations):
        problems += _check_implementation(tree, implementation)
    return problems


def _check_init(
    module: _Module,
    init: ast.FunctionDef | ast.AsyncFunctionDef,
    env: dict[str, bool],
    enables: bool,
    label: str,
) -> list[Problem]:
    problems = []
    for switch in (True, False):
        try:
            calls = {
                e.target
                for e in _effects(init.body, {**env, "switch": switch}, module)
                if e.kind == "call"
            }
        except _Unknown as exc:
            return [Problem(module.display, INIT.symbol, f"cannot interpret the condition `{exc}`")]
        want = enables and switch
        if (ENABLE.symbol in calls) != want:
            state = "on" if switch else "off"
            problems.append(
                Problem(
                    module.display,
                    INIT.symbol,
                    f"with the switch {state} and {label} it "
                    f"{'calls' if not want else 'does not call'} {ENABLE.symbol}(); the adapter "
                    f"expects {'a call' if want else 'none'}",
                )
            )
        if want and OVERRIDE.symbol not in calls:
            problems.append(
                Problem(
                    module.display,
                    INIT.symbol,
                    f"with {label} it no longer calls {OVERRIDE.symbol}()",
                )
            )
    return problems


def _check_implementation(tree: _Tree, dotted: str) -> list[Problem]:
    """A vllm-ascend implementation named by the routing table is defined in its module."""
    if not dotted.startswith(PACKAGE + "."):
        return []
    module_name, _, symbol = dotted.rpartition(".")
    module = tree.module(module_name)
    if isinstance(module, Problem):
        why = f"{module.message} (the routing table names {dotted})"
        return [Problem(module.file, symbol, why)]
    if symbol not in module.names:
        return [Problem(module.display, symbol, f"not defined (the routing table names {dotted})")]
    return []


def _check_config_use(tree: _Tree) -> list[Problem]:
    """override_envs_for_invariance(): where get_ascend_config comes from, what it touches."""
    module = tree.module(BI_MODULE)
    if isinstance(module, Problem):
        return []
    fn = module.functions.get(OVERRIDE.symbol)
    if fn is None:
        return []
    local: dict[str, str] = {}
    for stmt in ast.walk(fn):
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            local.update(_imports(stmt, module.name))
    configs: set[str] = set()
    calls_getter = False
    for node in ast.walk(fn):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == GET_CONFIG.symbol
        ):
            calls_getter = True
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Name)
            and node.value.func.id == GET_CONFIG.symbol
        ):
            configs |= _assigned_names(node)
    if not calls_getter:
        return []
    problems = []
    origin = local.get(GET_CONFIG.symbol) or module.aliases.get(GET_CONFIG.symbol)
    if origin != f"{CONFIG_MODULE}.{GET_CONFIG.symbol}":
        problems.append(
            Problem(
                module.display,
                OVERRIDE.symbol,
                f"calls {GET_CONFIG.symbol}() from {origin or 'nowhere known'};"
                f" the adapter patches {CONFIG_MODULE}.{GET_CONFIG.symbol}",
            )
        )
    for node in ast.walk(fn):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in configs
            and node.attr not in STANDIN_CONFIG
        ):
            problems.append(
                Problem(
                    module.display,
                    OVERRIDE.symbol,
                    f"touches config attribute {node.attr!r}; the adapter's"
                    f" stand-in models only {sorted(STANDIN_CONFIG)}",
                )
            )
    return problems


FIA = "npu_fused_infer_attention_score"


def _check_attention_keywords(pkg: Path) -> list[Problem]:
    """Some call of ``torch_npu.npu_fused_infer_attention_score`` in vllm_ascend/attention uses
    every keyword ``npu_varlen_attention`` passes (names read from upstream use, not guessed)."""
    folder = pkg / "attention"
    if not folder.is_dir():
        return []  # a partial tree (e.g. only batch_invariant.py): nothing to compare with
    want = fia_keywords()
    best: tuple[int, str] = (-1, "")
    for path in sorted(folder.rglob("*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == FIA
            ):
                keywords = {k.arg for k in node.keywords if k.arg}
                if want <= keywords:
                    return []
                best = max(best, (len(want & keywords), f"{path.name}:{node.lineno}"))
    where = f"; closest: {best[1]}" if best[1] else "; no call found"
    return [
        Problem(
            f"{PACKAGE}/attention",
            FIA,
            f"no call of torch_npu.{FIA} passes all of {sorted(want)}{where}",
        )
    ]


def _literal_is(node: ast.expr, value: object) -> bool:
    """``node`` is the literal ``value`` (same type: ``1`` is not ``True``)."""
    return (
        isinstance(node, ast.Constant) and type(node.value) is type(value) and node.value == value
    )


def _use_modules(tree: _Tree, use: CallUse) -> tuple[list[_Module], list[Problem]]:
    """The parsed modules of ``use.files`` (a folder: each ``.py`` in it), and the problems of
    those missing or unparsable."""
    modules: list[_Module] = []
    problems: list[Problem] = []
    for rel in use.files:
        parts = rel.split("/")[1:]  # "vllm_ascend/ops/x.py" -> ops/x.py under the package
        path = tree.pkg.joinpath(*parts)
        if path.is_dir():
            names = [
                ".".join([PACKAGE, *p.relative_to(tree.pkg).with_suffix("").parts])
                for p in sorted(path.rglob("*.py"))
            ]
        else:
            names = [".".join([PACKAGE, *Path(*parts).with_suffix("").parts])] if parts else []
        if not names:
            names = [".".join([PACKAGE, *parts])]
        for name in names:
            module = tree.module(name)
            if isinstance(module, Problem):
                why = f"{module.message} (the adapter {use.adapter} relies on its {use.name} call)"
                problems.append(Problem(module.file, use.name, why))
            else:
                modules.append(module)
    return modules, problems


def _check_call_use(tree: _Tree, use: CallUse) -> list[Problem]:
    """One call in ``use.files`` of one of ``use.callees`` with ``use.positional`` positional
    arguments, ``use.keywords`` and the literal ``use.constants``; else the closest call seen."""
    modules, problems = _use_modules(tree, use)
    if problems:
        return problems
    best: tuple[int, str] | None = None
    for module in modules:
        scopes: list[ast.AST] = [module.tree]
        if use.function:
            scopes = [
                n
                for n in ast.walk(module.tree)
                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == use.function
            ]
        calls = [n for scope in scopes for n in ast.walk(scope) if isinstance(n, ast.Call)]
        for node in calls:
            if module.dotted(node.func) not in use.callees:
                continue
            keywords = {k.arg: k.value for k in node.keywords if k.arg}
            differences = []
            if len(node.args) != use.positional:
                differences.append(f"{len(node.args)} positional, not {use.positional}")
            missing = sorted(use.keywords - keywords.keys())
            if missing:
                differences.append(f"without {missing}")
            for name, value in use.constants:
                if name in keywords and not _literal_is(keywords[name], value):
                    differences.append(f"{name}={ast.unparse(keywords[name])}, not {value!r}")
            if not differences:
                return []
            where = f"{module.display}:{node.lineno} ({'; '.join(differences)})"
            if best is None or len(differences) < best[0]:
                best = (len(differences), where)
    wanted = f"{use.positional} positional argument(s)"
    if use.function:
        wanted = f"{wanted} in {use.function}()"
    if use.keywords:
        wanted += f", keywords {sorted(use.keywords)}"
    if use.constants:
        wanted += ", " + ", ".join(f"{k}={v!r}" for k, v in use.constants)
    closest = f"; closest: {best[1]}" if best else "; no call of it found"
    return [
        Problem(
            ", ".join(use.files),
            use.name,
            f"no call of {' or '.join(use.callees)} with {wanted}: the adapter"
            f" ascend_ops.{use.adapter} makes that call{closest}",
        )
    ]


def check_contract(source_root: Path, version: str | None = None) -> list[Problem]:
    """Every difference between a vllm-ascend source tree and what the ascend adapter relies on.

    ``source_root``: a directory holding ``vllm_ascend/`` (unzipped wheel, git checkout) or the
    package directory itself. ``version``: the tree's version when known (else it is read from
    ``_version.py`` or the wheel's METADATA; an unknown version is checked as the reference one).
    """
    pkg = package_dir(Path(source_root))
    if pkg is None:
        return [
            Problem(
                str(source_root),
                PACKAGE,
                "no vllm_ascend package here (expected vllm_ascend/batch_invariant.py)",
            )
        ]
    problems: list[Problem] = []
    version = version or read_version(pkg)
    if version is None:
        problems.append(
            Problem(
                f"{PACKAGE}/_version.py",
                "__version__",
                f"version unknown: checked as {REFERENCE_VERSION}",
            )
        )
    tree = _Tree(pkg)
    for req in requirements_for(version):
        problem = _check_requirement(tree, req)
        if problem is not None:
            problems.append(problem)
    problems += _check_registrations(tree, version)
    problems += _check_config_use(tree)
    problems += _check_attention_keywords(pkg)
    for use in call_uses_for(version):
        problems += _check_call_use(tree, use)
    return list(dict.fromkeys(problems))


def source_registrations(source_root: Path, ascendc: bool, triton: bool) -> list[Registration]:
    """What the tree's ``enable_batch_invariant_mode()`` installs for these capabilities, read
    from the source (backend left empty): the evidence behind the routing table."""
    pkg = package_dir(Path(source_root))
    if pkg is None:
        raise FileNotFoundError(f"no vllm_ascend package in {source_root}")
    module = _Tree(pkg).module(BI_MODULE)
    if isinstance(module, Problem):
        raise FileNotFoundError(str(module))
    enable = module.functions[ENABLE.symbol]
    env = {HAS_ASCENDC.symbol: ascendc, HAS_TRITON.symbol: triton, "switch": True}
    return [
        Registration(e.target, e.value, "")
        for e in _effects(enable.body, env, module)
        if e.kind in ("impl", "swap")
    ]


def check_installed() -> list[Problem] | None:
    """The contract against the installed vllm_ascend, found without importing it; None when
    vllm_ascend is not installed."""
    try:
        spec = importlib.util.find_spec(PACKAGE)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    try:
        version = importlib.metadata.version("vllm-ascend")
    except importlib.metadata.PackageNotFoundError:
        version = None
    return check_contract(Path(spec.origin).parent, version)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv:
        root = Path(argv[0])
        problems: list[Problem] | None = check_contract(root)
        where = str(root)
    else:
        problems = check_installed()
        where = "the installed vllm_ascend"
        if problems is None:
            print(
                "bi_props.integrations.contract: vllm_ascend is not installed; pass a source tree"
            )
            return 2
    for problem in problems:
        print(problem)
    print(f"bi_props.integrations.contract: {len(problems)} problem(s) in {where}")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
