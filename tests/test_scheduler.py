"""The campaign's turn scheduler on fake cells and a fake clock: controls within their share,
enabled-state cells first, every first turn within the first third, novelty earns turns."""

from __future__ import annotations

import pytest

from bi_props.campaigns.scheduler import (
    CONTROL_SHARE,
    KNOWN_TURN_S,
    Item,
    Scheduler,
    behaviours,
)


def _run(schedule: Scheduler, cost: dict, until: float, lines=None) -> list[tuple[float, Item]]:
    """Drive the scheduler with a fake clock: each turn takes min(its limit, cost[key]) s."""
    now, log = 0.0, []
    while True:
        picked = schedule.next(now)
        if picked is None:
            return log
        item, limit = picked
        spent = min(limit, cost.get(item.key, 0.1)) if cost.get(item.key) != "slow" else limit
        log.append((now, item))
        turn_lines = lines(item, len(log)) if lines else []
        schedule.done(item, spent, 10, turn_lines)
        now += spent
        if now >= until:
            return log


def _cells(schedule: Scheduler, n_enabled: int, n_disabled: int, n_controls: int = 0) -> None:
    for i in range(n_disabled):  # added first: order must not decide, the switch state must
        schedule.add(Item(f"d{i}", "cell", "disabled"))
    for i in range(n_enabled):
        schedule.add(Item(f"e{i}", "cell", "enabled" if i % 2 else "both"))
    for i in range(n_controls):
        schedule.add(Item(f"c{i}", "control", "disabled"))


def test_enabled_state_and_parity_cells_get_their_first_turns_before_disabled_ones() -> None:
    schedule = Scheduler(60.0)
    _cells(schedule, 5, 5)
    log = _run(schedule, {}, 60.0)
    first = []
    for _, item in log:
        if item.key not in first:
            first.append(item.key)
    assert first[:5] == [f"e{i}" for i in range(5)], first
    assert sorted(first[5:]) == [f"d{i}" for i in range(5)]


def test_every_cell_has_its_first_turn_within_the_first_third() -> None:
    # 109 cells whose turns would each take 2 s if not limited, a 60 s budget: one turn each fits
    # only because first turns are time-boxed to the first third's remaining time per cell.
    schedule = Scheduler(60.0)
    _cells(schedule, 60, 49, 15)
    cost = {item.key: "slow" for item in schedule.items}
    log = _run(schedule, cost, 60.0)
    first_turn = {}
    for at, item in log:
        first_turn.setdefault(item.key, at)
    cells = [i for i in schedule.items if i.kind == "cell"]
    assert all(c.key in first_turn for c in cells)
    latest = max(first_turn[c.key] for c in cells)
    assert latest <= 20.0 + 1e-9, f"a cell's first turn started at {latest:.2f} s (> 20 s)"


def test_controls_stay_within_their_share_and_are_interleaved() -> None:
    schedule = Scheduler(100.0, control_share=0.1)
    _cells(schedule, 4, 4, 5)
    cost = {item.key: "slow" for item in schedule.items}  # controls never finish by themselves
    log = _run(schedule, cost, 100.0)
    control_s = sum(i.seconds for i in schedule.items if i.kind == "control")
    assert 0 < control_s <= 0.1 * 100.0 + 1e-9, control_s
    assert log[0][1].kind == "cell"  # the controls never go first
    kinds = [item.kind for _, item in log[:40]]
    assert "control" in kinds and kinds.index("control") < 20, kinds


def test_default_control_share_is_at_most_a_quarter() -> None:
    assert CONTROL_SHARE <= 0.25
    with pytest.raises(ValueError, match="control_share"):
        Scheduler(10.0, control_share=1.5)


def test_unfinished_controls_may_use_what_is_left_once_every_cell_retired() -> None:
    schedule = Scheduler(100.0, control_share=0.05)
    schedule.add(Item("e0", "cell", "enabled"))
    control = schedule.add(Item("c0", "control", "disabled"))
    item, _ = schedule.next(0.0)
    schedule.done(item, 1.0, 10, finished=True)  # the only cell retires (a finding)
    item, limit = schedule.next(1.0)
    assert item is control and limit == pytest.approx(99.0)


