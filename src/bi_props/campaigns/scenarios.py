"""A scenario campaign: draw engine scenarios, judge one property on each, shrink a failure.

``search`` runs Hypothesis' ``find`` over ``catalogue.scenarios.scenarios``: the condition
replays a scenario and its twin on an engine (``Replay``: vLLM's engine in the vLLM lane, a test
double in the unit tests) and holds when the property fails (a mismatch, or the engine raising).
Hypothesis then shrinks to the smallest failing scenario it can (fewest requests, steps, tokens,
features), and the finding names the engine features on in it, with both timelines.

Replays are memoised by scenario within one search (Hypothesis' shrinker asks for the same
scenario, and above all the same twin, again and again; an engine build or step costs real time).
That assumes a replay is deterministic: the ``determinism`` property of the engine target checks
that separately, and ``search(..., recheck=True)`` replays the shrunk scenario once more, fresh.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from hypothesis import HealthCheck, Phase, find, settings
from hypothesis.errors import NoSuchExample

from ..catalogue.scenarios import scenarios
from ..model.scenario import Scenario, ScenarioResult, ScenarioSpace
from ..model.scenario_judge import PROPERTIES, Replay, Verdict, judge


@dataclass
class ScenarioFinding:
    """A property that failed on a shrunk scenario: ``kind`` is ``mismatch`` or ``error``."""

    prop: str
    kind: str
    scenario: str
    twin: str
    features: tuple[str, ...]
    requests: int
    message: str
    timeline: str = ""
    twin_timeline: str = ""
    reproduced: bool | None = None
    """Whether replaying the shrunk scenario and its twin afresh (no memo) failed again."""
    steps: dict = field(default_factory=dict)
    """The scenario's timeline as data (``timeline_data``): what a report draws."""
    twin_steps: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class SearchResult:
    prop: str
    examples: int = 0
    """Scenarios the property judged, generation and shrinking together (not counting those it
    does not apply to)."""
    not_applicable: int = 0
    skipped: int = 0
    """Scenarios drawn after the search's deadline: not replayed, not judged (never a pass)."""
    replays: int = 0
    seconds: float = 0.0
    finding: ScenarioFinding | None = None


class _Memo:
    """Replays by scenario, counting the real ones; an exception is remembered like a result."""

    def __init__(self, replay: Replay) -> None:
        self.replay = replay
        self.results: dict[Scenario, ScenarioResult | BaseException] = {}
        self.count = 0

    def __call__(self, scenario: Scenario) -> ScenarioResult:
        if scenario not in self.results:
            self.count += 1
            try:
                self.results[scenario] = self.replay(scenario)
            except Exception as exc:
                self.results[scenario] = exc
        got = self.results[scenario]
        if isinstance(got, BaseException):
            raise got
        return got


def _finding(prop: str, scenario: Scenario, verdict: Verdict | None, error: str | None):
    twin = verdict.twin if verdict else PROPERTIES[prop].twin(scenario)
    return ScenarioFinding(
        prop=prop,
        kind="error" if error else "mismatch",
        scenario=repr(scenario),
        twin=repr(twin),
        features=scenario.features(),
        requests=len(scenario.requests),
        message=error or (verdict.message if verdict else "") or "",
        timeline=verdict.actual.render_timeline(scenario.config) if verdict else "",
        twin_timeline=verdict.desired.render_timeline(twin.config) if verdict else "",
        steps=timeline_data(verdict.actual) if verdict else {},
        twin_steps=timeline_data(verdict.desired) if verdict else {},
    )


def timeline_data(result: ScenarioResult) -> dict:
    """A result's timeline as JSON-ready data: per step ``[request, phase, tokens]`` entries, and
    the requests preempted (times) and served from the prefix cache (tokens)."""
    return {
        "steps": [[[e.request, e.phase, e.tokens] for e in step] for step in result.timeline],
        "preempted": {str(i): r.preempted for i, r in enumerate(result.requests) if r.preempted},
        "cached": {
            str(i): r.cached_tokens for i, r in enumerate(result.requests) if r.cached_tokens
        },
    }


def _fails(prop: str, scenario: Scenario, replay: Callable[[Scenario], ScenarioResult]):
    """(verdict, error): the property's verdict, or the engine's error as one line."""
    try:
        return judge(prop, scenario, replay), None
    except Exception as exc:
        return None, f"{type(exc).__name__}: {exc}"


def search(
    prop: str,
    replay: Replay,
    space: ScenarioSpace,
    max_examples: int,
    *,
    recheck: bool = True,
    derandomize: bool = True,
    deadline: float | None = None,
    shrink_s: float = 60.0,
) -> SearchResult:
    """Draw up to ``max_examples`` scenarios for ``prop``; shrink the first failure found.

    ``deadline`` (a ``time.perf_counter()`` value): after it, a scenario not replayed yet is not
    replayed but counted as skipped and treated as not failing, so generation ends at once. Once
    a failure was found, shrinking may go on ``shrink_s`` seconds past the deadline; then it
    keeps the smallest failure found by then (still a real failure)."""
    if prop not in PROPERTIES:
        raise ValueError(f"unknown scenario property {prop!r}; known: {list(PROPERTIES)}")
    result = SearchResult(prop)
    memo = _Memo(replay)
    start = time.perf_counter()

    found = False

    def failing(scenario: Scenario) -> bool:
        nonlocal found
        cutoff = None if deadline is None else deadline + (shrink_s if found else 0.0)
        late = cutoff is not None and time.perf_counter() > cutoff
        if late and scenario not in memo.results:
            result.skipped += 1
            return False
        verdict, error = _fails(prop, scenario, memo)
        if verdict is None and error is None:
            result.not_applicable += 1
            return False
        result.examples += 1
        fails = error is not None or not verdict.held  # type: ignore[union-attr]
        found = found or fails
        return fails

    config = settings(
        max_examples=max_examples,
        database=None,
        derandomize=derandomize,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.generate, Phase.shrink],
    )
    try:
        shrunk = find(scenarios(space), failing, settings=config)
    except NoSuchExample:
        shrunk = None
    if shrunk is not None:
        verdict, error = _fails(prop, shrunk, memo)
        result.finding = _finding(prop, shrunk, verdict, error)
        if recheck:
            again, again_error = _fails(prop, shrunk, replay)
            result.finding.reproduced = again_error is not None or (
                again is not None and not again.held
            )
    result.replays = memo.count
    result.seconds = time.perf_counter() - start
    return result


def render_finding(finding: ScenarioFinding) -> str:
    """A finding in a few lines of markdown-friendly text (for a lane summary or a report)."""
    lines = [
        f"{finding.prop} ({finding.kind}): {finding.message}",
        f"features on: {', '.join(finding.features) or '(none)'}",
        f"scenario: {finding.scenario}",
        f"compared with: {finding.twin}",
    ]
    if finding.timeline:
        lines += ["timeline:", finding.timeline]
    if finding.twin_timeline:
        lines += ["twin timeline:", finding.twin_timeline]
    return "\n".join(lines)
