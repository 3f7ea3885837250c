"""The property tests. Parametrised by the plugin (op x property x switch state) from the active
search space; max_examples, database and derandomize come from the Hypothesis profile."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st


@pytest.mark.bi_props
def test_regression(bi_props_session, bi_regression):
    """Promoted regression cases (``--bi-regressions``), run before anything is generated."""
    r = bi_regression
    bi_props_session.check(r.op, r.property, r.switch, r.case)


@pytest.mark.bi_props
def test_batch_variance_control(bi_props_session, bi_op, bi_property, bi_switch):
    """Negative control: with the switch off, look for batch variance and report the smallest case
    that shows it. Stock kernels promise no invariance: a control that saw none is flagged (the
    run cannot show that it sees variance), and fails with --bi-strict-controls."""
    control = bi_props_session.control(bi_op, bi_property)
    if not control.variance_seen and bi_props_session.strict_controls:
        pytest.fail(f"blind negative control ({bi_op} {bi_property}): {control.message}")


@pytest.mark.bi_props
def test_known_cases(bi_props_session, bi_op, bi_property, bi_switch):
    """Explicit examples, before anything is drawn: in the enabled batch-comparing cells every
    case on which the stock kernel was seen batch-variant (by the negative controls above, or
    kept in the example database by an earlier run), in parity every dtype of the contract, in
    reference every dtype of the space (bi_props.campaigns.explicit)."""
    from bi_props.campaigns.explicit import run_explicit

    session = bi_props_session
    before = len(session.findings)
    judged, _ = run_explicit(session, bi_op, bi_property, bi_switch)
    found = session.findings[before:]
    if found:
        pytest.fail("\n".join(f"{f.kind}: {f.case}\n{f.message}" for f in found), pytrace=False)
    if not judged:
        pytest.skip(
            f"no explicit case for {bi_op} {bi_property} [{bi_switch}]: its negative control saw "
            "no stock batch variance to replay (the summary says what it saw)"
        )


# Only the deadline, slow-test and filtering health checks are set here, whatever the profile: a
# first example may start a worker or compile kernels. max_examples, database and derandomize come
# from the active profile (this module is imported at collection, after Hypothesis loaded it).
@pytest.mark.bi_props
@settings(
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
    ],
)
@given(data=st.data())
def test_property(bi_props_session, bi_op, bi_property, bi_switch, data):
    """One drawn example. In the cells with a floor of evidence (reference, batch invariance),
    one that compared nothing that could differ, or that no summation order could have failed,
    is no evidence: rejected, so max_examples counts judged examples (the session still counts
    it apart in the summary), up to max_examples of them; once the cell failed, it passes as it
    did, so that the shrink is the one a campaign's cell gets."""
    from bi_props.campaigns.evidence import FLOORED
    from bi_props.campaigns.session import COUNTED_APART

    session = bi_props_session
    case = data.draw(session.strategy(bi_op, bi_property), label="case")
    outcome = session.check(bi_op, bi_property, bi_switch, case)
    cell = (bi_op, bi_property, bi_switch)
    if outcome in COUNTED_APART and bi_property in FLOORED and cell not in session.failed_cells:
        # at most max_examples of them drawn again: a cell whose every call raises the same
        # error judges nothing however long it draws (its summary line and floor say so)
        apart = session.degenerate.get(cell, [0])[0] + session.order_blind.get(cell, 0)
        if apart <= settings().max_examples:
            reject()
