"""The pytest plugin (entry point ``pytest11``): profiles, options, and the loud missing-stack rule.

Kept small and lazy: importing it registers the Hypothesis profiles and nothing else; the search
space, the runner and the workers are created only when property tests are collected and run.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .profiles import PROFILES, register_profiles

register_profiles()

_KEY = pytest.StashKey["BiPropsState"]()
PARAMS = ("bi_op", "bi_property", "bi_switch")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("bi_props", "batch-invariance property tests")
    group.addoption(
        "--bi-target",
        default=None,
        help="system under test: cpu, vllm, ascend, or some.module[:attr]; default: the profile's",
    )
    group.addoption(
        "--bi-switch",
        default=None,
        choices=("env", "verl"),
        help="who turns the switch: env (VLLM_BATCH_INVARIANT set by bi_props; the default) or "
        "verl (verl's own code, from rollout.full_determinism; targets cpu, vllm, vllm-engine, "
        "ascend)",
    )
    group.addoption(
        "--bi-strategies",
        default=None,
        metavar="PATH",
        help="search-space TOML file; default: the profile's strategies/<profile>.toml",
    )
    group.addoption(
        "--bi-allow-missing",
        action="store_true",
        default=False,
        help="skip (loudly) instead of failing when the target's stack is missing",
    )
    group.addoption(
        "--bi-report",
        default=None,
        metavar="PATH",
        help="write findings and negative controls as JSON to PATH",
    )
    group.addoption(
        "--bi-known",
        default=None,
        metavar="PATH",
        help="known-failures TOML: matching failures are reported as xfail (known), and listed "
        "cases that pass again as fixed",
    )
    group.addoption(
        "--bi-regressions",
        default=None,
        metavar="PATH",
        help="regression cases TOML, run first (test_regression)",
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
        from .switches import SwitchUsageError, selected, usage_error

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
            from .space import SpaceError, load, load_profile

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
            from .session import Session

            self._session = Session(self.target, self.space, switch_provider=self.switch_provider)
            report = self.config.getoption("bi_report")
            self._session.report_path = Path(report) if report else None
            self._session.known = self.known
        return self._session

    @property
    def known(self):
        from .known import DataFileError, load_known

        path = self.config.getoption("bi_known")
        try:
            return load_known(path) if path else []
        except DataFileError as exc:
            raise pytest.UsageError(f"bi_props: bad known-failures file: {exc}") from None

    @property
    def regressions(self):
        from .known import DataFileError, load_regressions

        path = self.config.getoption("bi_regressions")
        try:
            return load_regressions(path) if path else []
        except DataFileError as exc:
            raise pytest.UsageError(f"bi_props: bad regressions file: {exc}") from None


def _active_profile(config: pytest.Config) -> str:
    chosen = config.getoption("hypothesis_profile", None)
    if chosen:
        return chosen
    from hypothesis import settings

    return settings.get_current_profile_name()


def pytest_configure(config: pytest.Config) -> None:
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
            for op, prop in controls(state.space.ops)
        ]
    else:
        params = [
            pytest.param(op, prop, switch, id=f"{op}-{prop}-{switch}")
            for op, prop, switch in cells(state.space.ops)
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
            config.hook.pytest_deselected(items=regression)
            items[:] = [i for i in items if i not in regression]
    else:  # promoted regression cases run before anything is generated
        items[:] = regression + [i for i in items if i not in regression]
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


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """A failure of a cell listed in the known-failures file is reported as xfail (known)."""
    report = yield
    state = item.config.stash.get(_KEY, None)
    params = getattr(getattr(item, "callspec", None), "params", {})
    if report.when != "call" or not report.failed or state is None or state._session is None:
        return report
    if "bi_regression" in params:
        r = params["bi_regression"]
        cell = (r.op, r.property, r.switch)
    elif "bi_op" in params:
        cell = (params["bi_op"], params["bi_property"], params["bi_switch"])
    else:
        return report
    known = state._session.known_for(*cell)
    if known is not None:
        report.outcome = "skipped"
        report.wasxfail = f"known failure: {known.reason or 'listed'} {known.link}".strip()
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


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    state = config.stash.get(_KEY, None)
    if state is None:
        return
    tr = terminalreporter
    if state.missing:
        tr.section("bi_props: NOT RUN ON THE INTENDED HARDWARE", sep="!", red=True, bold=True)
        tr.line(f"{state.skipped} property tests did not run: {state.missing}", red=True, bold=True)
    session = state._session
    if session is None:
        return
    tr.section("bi_props")
    tr.line(
        f"target {session.target!r}, profile {state.profile!r}, strategies "
        f"{session.space.source}; {session.runner.examples} examples in "
        f"{session.runner.starts} worker processes"
    )
    from .switches import rows

    verl: dict[str, str] = {}  # what verl set, per switch state
    for hello in session.runner._hellos.values():
        verl.update({k: v for k, v in rows(hello.provider).items() if k.startswith("verl_")})
    for key, value in verl.items():
        tr.line(f"{key}: {value}")
    for control in session.controls:
        if control.variance_seen:
            tr.line(
                f"negative control {control.op} {control.property}: variance SEEN with the "
                f"switch off; smallest case: {control.case}"
            )
        else:
            tr.line(f"negative control {control.op} {control.property}: {control.message}")
    for entry in session.known_status:
        color = {"fixed": {"green": True}, "known": {"yellow": True}}.get(entry["status"], {})
        tr.line(
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
        tr.line(f"not covered: {op}: {why}", yellow=True)
    if session.switching:
        ok, message = session.switching.get("ok"), str(session.switching.get("message", ""))
        verdict = {True: "holds", False: "FAILS", None: ""}[ok]
        tr.line(f"switching: {verdict or (message.splitlines() or [''])[0]}", red=ok is False)
    for f in session.findings:
        fresh = {True: "reproduced", False: "NOT reproduced", None: "not re-run"}[
            f.reproduced_in_fresh_process
        ]
        tr.line(
            f"finding: {f.op} {f.property} [{f.switch}] {f.kind} ({fresh} in a fresh "
            f"process): {f.case}",
            red=True,
        )
    if session.report_path is not None:
        tr.line(f"report: {session.report_path}")


def pytest_unconfigure(config: pytest.Config) -> None:
    state = config.stash.get(_KEY, None)
    if state is not None and state._session is not None:
        state._session.close()