def test_novelty_earns_more_turns_than_a_stale_cell() -> None:
    schedule = Scheduler(200.0)
    schedule.add(Item("stale", "cell", "enabled"))
    schedule.add(Item("fresh", "cell", "enabled"))

    def lines(item: Item, n: int) -> list[dict]:
        if item.key == "fresh":  # a new shape bucket every turn
            return [{"dtype": "float32", "layouts": ["contiguous"], "shape": [2**n, 4]}]
        return [{"dtype": "float32", "layouts": ["contiguous"], "shape": [3, 4]}]

    _run(schedule, {"stale": 1.0, "fresh": 1.0}, 200.0, lines)
    stale, fresh = schedule.items
    assert fresh.turns > 1.5 * stale.turns, (fresh.turns, stale.turns)
    assert stale.turns >= 10  # no starvation


def test_enabled_cells_get_more_time_than_disabled_ones_at_equal_novelty() -> None:
    schedule = Scheduler(100.0)
    schedule.add(Item("d", "cell", "disabled"))
    schedule.add(Item("e", "cell", "enabled"))
    _run(schedule, {"d": 1.0, "e": 1.0}, 100.0)
    disabled, enabled = schedule.items
    assert enabled.seconds > 1.5 * disabled.seconds


def test_batch_invariance_cells_get_more_time_than_their_neighbours() -> None:
    """``BATCH_WEIGHT``: the property the switch exists for gets about twice its neighbour's
    time at equal cost and novelty (a split-by-longest kernel's cell ran 61 examples of a 120 s
    campaign without it)."""
    schedule = Scheduler(100.0)
    other = schedule.add(Item("reference", "cell", "enabled"))
    batch = schedule.add(Item("batch", "cell", "enabled", batch_compared=True))
    _run(schedule, {"reference": 1.0, "batch": 1.0}, 100.0)
    assert 1.6 < batch.seconds / other.seconds < 2.5, (batch.seconds, other.seconds)


def test_a_cell_whose_examples_cost_more_gets_more_time_but_not_all_of_it() -> None:
    """Time goes in proportion to sqrt(cost per example): a slow kernel's cell (here 16x the
    cost) gets about 4x the time of a cheap one, so it runs 1/4 as many examples, not 1/16
    (sharing time) and not as many (sharing examples, which would hand it 94% of the budget)."""
    schedule = Scheduler(400.0)
    cheap = schedule.add(Item("cheap", "cell", "enabled"))
    slow = schedule.add(Item("slow", "cell", "enabled"))
    per_example = {"cheap": 0.01, "slow": 0.16}
    now = 0.0
    while (picked := schedule.next(now)) is not None:
        item, limit = picked
        examples = max(1, int(limit / per_example[item.key]))
        spent = examples * per_example[item.key]
        schedule.done(item, spent, examples)
        now += spent
    assert 3.0 < slow.seconds / cheap.seconds < 5.5, (slow.seconds, cheap.seconds)
    assert 2.5 < cheap.examples / slow.examples < 5.5, (cheap.examples, slow.examples)


def test_behaviours_and_growing_reference_distance_count_as_new() -> None:
    keys, largest = behaviours(
        [
            {"dtype": "bfloat16", "layouts": ["t"], "shape": [5, 3], "max_ulp": 2},
            {"dtype": "bfloat16", "layouts": ["t"], "shape": [6, 3], "max_ulp": 7},
        ]
    )
    assert keys == {("bfloat16", ("t",), "4-7x2-3")} and largest == 7
    schedule = Scheduler(10.0)
    item = schedule.add(Item("e", "cell", "enabled"))
    line = {"dtype": "float32", "layouts": [], "shape": [1], "max_ulp": 3}
    assert schedule.done(item, 0.1, 1, [line]) == 1  # a new bucket
    assert schedule.done(item, 0.1, 1, [line]) == 0  # nothing new
    assert schedule.done(item, 0.1, 1, [{**line, "max_ulp": 9}]) == 1  # the distance grew


def test_nothing_is_scheduled_past_the_budget() -> None:
    schedule = Scheduler(10.0)
    schedule.add(Item("e", "cell", "enabled"))
    assert schedule.next(10.0) is None
    _, limit = schedule.next(9.9)
    assert 0 < limit <= 0.1 + 1e-9


