"""The pytest plugin (entry point ``pytest11``): profiles, options, and the loud missing-stack rule.

Kept small and lazy: importing it registers the Hypothesis profiles and nothing else; the search
space, the runner and the workers are created only when property tests are collected and run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .model.target import builtin_names
from .profiles import PROFILES, register_profiles

register_profiles()

_KEY = pytest.StashKey["BiPropsState"]()
PARAMS = ("bi_op", "bi_property", "bi_switch")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("bi_props", "batch-invariance property tests")
    group.addoption(
        "--bi-target",
        default=None,
        help=f"system under test: {builtin_names()}, or some.module[:attr] (default: the "
        "profile's, cpu for ci/cpu/dev)",
    )
    group.addoption(
        "--bi-switch",
        default=None,
        choices=("env", "verl"),
        help="who turns the switch: env (VLLM_BATCH_INVARIANT set by bi_props; default) or "
        "verl (verl's own code, from rollout.full_determinism; targets cpu, vllm, vllm-engine, "
        "ascend)",
    )
    group.addoption(
        "--bi-strategies",
        default=None,
        metavar="PATH",
        help="search-space TOML file (default: the profile's strategies/<profile>.toml)",
    )
    group.addoption(
        "--bi-allow-missing",
        action="store_true",
        default=False,
        help="skip (loudly) instead of failing when the target's stack is missing (default: "
        "off: a missing stack fails the session at collection)",
    )
    group.addoption(
        "--bi-report",
        default=None,
        metavar="PATH",
        help="write findings and negative controls as JSON to PATH; under pytest-xdist each"
        " worker writes its own, with gwN/ inserted before PATH's name (default: none written)",
    )
    group.addoption(
        "--bi-known",
        default=None,
        metavar="PATH",
        help="known-failures TOML: matching failures are reported as xfail (known), and listed "
        "cases that pass again as fixed (default: none)",
    )
    group.addoption(
        "--bi-strict-controls",
        action="store_true",
        default=False,
        help="a negative control that saw no batch variance fails (default: flagged in the "
        "summary and the report, not failed)",
    )
    group.addoption(
        "--bi-strict-contract",
        action="store_true",
        default=False,
        help="a contract widening (parity: the switch-on kernel returns where stock raises) "
        'fails its test (default: reported as "accepts more than stock", xfail)',
    )
    group.addoption(
        "--bi-regressions",
        default=None,
        metavar="PATH",
        help="regression cases TOML, run first (test_regression) (default: none)",
    )


class BiPropsState:
    """Per-session state; the Session (and its workers) is created on first use."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.profile = _active_profile(config)
        self._session = None
        self._space = None
        self.missing: str | None = None
        self.skipped = 0
        self.property_tests = 0  # bi_props-marked tests this process ran (a call phase each)

    @property
    def target(self) -> str:
        chosen = self.config.getoption("bi_target") or self.space.target
        if not chosen:
            raise pytest.UsageError(
                f"bi_props: profile {self.profile!r} names no target; pass --bi-target NAME"
            )
        return chosen

    @property
    def switch_provider(self) -> str:
        """--bi-switch, else BI_PROPS_SWITCH_PROVIDER, else env; refused where it cannot work."""
        from .integrations.switches import SwitchUsageError, selected, usage_error

        try:
            provider = self.config.getoption("bi_switch") or selected()
        except SwitchUsageError as exc:
            raise pytest.UsageError(f"bi_props: {exc}") from None
        problem = usage_error(provider, self.target)
        if problem is not None:
            raise pytest.UsageError(f"bi_props: {problem}")
        return provider

    @property
    def space(self):
        if self._space is None:
            from .model.space import SpaceError, load, load_profile
            from .targets.module import declare_ops

            if self.config.getoption("bi_target"):  # its EXTRA_OPS, before the space names them
                declare_ops(self.config.getoption("bi_target"))
            path = self.config.getoption("bi_strategies")
            try:
                self._space = (
                    load(path, self.profile)
                    if path
                    else load_profile(self.profile if self.profile in PROFILES else "dev")
                )
            except SpaceError as exc:
                raise pytest.UsageError(f"bi_props: bad strategies file: {exc}") from None
        return self._space

    @property
    def session(self):
        if self._session is None:
            from .campaigns.session import Session

            self._session = Session(self.target, self.space, switch_provider=self.switch_provider)
            self._session.report_path = _report_path(self.config)
            self._session.known = self.known
            self._session.strict_controls = self.config.getoption("bi_strict_controls")
            self._session.strict_contract = self.config.getoption("bi_strict_contract")
            # A known failure (by full signature) is recorded once and skipped: the cell keeps
            # exploring for other signatures instead of ending at the known one.
            self._session.skip_settled = bool(self._session.known)
            # Known batch-variant cases go to (and come from) the profile's example database.
            from hypothesis import settings

            from .campaigns.explicit import load_variants

            self._session.database = settings().database
            load_variants(self._session, self._session.space.ops)
        return self._session

    @property
    def known(self):
        from .model.known import load_known

        return self._data_file("bi_known", load_known, "known-failures")

    @property
    def regressions(self):
        from .model.known import load_regressions

        return self._data_file("bi_regressions", load_regressions, "regressions")

    def _data_file(self, option: str, load, what: str) -> list:
        """The entries of the data file named by ``option`` ([] without one); a bad file is a
        usage error."""
        from .model.known import DataFileError

        path = self.config.getoption(option)
        if path:
            self.space  # noqa: B018  (declares the target's EXTRA_OPS: the file may name them)
        try:
            return load(path) if path else []
        except DataFileError as exc:
            raise pytest.UsageError(f"bi_props: bad {what} file: {exc}") from None


