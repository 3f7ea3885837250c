"""Which cell runs next, and for how long: the campaign's turn scheduler (no clock of its own).

A campaign's budget is spent in *turns*. The scheduler holds one ``Item`` per cell (op, property,
switch state) and one per negative control, and answers ``next(now)`` with the item to run and the
turn's time limit. Its policy, in order:

1. **Controls share the budget, and none is starved.** Control turns are taken only while the
   controls' time is below ``control_share`` x the time scheduled so far (so they are
   interleaved, never first); the controls' total stays within ``control_share`` x budget.
   Within it, a control that is still *searching* (no variance seen yet) gets turns until it has
   seen variance or spent its quota (``[runner] control_examples`` examples, after which it is
   done and says so); the searching controls take turns in rounds (fewest turns first, then
   least time: a control whose first turn paid the op's warm-up in the worker is not pushed
   behind the others), so the share is split evenly between them, and what a control that
   saw variance early did not use goes to those still searching. A turn lasts at most the
   share left divided among the controls still searching, and at least ``MIN_TURN_S``; while
   others search, a control's turn ends at its first variance (the campaign asks
   ``Session.control`` for no shrink), so an early variance frees time for the others.
   Controls that saw variance and are *shrinking* take turns only when no control is
   searching. Once every cell is retired, unfinished controls may
   use what is left of the budget (their search or shrink continues at the end). A share of 0
   turns the controls off.
2. **First turns, where bugs are first.** Cells that have not had a turn go first: first the
   cells that answer the user's question (``Item.first``: the model-level cells and each claimed
   op's enabled batch-invariance cell), so a broken target's other failures and their shrinks
   cannot take the budget before it is answered; then cells of ops
   the target claims (its own kernels, in both switch states: a switch leak shows in the
   disabled state's routing cell) before those it leaves to stock kernels, and within each,
   enabled-state and ``parity`` cells before disabled-state ones (a library claiming ``mm``
   had its disabled-state routing cell's first turn at 100 s of a 120 s campaign, behind 100
   enabled-state cells of stock ops, when the switch state came first); within that, the
   targets of a campaign take first turns in alternation (the target with the fewest first
   turns so far), each in catalogue order, so that a second target is not starved behind the
   first. Their time limit is the
   time left until the end of the first third of the budget, split between the first turns still
   due in proportion to their weights (below; at least ``MIN_TURN_S``), so every cell has had its
   first turn within the first third whenever the budget allows one turn per cell. A turn always
   runs at least one example.
3. **Then novelty, by stride.** Each live cell gets a weight ``w = class x (1 + novelty)``:
   ``class`` is ``ENABLED_WEIGHT`` for enabled-state and parity cells and 1 for disabled-state
   ones, times ``CLAIMED_WEIGHT`` for ops the target claims (a library claiming one op of 22 then
   spends about half the time on it; a target that claims every op, like ``cpu``, is
   unaffected), times ``BATCH_WEIGHT`` for batch-invariance cells (the property the switch
   exists for, whose examples cost the most: the batch and the needle alone); ``novelty`` is
   an exponentially decayed count (``NOVELTY_DECAY`` per turn of the cell) of the new
   behaviour its turns produced: shape buckets, dtypes and layout combinations it had not
   produced before in this run, and reference distances (max ULP, where coverage
   lines record one) larger than any it saw before (growing toward the bound). The next turn
   goes to the live cell with the least ``sqrt(seconds x examples) / w``: a cell whose examples
   cost ``c`` seconds each gets time in proportion to ``w x sqrt(c)``, between sharing time
   (where a cell whose examples cost 50x more runs 50x fewer of them: a slow kernel's
   batch-invariance cell, which calls it on the whole batch and on the needle, saw 29 examples
   in a 120 s campaign while its cheap stock-kernel neighbour saw 1,420) and sharing examples
   (where the slow cell takes 50x the time); at equal costs it is ``seconds / w``. A cell still
   finding new behaviour gets more turns, and none starves.
4. **A shrink leaves room for the first turns still due.** A failure is shrunk inside the turn
   that found it, and a shrink can take minutes (a fused MoE on 2 cores). ``shrink_end`` is when
   a shrink that starts now must stop while cells have not had their first turn: the time left,
   less a reserve of ``FIRST_TURN_MARGIN`` x the mean first turn so far (shrinks excluded) per
   cell due, split equally between this shrink and the cells due (each may find a failure and
   shrink it too), so early failures cannot starve a later cell of its only turn; it is never
   shorter than a later turn's limit (``TURN_FRACTION`` of the budget, within 0.5-10 s), so a
   short campaign over many cells still shrinks. A shrink cut there is recorded with the
   smallest failing case seen, and says why; once every cell has had a turn, a shrink may run to
   the budget's end.
5. **The first known case at once, the floor before novelty.** A cell with explicit cases
   pending (known batch-variant cases a negative control found after the cell's first turn),
   that has recorded no finding yet, takes one short turn (``KNOWN_TURN_S``: its smallest known
   case at least) before any other cell's, first turns included: a kernel as batch-variant as
   stock fails there, so that evidence must not wait on the luck of the budget (on a loaded
   2-core machine the first turns of 221 cells once outlasted a 180 s budget). Once every
   claimed op's enabled-state cell has had its first turn, a cell with a *floor* (a claimed
   op's enabled reference and batch-invariance cells: ``[runner] min_judged`` judged examples,
   or the run is thin) that is below it takes one turn before the first turns of
   disabled-state and unclaimed cells (on a slower 2-core machine those first turns lasted
   until 46 s of 60, and the floors were missed; one, so that a slow target's floors cannot
   starve those cells of their only turn). Once every cell has had its first turn, a cell below
   its floor or with known cases still pending takes the next turn, as many as it needs:
   pending cases first, then the cell furthest below its floor. A
   cell that has run ``FLOOR_PATIENCE`` x its floor in examples without reaching it (its
   examples are degenerate, say) no longer jumps the queue.
6. **A stated evidence size ends turns, not time.** With ``examples_per_cell`` (``bi-props fuzz
   --examples-per-cell N``) a cell that has run N examples in this run is satisfied and gets no
   more turns (the campaign stops once every cell is, and the controls have settled): the
   weights above would otherwise give a disabled-state cell of an op the target leaves to stock
   kernels 1/32 of a claimed enabled cell's time, and the run would last until that cell had N.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..model.space import CONTROL_SHARE

MIN_TURN_S = 0.05
MAX_TURN_S = 10.0
TURN_FRACTION = 0.02  # a later turn's time limit: this fraction of the budget, within the bounds
ENABLED_WEIGHT = 2.0
CLAIMED_WEIGHT = 16.0
BATCH_WEIGHT = 2.0
"""Extra weight of batch-invariance cells: the property a switch exists for, and the costliest
per example (the kernel runs on the whole batch and on the needle alone), so sharing by
``sqrt(cost)`` alone left it 61 examples of a 120 s single-op campaign."""
NOVELTY_DECAY = 0.5
NOVELTY_CAP = 8.0
FIRST_TURN_MARGIN = 2.0  # a shrink's reserve per first turn still due, in mean first turns
KNOWN_TURN_S = MIN_TURN_S
"""The early turn that runs a cell's first pending known case: one case (no case starts after
the turn's end once one has run); the others wait for the cell's later turns."""
FLOOR_TURN_S = 0.3
"""A floored cell's first turn goes on past its limit until it has judged its floor, for at most
this long (campaign.py: ``run_slice``'s ``floor``): with 221 cells in a 60 s budget, the first
turns alone outlasted the budget's first two thirds, and the floors were never reached."""
FLOOR_PATIENCE = 4
"""A cell below its floor jumps the queue until it has run this many times its floor."""


@dataclass
class Item:
    """One schedulable thing: a cell (kind "cell") or a negative control (kind "control")."""

    key: Any
    kind: str = "cell"
    switch: str = "enabled"
    order: int = 0
    turns: int = 0
    seconds: float = 0.0
    examples: int = 0
    novelty: float = 0.0
    done: bool = False
    seen: set = field(default_factory=set, repr=False)
    max_distance: int | None = None
    claimed: bool = True  # the target claims the op (its own kernel): where its bugs can be
    searching: bool = True  # a control that has seen no variance yet (the campaign updates it)
    group: Any = None  # the target: first turns alternate between targets of equal priority
    first_turn_s: float | None = None  # the first turn's seconds, its shrink excluded
    batch_compared: bool = False  # a batch-invariance cell (``BATCH_WEIGHT``)
    first: bool = False  # the user's question: a first turn before other cells' (policy 2)
    floor: int = 0  # judged examples the cell must reach (the module's policy 5)
    judged: int = 0  # judged examples so far (the campaign updates it after each turn)
    pending: bool = False  # explicit cases wait for the cell's next turn (policy 5)
    jumped: bool = False  # had its one early turn for known cases (policy 5)
    failed: bool = False  # recorded a finding in this run (no early turn for known cases)
    floor_jumped: bool = False  # had its one turn for its floor before others' first turns

    @property
    def below_floor(self) -> bool:
        """Below its floor, within ``FLOOR_PATIENCE``."""
        return self.judged < self.floor and self.examples < FLOOR_PATIENCE * self.floor

    @property
    def urgent(self) -> bool:
        """Below its floor (within ``FLOOR_PATIENCE``), or explicit cases pending."""
        return self.pending or self.below_floor

    @property
    def enabled_state(self) -> bool:
        """Enabled-state and parity cells: where a switch's bugs show."""
        return self.switch in ("enabled", "both")

    @property
    def effort(self) -> float:
        """What the cell has had, for sharing: the geometric mean of its seconds and its
        examples' worth of seconds (``sqrt(seconds x examples)``; see the module's policy 3)."""
        return math.sqrt(self.seconds * max(self.examples, 1))

    @property
    def weight(self) -> float:
        kind = ENABLED_WEIGHT if self.enabled_state else 1.0
        claimed = CLAIMED_WEIGHT if self.claimed else 1.0
        batch = BATCH_WEIGHT if self.batch_compared else 1.0
        return kind * claimed * batch * (1.0 + min(self.novelty, NOVELTY_CAP))


def behaviours(lines: list[dict[str, Any]]) -> tuple[set, int | None]:
    """What a turn's coverage lines exercised: (dtype, layouts, shape bucket) keys, and the
    largest reference distance (max ULP) among them (None when no line has one)."""
    from ..reporting.data import shape_bucket

    keys = set()
    largest: int | None = None
    for line in lines:
        keys.add(
            (
                line.get("dtype"),
                tuple(line.get("layouts") or ()),
                shape_bucket(line.get("shape") or []),
            )
        )
        distance = line.get("max_ulp")
        if distance is not None and (largest is None or distance > largest):
            largest = int(distance)
    return keys, largest


class Scheduler:
    """Turn scheduler over ``Item``s for one budget; the caller supplies the clock (``now`` is
    seconds since the campaign's start)."""

    def __init__(
        self,
        budget_s: float,
        control_share: float = CONTROL_SHARE,
        examples_per_cell: int | None = None,
    ) -> None:
        if not 0.0 <= control_share <= 1.0:
            raise ValueError(f"control_share must be within [0, 1], got {control_share}")
        self.budget_s = budget_s
        self.control_share = control_share
        # The policy's 5: a cell with this many examples is satisfied and gets no more turns.
        self.examples_per_cell = examples_per_cell
        self.items: list[Item] = []
        self.control_seconds = 0.0
        self.started_at: float | None = None

    def add(self, item: Item) -> Item:
        item.order = len(self.items)
        self.items.append(item)
        return item

    def cells(self) -> list[Item]:
        return [i for i in self.items if i.kind == "cell"]

    def controls(self) -> list[Item]:
        return [i for i in self.items if i.kind == "control"]

    @property
    def control_budget_s(self) -> float:
        return self.control_share * self.budget_s

    def next(self, now: float) -> tuple[Item, float] | None:
        """The next item to run and its turn's time limit (seconds); None when nothing is live
        or the budget is spent."""
        if self.started_at is None:
            self.started_at = now
        left = self.budget_s - now
        if left <= 0:
            return None
        live_cells = [c for c in self.cells() if not c.done]
        if self.examples_per_cell is not None:  # satisfied: N examples and its floor reached
            live_cells = [c for c in live_cells if c.examples < self.examples_per_cell or c.urgent]
        live_controls = [c for c in self.controls() if not c.done]
        if live_controls and self.control_share > 0:
            # Searching controls first (none starved); shrinking ones when none is searching.
            pool = [c for c in live_controls if c.searching] or live_controls
            # Fewest turns first, then least time: a control whose first turn paid a warm-up
            # (the op's first call in the worker) is not pushed behind all the others.
            control = min(pool, key=lambda c: (c.turns, c.seconds, c.order))
            share_left = self.control_budget_s - self.control_seconds
            scheduled = max(now - self.started_at, 0.0)
            if not live_cells:  # every cell retired: the controls may finish with what is left
                return control, left
            if share_left > 0 and self.control_seconds < self.control_share * scheduled:
                fair = max(MIN_TURN_S, share_left / len(pool))
                return control, min(share_left, left, self._turn_s(), fair)
        if not live_cells:
            return None
        # Known cases before anything new (the policy's 5): a negative control that has just
        # seen the stock kernel vary hands its cases to the op's enabled cells, which run them
        # in a short turn at once, not after every other cell's first turn (on a loaded 2-core
        # machine that came too late for a 180 s budget).
        known = [c for c in live_cells if c.pending and c.turns and not c.jumped and not c.failed]
        if known:
            cell = min(known, key=lambda c: (c.turns, c.order))
            cell.jumped = True
            return cell, min(KNOWN_TURN_S, self._turn_s(), left)
        first = [c for c in live_cells if c.turns == 0]
        below = [c for c in live_cells if c.below_floor and c.turns and not c.floor_jumped]
        if first and below and not any(c.claimed and c.enabled_state for c in first):
            # one turn for a claimed op's floor before the first turns of disabled-state and
            # unclaimed cells (one: a slow target's floors must not starve those of their turn)
            cell = self._most_urgent(below)
            cell.floor_jumped = True
            return cell, min(self._turn_s(), left)
        urgent = [c for c in live_cells if c.urgent]
        if first:
            started: dict[Any, int] = {}  # first turns taken per target
            for c in live_cells:
                if c.turns:
                    started[c.group] = started.get(c.group, 0) + 1
            cell = min(
                first,
                key=lambda c: (
                    not c.first,
                    not c.claimed,
                    not c.enabled_state,
                    started.get(c.group, 0),
                    c.order,
                ),
            )
            third_left = self.budget_s / 3 - now
            part = cell.weight / sum(c.weight for c in first)  # a weighted part of the third
            limit = max(MIN_TURN_S, third_left * part) if third_left > 0 else MIN_TURN_S
            return cell, min(limit, self._turn_s(), left)
        if urgent:
            return self._most_urgent(urgent), min(self._turn_s(), left)
        cell = min(
            live_cells,
            key=lambda c: (c.effort / c.weight, not c.enabled_state, c.turns, c.order),
        )
        return cell, min(self._turn_s(), left)

    def _most_urgent(self, urgent: list[Item]) -> Item:
        """The target that has had the least time first (targets share the budget), then
        pending known cases, then the cell furthest below its floor."""
        spent: dict[Any, float] = {}
        for c in self.cells():
            spent[c.group] = spent.get(c.group, 0.0) + c.seconds
        return min(
            urgent,
            key=lambda c: (
                spent.get(c.group, 0.0),
                not c.pending,
                c.judged / max(c.floor, 1),
                c.turns,
                c.order,
            ),
        )

    def shrink_end(self, now: float, item: Item | None = None) -> float:
        """When a shrink that starts ``now`` (in ``item``'s turn) must stop, in seconds since the
        start: the budget's end less a reserve for the first turns still due (the policy's 4)."""
        due = [c for c in self.cells() if c is not item and not c.done and c.turns == 0]
        if item is not None and item.first:  # the user's question: only its own cells wait
            due = [c for c in due if c.first]
        if not due:
            return self.budget_s
        reserve = FIRST_TURN_MARGIN * self.first_turn_estimate() * len(due)
        # an equal share with each cell due (each may find a failure and shrink it too)
        share = (self.budget_s - now - reserve) / (len(due) + 1)
        return min(self.budget_s, now + max(share, self._turn_s()))

    def first_turn_estimate(self) -> float:
        """The mean first turn of the cells so far, their shrinks excluded (``MIN_TURN_S`` x 10
        before any): what a cell still due will likely take."""
        seen = [c.first_turn_s for c in self.cells() if c.first_turn_s is not None]
        return sum(seen) / len(seen) if seen else MIN_TURN_S * 10

    def _turn_s(self) -> float:
        return min(MAX_TURN_S, max(MIN_TURN_S * 10, TURN_FRACTION * self.budget_s))

    def done(
        self,
        item: Item,
        seconds: float,
        examples: int,
        lines: list[dict[str, Any]] | None = None,
        finished: bool = False,
        shrink_s: float = 0.0,
    ) -> float:
        """Record a turn (``shrink_s`` of its seconds spent shrinking); return the new behaviour
        it produced (see the module's policy)."""
        if item.turns == 0:
            item.first_turn_s = max(seconds - shrink_s, 0.0)
        item.turns += 1
        item.seconds += seconds
        item.examples += examples
        item.done = item.done or finished
        if item.kind == "control":
            self.control_seconds += seconds
        keys, largest = behaviours(lines or [])
        new = len(keys - item.seen)
        item.seen |= keys
        if largest is not None:
            if item.max_distance is not None and largest > item.max_distance:
                new += 1
            if item.max_distance is None or largest > item.max_distance:
                item.max_distance = largest
        item.novelty = item.novelty * NOVELTY_DECAY + new
        return float(new)