def test_control_share_is_read_from_the_space_and_validated(tmp_path) -> None:
    from bi_props.cli import main
    from bi_props.model.space import SpaceError, load

    good = tmp_path / "good.toml"
    good.write_text("[runner]\ncontrol_share = 0.05\n")
    assert load(good).control_share == 0.05
    bad = tmp_path / "bad.toml"
    bad.write_text("[runner]\ncontrol_share = 1.5\n")
    with pytest.raises(SpaceError, match=r"runner\.control_share"):
        load(bad)
    assert main(["fuzz", "--control-share", "2", "--out", str(tmp_path / "o")]) == 2


def test_cells_of_ops_the_target_claims_get_more_time_and_go_first() -> None:
    schedule = Scheduler(100.0)
    stock = schedule.add(Item("stock", "cell", "enabled", claimed=False))
    own = schedule.add(Item("own", "cell", "enabled", claimed=True))
    item, _ = schedule.next(0.0)
    assert item is own
    _run(schedule, {"stock": 1.0, "own": 1.0}, 100.0)
    assert own.seconds > 3 * stock.seconds, (own.seconds, stock.seconds)


def test_a_claimed_ops_disabled_state_cell_goes_before_stock_ops_enabled_cells() -> None:
    """The target's own kernels are what a campaign tests, in both switch states: a switch leak
    (the kernel installed with the switch off) shows only in a disabled-state cell, which must
    not wait behind every enabled-state cell of the ops left to stock kernels."""
    schedule = Scheduler(100.0)
    for i in range(5):
        schedule.add(Item(("stock", i), "cell", "enabled", claimed=False))
    own_disabled = schedule.add(Item("own-disabled", "cell", "disabled", claimed=True))
    own_enabled = schedule.add(Item("own-enabled", "cell", "enabled", claimed=True))
    log = _run(schedule, {}, 100.0)
    firsts = [item for _, item in log[:2]]
    assert firsts == [own_enabled, own_disabled], [item.key for item in firsts]


def test_a_control_share_of_zero_turns_the_controls_off() -> None:
    schedule = Scheduler(100.0, control_share=0.0)
    schedule.add(Item("e0", "cell", "enabled"))
    schedule.add(Item("c0", "control", "disabled"))
    item, _ = schedule.next(0.0)
    schedule.done(item, 1.0, 10, finished=True)
    assert schedule.next(1.0) is None


def test_targets_of_one_campaign_take_first_turns_in_alternation() -> None:
    """Two targets' cells added one target after the other: the second is not starved behind
    the first (under load a short budget ends within the first target's first turns)."""
    schedule = Scheduler(20.0)
    for target in ("lib", "cpu"):
        for i in range(6):
            schedule.add(Item((target, i), "cell", "enabled", group=target))
    log = _run(schedule, {}, 20.0)
    firsts = [item.key[0] for _, item in log[:6]]
    assert firsts == ["lib", "cpu"] * 3, firsts


def test_controls_that_saw_variance_leave_their_share_to_the_blind_ones() -> None:
    """Each control gets turns until it has seen variance or spent its quota,
    within the control share; a control that saw variance early (shrinking) takes no turn while
    another is still searching, so the blind ones get what it did not use."""
    schedule = Scheduler(100.0, control_share=0.1)
    _cells(schedule, 4, 4, 10)
    seeing = {f"c{i}" for i in range(5)}  # these see variance in their first turn
    now = 0.0
    while (picked := schedule.next(now)) is not None:
        item, limit = picked
        if item.kind == "control" and item.key in seeing:
            assert all(not c.searching for c in schedule.controls() if c.key in seeing) or (
                item.turns == 0
            ), "a shrinking control took a turn while others were still searching"
            item.searching = False
        # A control's turn ends at its first variance (0.2 s here); other turns use their limit.
        spent = 0.2 if item.kind == "control" and item.key in seeing and item.turns == 0 else limit
        schedule.done(item, spent, 10)
        now += spent
    control_s = sum(c.seconds for c in schedule.controls())
    assert control_s <= 10.0 + 1e-9
    blind = [c.seconds for c in schedule.controls() if c.key not in seeing]
    early = [c.seconds for c in schedule.controls() if c.key in seeing]
    assert max(early) <= 0.2 + 1e-9, early  # one turn each, ended at the first variance
    assert min(blind) >= 1.6, blind  # 1.0 s each if the share were split over all ten


