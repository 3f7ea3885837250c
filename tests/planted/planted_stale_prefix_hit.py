"""A planted engine bug for the scenario search: a stale value only on a prefix-cache hit.

``StaleOnPrefixHit`` wraps an engine replay (vLLM's engine driver in the vLLM lane,
``tests/scenario_fake.FakeEngine`` in the main suite) and, for every request the engine served
partly from its prefix cache (``cached_tokens > 0``, as the engine itself reported it), changes
the last bit of the logprob of its first generated token: the shape of the reported bug where a
buffer allocated with ``torch.empty`` keeps a stale value when the cached prefix skips the
positions that would have overwritten it. Requests without a cache hit are passed through as
they came. The scenario search must find this and shrink it to at most three requests (a request
that warms the cache, the needle that hits it).
"""

from __future__ import annotations

from dataclasses import replace

from bi_props.model.scenario import Scenario, ScenarioResult


class StaleOnPrefixHit:
    def __init__(self, replay) -> None:
        self.replay = replay
        self.perturbed = 0

    def __call__(self, scenario: Scenario) -> ScenarioResult:
        result = self.replay(scenario)
        requests = []
        for request in result.requests:
            if request.cached_tokens > 0 and request.logprob_bits:
                bits = (request.logprob_bits[0] ^ 1, *request.logprob_bits[1:])
                request = replace(request, logprob_bits=bits)
                self.perturbed += 1
            requests.append(request)
        return replace(result, requests=tuple(requests))