def _active_profile(config: pytest.Config) -> str:
    chosen = config.getoption("hypothesis_profile", None)
    if chosen:
        return chosen
    from hypothesis import settings

    return settings.get_current_profile_name()


def _check_rootdir(config: pytest.Config) -> None:
    """``--bi-strategies PATH`` (space form) must not move pytest's rootdir. pytest picks its
    rootdir before plugins register their options, so it reads PATH as a test path; where that
    changed the rootdir, refuse the run with the fix (the ``=`` form is never read as a path)."""
    args = [str(a) for a in config.invocation_params.args]
    values = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--bi-strategies"]
    if not values:
        return
    rest, skip = [], False
    for a in args:
        if not skip and a != "--bi-strategies":
            rest.append(a)
        skip = a == "--bi-strategies"
    try:
        from _pytest.config.findpaths import determine_setup

        early = config._parser.parse_known_args(rest)
        rootpath = determine_setup(
            inifile=early.inifilename,
            override_ini=early.override_ini,
            args=early.file_or_dir,
            rootdir_cmd_arg=early.rootdir or None,
            invocation_dir=config.invocation_params.dir,
        )[0]
        if Path(rootpath) == Path(config.rootpath):
            return
    except Exception:  # another pytest: cannot tell, so refuse the ambiguous form
        pass
    raise pytest.UsageError(
        f"bi_props: write --bi-strategies={values[0]} (with '='): in the form "
        f"'--bi-strategies {values[0]}' pytest reads the path as a test path when it chooses "
        f"its rootdir (here {config.rootpath})"
    )