def test_a_shrinking_control_waits_while_another_searches() -> None:
    schedule = Scheduler(100.0, control_share=0.5)
    schedule.add(Item("e0", "cell", "enabled"))
    shrinking = schedule.add(Item("c0", "control", "disabled"))
    searching = schedule.add(Item("c1", "control", "disabled"))
    shrinking.searching = False
    schedule.done(schedule.items[0], 10.0, 10)  # the cell ran: the controls' share is due
    picks = []
    now = 10.0
    for _ in range(6):
        item, limit = schedule.next(now)
        picks.append(item.key)
        schedule.done(item, limit, 10)
        now += limit
    assert "c1" in picks and picks.index("c1") < (picks.index("c0") if "c0" in picks else 99)
    assert searching.seconds > shrinking.seconds


def test_a_control_whose_first_turn_paid_a_warm_up_gets_its_next_turn() -> None:
    """README command 1 once left the mm control with 2 examples: its first turn paid
    mm's warm-up in the worker, and least-time-first never picked it again within the share."""
    schedule = Scheduler(60.0)
    _cells(schedule, 4, 4, 4)
    now, turns = 0.0, {}
    while (picked := schedule.next(now)) is not None:
        item, limit = picked
        spent = limit
        if item.kind == "control":
            turns[item.key] = turns.get(item.key, 0) + 1
            if item.key == "c0" and item.turns == 0:
                spent = 3.0  # a slow first example: the first turn ran far past its limit
        schedule.done(item, spent, 10)
        now += spent
    assert turns.get("c0", 0) >= 2, turns


def test_a_shrink_leaves_room_for_the_first_turns_still_due() -> None:
    # A failure found early would shrink to the budget's end and starve every later cell of its
    # only turn (the vLLM lane's engine-ops campaign, 2026-12-03: fused_moe's shrinks took 43 s,
    # each disabled-state reference cell's 10-23 s, and paged_decode_attention's last cells never
    # ran). A shrink gets an equal share of what is left after a reserve per cell due.
    schedule = Scheduler(300.0)
    _cells(schedule, 4, 4)
    cells = schedule.cells()
    reserve = 2.0 * 0.5 * 8  # no turn seen yet: 0.5 s per cell due, twice
    assert schedule.shrink_end(0.0) == pytest.approx((300.0 - reserve) / 9)
    for item in cells[:3]:  # three first turns of 1 s each, one of them with 9 s of shrinking
        schedule.done(item, 1.0, 10)
    schedule.done(cells[3], 10.0, 10, shrink_s=9.0)
    assert schedule.first_turn_estimate() == pytest.approx(1.0)
    running = cells[4]  # the cell whose turn shrinks is not in its own reserve
    assert schedule.shrink_end(20.0, running) == pytest.approx(20.0 + (280.0 - 2.0 * 3) / 4)
    for item in cells[4:]:
        schedule.done(item, 1.0, 10)
    assert schedule.shrink_end(30.0) == 300.0  # every cell had its turn: shrink to the end
    late = Scheduler(10.0)
    _cells(late, 40, 0)
    assert late.shrink_end(2.0) == pytest.approx(2.0 + 0.5)  # never shorter than a later turn
    assert late.shrink_end(9.8) == 10.0  # nor past the budget


def test_every_cell_runs_though_each_first_turn_finds_a_failure_that_shrinks_long() -> None:
    # A fake clock: every cell's first turn fails and would shrink for 60 s, unless cut at
    # shrink_end; 40 cells in 120 s all get their turn.
    schedule = Scheduler(120.0)
    _cells(schedule, 20, 20)
    now = 0.0
    while (picked := schedule.next(now)) is not None:
        item, limit = picked
        if item.turns == 0:
            shrink = min(60.0, max(schedule.shrink_end(now + 0.1, item) - now - 0.1, 0.0))
            schedule.done(item, 0.1 + shrink, 10, finished=True, shrink_s=shrink)
            now += 0.1 + shrink
        else:
            schedule.done(item, limit, 10)
            now += limit
        if now >= 120.0:
            break
    assert all(c.turns == 1 for c in schedule.cells()), [
        c.key for c in schedule.cells() if not c.turns
    ]


def test_a_cell_with_its_stated_examples_gets_no_more_turns() -> None:
    """``examples_per_cell``: satisfied cells stop taking turns, so the run ends once the slowest
    cell (a disabled-state one, weight 1 against 32 for a claimed enabled one) has its examples;
    without it the stride policy keeps the turns on the heavy cells."""
    schedule = Scheduler(1000.0, control_share=0.0, examples_per_cell=30)
    schedule.add(Item("d0", "cell", "disabled", claimed=False))
    for i in range(4):
        schedule.add(Item(f"e{i}", "cell", "enabled"))
    log = _run(schedule, {}, 1000.0)  # each turn 10 examples
    assert schedule.next(len(log) * 0.1) is None  # every cell satisfied: nothing left to run
    assert all(c.examples == 30 for c in schedule.cells())
    assert len(log) == 5 * 3

    unbounded = Scheduler(1000.0, control_share=0.0)
    unbounded.add(Item("d0", "cell", "disabled", claimed=False))
    for i in range(4):
        unbounded.add(Item(f"e{i}", "cell", "enabled"))
    log = _run(unbounded, {}, 15 * 0.1)
    assert unbounded.items[0].examples < 30  # the same 15 turns left the disabled cell short


def test_the_users_question_has_its_first_turns_before_any_other_cell() -> None:
    """On a broken target, the model-level cells and each claimed op's enabled batch-invariance
    cell (``Item.first``) are answered before any other cell's first turn (and so before any
    of their failures is shrunk)."""
    s = Scheduler(60.0)
    others = [s.add(Item(f"op{i} reference")) for i in range(5)]
    question = [s.add(Item("mm batch_invariance")), s.add(Item("probe_model logprobs"))]
    for item in question:
        item.first = True
    order = []
    for _ in range(len(others) + len(question)):
        item, _limit = s.next(0.0)
        order.append(item)
        s.done(item, 0.01, 1)
    assert order[: len(question)] == question


def test_a_cell_below_its_floor_or_with_known_cases_pending_jumps_the_queue() -> None:
    s = Scheduler(60.0)
    plain, floored, pending = (s.add(Item(f"op{i}")) for i in range(3))
    for item in (plain, floored, pending):  # every first turn taken
        s.done(item, 0.01, 5)
    floored.floor, floored.judged = 10, 5
    pending.pending = True
    assert s.next(1.0)[0] is pending  # known cases first, then the floor
    pending.pending = False
    assert s.next(1.0)[0] is floored
    floored.judged = 10
    assert not floored.urgent


def test_a_claimed_floor_goes_before_disabled_and_unclaimed_first_turns() -> None:
    """Once every claimed op's enabled-state cell has had its first turn, a floored cell below
    its floor runs one turn before the first turns still due of disabled-state and unclaimed
    cells (on a slow machine those lasted until 46 s of a 60 s budget, and the floors were
    missed)."""
    s = Scheduler(60.0)
    floored = s.add(Item("mm reference"))
    enabled_due = s.add(Item("softmax reference"))
    disabled = s.add(Item("mm reference off", switch="disabled"))
    unclaimed = s.add(Item("sum reference"))
    unclaimed.claimed = False
    s.done(floored, 0.3, 4)
    floored.floor, floored.judged = 10, 4
    assert s.next(1.0)[0] is enabled_due  # a claimed enabled first turn still goes first
    s.done(enabled_due, 0.1, 5)
    assert s.next(2.0)[0] is floored  # then the floor, before the others' first turns
    s.done(floored, 1.2, 2)
    assert floored.urgent  # still below its floor: but one early turn only (a slow target's
    assert s.next(3.0)[0] in (disabled, unclaimed)  # floors must not starve these of theirs)


def test_known_cases_pending_run_before_other_cells_first_turns() -> None:
    """A control that saw the stock kernel vary early hands its cases to a cell that has had its
    first turn: they run at once, in a short turn, not after 200 other cells' first turns."""
    s = Scheduler(180.0)
    early, *later = (s.add(Item(f"op{i}")) for i in range(5))
    s.done(early, 0.01, 2)
    early.pending = True
    item, limit = s.next(1.0)
    assert item is early and limit <= KNOWN_TURN_S
    s.done(early, limit, 1)
    # one early turn a cell: cases still pending wait for the first turns (then jump the queue)
    assert s.next(2.0)[0] in later
    failed = later[0]
    s.done(failed, 0.01, 2)
    failed.pending, failed.failed = True, True  # a cell with a finding has its answer
    assert s.next(3.0)[0] in later[1:]