def pytest_configure(config: pytest.Config) -> None:
    _check_rootdir(config)
    config.stash[_KEY] = BiPropsState(config)
    config.addinivalue_line("markers", "bi_props: a batch-invariance property test")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Each op x property x switch state is its own test id (and its own database key)."""
    if "bi_regression" in metafunc.fixturenames:
        regressions = metafunc.config.stash[_KEY].regressions
        metafunc.parametrize(
            "bi_regression",
            [
                pytest.param(r, id=f"{r.op}-{r.property}-{r.switch}-{i}")
                for i, r in enumerate(regressions)
            ],
        )
        return
    if not set(PARAMS) <= set(metafunc.fixturenames):
        return
    from .catalogue import cells, controls

    state = metafunc.config.stash[_KEY]
    if metafunc.function.__name__.endswith("control"):
        params = [
            pytest.param(op, prop, "disabled", id=f"{op}-{prop}-disabled")
            for op, prop in controls(state.space.ops, state.space.exclude_properties)
        ]
    elif metafunc.function.__name__ == "test_known_cases":
        from .campaigns.explicit import has_explicit

        params = [
            pytest.param(op, prop, switch, id=f"{op}-{prop}-{switch}")
            for op, prop, switch in cells(state.space.ops, state.space.exclude_properties)
            if has_explicit(op, prop, switch)
        ]
    else:
        params = [
            pytest.param(op, prop, switch, id=f"{op}-{prop}-{switch}")
            for op, prop, switch in cells(state.space.ops, state.space.exclude_properties)
        ]
    metafunc.parametrize(PARAMS, params)


def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    """Probe the target once if property tests were collected: a missing stack fails the session
    with one message, or, with --bi-allow-missing, skips them and says so loudly."""
    state = config.stash[_KEY]
    regression = [i for i in items if getattr(i, "originalname", "") == "test_regression"]
    if not state.regressions:  # no regressions file: nothing to run, say so as 'deselected'
        if regression:
            config.stash[_DESELECTED_REGRESSIONS] = len(regression)
            config.hook.pytest_deselected(items=regression)
            items[:] = [i for i in items if i not in regression]
    else:  # promoted regression cases run before anything is generated
        items[:] = regression + [i for i in items if i not in regression]
    # no cell with explicit examples (an engine-only space): pytest's empty parameter set
    empty = [
        i
        for i in items
        if getattr(i, "originalname", "") == "test_known_cases" and i.name.endswith("[NOTSET]")
    ]
    if empty:
        config.hook.pytest_deselected(items=empty)
        items[:] = [i for i in items if i not in empty]
    ours = [item for item in items if item.get_closest_marker("bi_props")]
    if not ours:
        return
    _apply_strategies_settings(config, state, ours)
    state = config.stash[_KEY]
    from .runner.controller import WorkerFailure

    try:
        state.session.runner.start_all()
        hello = state.session.hello("disabled")
    except WorkerFailure as exc:
        raise pytest.UsageError(
            f"bi_props: the worker for target {state.target!r} did not start:\n{exc}"
        ) from None
    if hello.status == "ready":
        if hello.routing_note:  # said at the start, again in the summary, and in report.json
            reporter = config.pluginmanager.get_plugin("terminalreporter")
            if reporter is not None:
                reporter.write_line(f"bi_props: WARNING: {hello.routing_note}", yellow=True)
        return
    switch = " --switch verl" if state.session.switch_provider == "verl" else ""
    message = (
        f"bi_props: target {state.target!r} cannot run here ({hello.status}):\n{hello.message}\n"
        f"Run `bi-props doctor --target {state.target}{switch}` for the full picture."
    )
    if not config.getoption("bi_allow_missing"):
        raise pytest.UsageError(message + "\nPass --bi-allow-missing to skip these tests instead.")
    state.missing = message
    state.skipped = len(ours)
    marker = pytest.mark.skip(reason=f"target {state.target!r} {hello.status}")
    for item in ours:
        item.add_marker(marker)


def _apply_strategies_settings(config: pytest.Config, state: BiPropsState, items: list) -> None:
    """A ``--bi-strategies`` file's ``[hypothesis]`` table applies to the property tests when no
    ``--hypothesis-profile`` was given (an explicit profile wins)."""
    if not config.getoption("bi_strategies") or config.getoption("hypothesis_profile", None):
        return
    from hypothesis import settings

    space = state.space
    extra = {"max_examples": space.max_examples, "derandomize": space.derandomize}
    if space.database == "none":
        extra["database"] = None
    for function in {getattr(item, "function", None) for item in items} - {None}:
        current = getattr(function, "_hypothesis_internal_use_settings", None)
        if current is not None:
            function._hypothesis_internal_use_settings = settings(current, **extra)


@pytest.fixture(scope="session")
def bi_props_session(request: pytest.FixtureRequest):
    """The Session of this pytest run (its workers live until the session ends)."""
    return request.config.stash[_KEY].session


_FINDINGS_AT = pytest.StashKey[int]()
_SKIPPED_AT = pytest.StashKey[dict]()
_DESELECTED_REGRESSIONS = pytest.StashKey[int]()
_FROM_WORKERS = pytest.StashKey[dict]()  # pytest-xdist worker id -> what it sent


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    """Remember where the session's findings stood, to know which this test recorded; after
    the test, record the failure its final replay left to reduce (``Session.record_deferred``)."""
    state = item.config.stash.get(_KEY, None)
    if state is not None and state._session is not None:
        item.stash[_FINDINGS_AT] = len(state._session.findings)
        item.stash[_SKIPPED_AT] = dict(state._session.skipped_known)
        # each test skips known failures anew (a failure raised turns it off for its shrink)
        state._session.skip_settled = bool(state._session.known)
    try:
        return (yield)
    finally:  # a minimal failure drawn near a known case, reduced outside Hypothesis' test
        if state is not None and state._session is not None:
            state._session.record_deferred()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """Known failures by full signature (target, op, property, switch, kind, error type): a
    test whose findings are all known is reported as xfail (known); any other finding fails it.
    A failure whose very case passed when Hypothesis replayed it is a ``flaky`` finding; one
    that failed differently on replay (also Hypothesis' Flaky) is recorded as it was seen."""
    report = yield
    state = item.config.stash.get(_KEY, None)
    if report.when == "call" and state is not None and item.get_closest_marker("bi_props"):
        state.property_tests += 1
    if report.when != "call" or state is None or state._session is None:
        return report
    session = state._session
    params = getattr(getattr(item, "callspec", None), "params", {})
    if report.passed and params.get("bi_property") == "routing":
        why = session.unobservable.get((params.get("bi_op"), params.get("bi_switch")))
        if why is not None:  # routing that could not be observed is not a pass
            report.outcome = "skipped"
            report.longrepr = (str(item.path), item.location[1] or 0, f"Skipped: {why}")
            return report
    if report.failed and call.excinfo is not None and session.last_failure is not None:
        from hypothesis.errors import Flaky

        if call.excinfo.errisinstance(Flaky) and session.passed_again(session.last_failure):
            from .campaigns.fuzz import _record_flaky

            _record_flaky(session, session.last_failure)
        elif call.excinfo.errisinstance(Flaky) and not session.recorded(session.last_failure):
            from .campaigns.records import FAILED_DIFFERENTLY

            # the same case failed differently on replay: a finding as seen
            session.finalize(session.last_failure, shrink=FAILED_DIFFERENTLY)
    start = item.stash.get(_FINDINGS_AT, len(session.findings))
    found = session.findings[start:]
    if not found and report.passed:
        # A settled (known) failure hit again is skipped so the search goes on; a test that saw
        # only such failures did not pass: it is xfail (known), like the test that recorded it.
        before = item.stash.get(_SKIPPED_AT, {})
        hit = [c for c, n in session.skipped_known.items() if n > before.get(c, 0)]
        if hit:
            reasons = []
            for cell in hit:
                entry = session.known_for(*cell)
                reasons.append(
                    f"{entry.reason or 'listed'} {entry.link}".strip()
                    if entry
                    else "recorded earlier in this run"
                )
            report.outcome = "skipped"
            report.wasxfail = "known failure (seen again): " + "; ".join(dict.fromkeys(reasons))
        return report
    if not found or report.skipped:
        return report
    from .reporting.data import ACCEPTS_MORE, WIDENING

    wider = [f for f in found if f.kind == WIDENING and f.status != "known"]
    if wider and not session.strict_contract and all(f.kind == WIDENING for f in found):
        report.outcome = "skipped"  # reported apart: not a failure without --bi-strict-contract
        report.wasxfail = f"{ACCEPTS_MORE} (--bi-strict-contract fails on it): " + "; ".join(
            f.case for f in wider
        )
        return report
    if all(f.status == "known" for f in found):
        reasons = []
        for f in found:
            entry = next((k for k in session.known if k.matches(f.signature())), None)
            if entry is not None:
                reasons.append(f"{entry.reason or 'listed'} {entry.link}".strip())
        report.outcome = "skipped"
        report.wasxfail = "known failure: " + "; ".join(dict.fromkeys(reasons))
    return report


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Known failures that record a case are re-run once: still failing, or fixed?"""
    state = session.config.stash.get(_KEY, None)
    if state is not None and state._session is not None and state._session.known:
        from .runner.controller import WorkerFailure

        try:
            state._session.check_known()
        except WorkerFailure:
            pass
    if state is not None and state._session is not None:
        state._session.judge_switching()  # the `switching` property, once per session
        status = verdict_exit_status(state._session)
        if status == 3:  # same rules as bi-props fuzz: no trustworthy verdict
            session.exitstatus = pytest.ExitCode.INTERNAL_ERROR  # 3
        elif state._session.switching.get("ok") is False and session.exitstatus == 0:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED  # a switching finding: exit 1
        _write_certificate(state._session)
    if state is not None and hasattr(session.config, "workeroutput"):  # a pytest-xdist worker
        _send_to_controller(session.config, state)
    elif state is not None and 3 in _from_workers(session.config, "exit_status"):
        # the controller: a worker's Session had no trustworthy verdict
        session.exitstatus = pytest.ExitCode.INTERNAL_ERROR


def _write_certificate(bi_session) -> None:
    """certificate.json and .md beside ``--bi-report``'s file (reporting/certificate.py)."""
    path = bi_session.report_path
    if path is None:
        return
    from .reporting import certificate
    from .reporting.data import load

    try:
        bi_session.write_report()
        certificate.write(load(path.parent, path.name))
    except Exception as exc:  # the certificate must never change the session's outcome
        import warnings

        warnings.warn(
            f"bi_props: could not write the certificate beside {path}: {exc!r}", stacklevel=2
        )


def _report_path(config: pytest.Config) -> Path | None:
    """``--bi-report PATH``; in a pytest-xdist worker ``gwN/`` inserted before PATH's name: each
    worker runs a Session of its own, and the report, ``examples.jsonl`` and ``repro/`` beside
    it would otherwise be shared (the last worker's report kept, coverage lines interleaved)."""
    report = config.getoption("bi_report")
    if not report:
        return None
    path = Path(report)
    worker = getattr(config, "workerinput", {}).get("workerid")
    return path.parent / worker / path.name if worker else path


def _send_to_controller(config: pytest.Config, state: BiPropsState) -> None:
    """A pytest-xdist worker has no terminal: its summary, its regression deselections and its
    verdict's exit status go to the controller in ``workeroutput`` (pytest-cov's way)."""
    lines = SummaryLines()
    session = state._session
    # A worker given no property test sends no section (it would say "0 examples" beside the
    # worker that ran them), unless its Session has something to say all the same: a finding
    # (a known failure re-checked) or no trustworthy verdict (an internal error).
    speaks = session is not None and bool(verdict_exit_status(session) or session.findings)
    if state.property_tests or state.missing or speaks:
        _summarize(state, lines)
    config.workeroutput["bi_props"] = {  # type: ignore[attr-defined]
        "lines": lines.lines,
        "deselected_regressions": config.stash.get(_DESELECTED_REGRESSIONS, 0),
        "exit_status": verdict_exit_status(session) if session else 0,
    }


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """pytest-xdist's controller: keep what a finished worker sent (``_send_to_controller``)."""
    sent = getattr(node, "workeroutput", {}).get("bi_props")
    if sent is not None:
        node.config.stash.setdefault(_FROM_WORKERS, {})[node.gateway.id] = sent


def _from_workers(config: pytest.Config, key: str) -> list:
    """One entry of what each pytest-xdist worker sent (none outside xdist's controller)."""
    return [sent.get(key) for sent in (config.stash.get(_FROM_WORKERS, None) or {}).values()]


def verdict_exit_status(bi_session) -> int:
    """The exit status the campaign rules (``reporting.data.exit_status``) give this session:
    3 when bi_props itself failed (in a test or a negative control) or routing was not
    observable for any op; pytest's own outcomes decide the rest (1 for a failed test)."""
    from .reporting.data import exit_status

    return exit_status(bi_session.report())


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """This session's summary, then each pytest-xdist worker's (a worker's Session runs the
    property tests it was given; the controller only prints what the workers sent)."""
    state = config.stash.get(_KEY, None)
    if state is None:
        return
    here = config.stash.get(_DESELECTED_REGRESSIONS, 0)
    deselected = max([here, *_from_workers(config, "deselected_regressions")])
    if deselected:
        terminalreporter.line(
            f"bi_props: {deselected} deselected: test_regression, no --bi-regressions file given "
            "(promoted cases run first when one is)"
        )
    summary = SummaryLines()
    _summarize(state, summary)
    summary.write_to(terminalreporter)
    for worker, lines in sorted(config.stash.get(_FROM_WORKERS, {}).items()):
        SummaryLines(lines.get("lines", []), worker=worker).write_to(terminalreporter)


class SummaryLines:
    """The summary as data (kind, text, markup): written to the terminal here, or sent by a
    pytest-xdist worker to the controller in ``workeroutput`` (workers have no terminal)."""

    def __init__(self, lines: list | None = None, worker: str | None = None) -> None:
        self.lines: list[tuple[str, str, dict[str, object]]] = [tuple(line) for line in lines or []]
        self.worker = worker

    def line(self, text: str, **markup: object) -> None:
        self.lines.append(("line", text, markup))

    def section(self, title: str, **markup: object) -> None:
        self.lines.append(("section", title, markup))

    def write_to(self, terminalreporter) -> None:
        for kind, text, markup in self.lines:
            if kind == "section":
                title = f"{text} (pytest-xdist worker {self.worker})" if self.worker else text
                terminalreporter.section(title, **markup)
            else:
                terminalreporter.line(text, **markup)


def _summarize(state: BiPropsState, out: SummaryLines) -> None:
    """What this process's Session found, tested and could not test, in the summary's order."""
    if state.missing:
        out.section("bi_props: NOT RUN ON THE INTENDED HARDWARE", sep="!", red=True, bold=True)
        out.line(
            f"{state.skipped} property tests did not run: {state.missing}", red=True, bold=True
        )
    session = state._session
    if session is None:
        return
    out.section("bi_props")
    out.line(
        f"target {session.target!r}, profile {state.profile!r}, strategies "
        f"{session.space.source}; {session.runner.examples} examples in "
        f"{session.runner.starts} worker processes"
    )
    from .integrations.switches import rows

    verl: dict[str, str] = {}  # what verl set, per switch state
    for hello in session.runner._hellos.values():
        verl.update({k: v for k, v in rows(hello.provider).items() if k.startswith("verl_")})
    for key, value in verl.items():
        out.line(f"{key}: {value}")
    for control in session.controls:
        if control.variance_seen:
            out.line(
                f"negative control {control.op} {control.property}: variance SEEN with the "
                f"switch off; smallest case: {control.case}"
            )
        elif control.applicable is False:
            out.line(
                f"negative control {control.op} {control.property}: NOT APPLICABLE: "
                f"{control.message}"
                + (" (--bi-strict-controls fails on this)" if session.strict_controls else "")
            )
        else:
            out.line(
                f"negative control {control.op} {control.property}: BLIND: {control.message}: "
                "this run could not show it can see batch variance"
                + ("" if session.strict_controls else " (--bi-strict-controls fails on this)"),
                red=True,
                bold=True,
            )
    for message in session.internal_errors:
        out.line(f"INTERNAL ERROR (a bug of bi_props): {message}", red=True, bold=True)
    from .reporting.data import NO_ROUTING_VERDICT, no_routing_verdict
    from .reporting.verdict import degenerate_line

    report = session.report()
    if degenerate_line(report):
        out.line(degenerate_line(report), yellow=True)
    from .reporting.verdict import evidence_lines

    for line in evidence_lines(report):
        out.line(line, red=line.startswith("THIN"), bold=line.startswith("THIN"))
    if no_routing_verdict(report):
        missing = ", ".join(no_routing_verdict(report))
        out.line(f"{NO_ROUTING_VERDICT}: {missing}", red=True, bold=True)
    for entry in session.known_status:
        color = {"fixed": {"green": True}, "known": {"yellow": True}}.get(entry["status"], {})
        out.line(
            f"known failure {entry['op']} {entry['property']} [{entry['switch']}]: "
            f"{entry['status'].upper()}"
            + (
                " (it passes now: remove it from the known-failures file)"
                if entry["status"] == "fixed"
                else ""
            ),
            **color,
        )
    for op, why in session.not_covered.items():
        out.line(f"not covered: {op}: {why}", yellow=True)
    for note in session.routing_notes():
        out.line(f"WARNING: {note}", yellow=True)
    for (op, switch), why in session.unobservable.items():
        out.line(f"ROUTING NOT OBSERVABLE: {op} [{switch}]: {why}", yellow=True, bold=True)
    from .campaigns.session_report import unclaimed_line

    for op, entry in session.unclaimed.items():
        out.line(unclaimed_line(op, entry), yellow=entry["batch_variant"])
    if session.switching:
        ok, message = session.switching.get("ok"), str(session.switching.get("message", ""))
        verdict = {True: "holds", False: "FAILS", None: ""}[ok]
        out.line(f"switching: {verdict or (message.splitlines() or [''])[0]}", red=ok is False)
    from dataclasses import asdict

    from .reporting.data import FindingStatus, widening_line

    for f in session.findings:
        if f.kind == "widening" and f.status != "known":  # "accepts more than stock"
            line = widening_line(FindingStatus(asdict(f), f.status), report)
            out.line(line, yellow=not session.strict_contract, red=session.strict_contract)
            continue
        loud = "INTERNAL ERROR (a bug of bi_props) " if f.kind == "internal" else ""
        out.line(
            f"{loud}finding: {f.op} {f.property} [{f.switch}] {f.kind} "
            f"({f.confirmation or 'not confirmed'}): {f.case}",
            red=True,
            bold=bool(loud),
        )
    if session.report_path is not None:
        out.line(f"report: {session.report_path}")


def pytest_unconfigure(config: pytest.Config) -> None:
    state = config.stash.get(_KEY, None)
    if state is not None and state._session is not None:
        state._session.close()
