"""The server side of a federated round, written once: :class:`RoundDriver`.

The one loop, round ``rnd`` of a run over ``members`` (ids in the fleet's order):

1. **select**: the members taking part (:meth:`RoundDriver.select`): all of them, or a seeded
   ``fraction`` of them (:class:`RoundRules`), in the fleet's order or sorted by id;
2. **plan**: each selected member's :class:`~fedepth.strategies.TrainTask` from the strategy's
   ``configure_train``, carrying the run's training recipe (:meth:`RoundDriver.tasks`);
3. **collect**: the members' updates come back through the transport, until the round closes;
4. **validate** each update as it arrives (:meth:`RoundDriver.validate`, the rules of
   :mod:`fedepth.updates`: finite values, norm bounds); a rejected one is left out;
5. **close** when every selected member reported, or when a quorum has at the deadline
   (:meth:`RoundDriver.close_reason`);
6. **aggregate** the accepted updates in the selection's order through
   ``Strategy.aggregate_train`` (:meth:`RoundDriver.aggregate`);
7. **record** the round: the transport's record (the simulation's
   :class:`~fedepth.sim.RoundRecord`, the coordinator's store transaction and checkpoint).

Only the transport differs. An in-process one is a :class:`Participants` (the simulation's
executor of client jobs), which :meth:`RoundDriver.run_round` drives through all seven steps in
order. The coordinator (``fedepth_coordinator.rounds.RoundController``) is event-driven: robots
ask for their plan, download and upload when they can; it calls the same steps as those events
arrive (``select`` when it opens a round, ``task`` for every plan, download and upload, the
bounds of ``validate`` on every upload's stream, ``close_reason`` after every accepted upload
and on every deadline tick, ``aggregate`` on close), and records the round in its store.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np

from fedepth.recipe import TrainRecipe
from fedepth.strategies import ClientUpdate, Strategy, TrainTask
from fedepth.updates import UpdateBounds, UpdateRejectedError, check_update

#: Why a round closed (the coordinator records it; the in-process driver reports it).
ALL_REPORTED = "all reported"
QUORUM_AT_DEADLINE = "quorum at deadline"
#: An in-process round whose participants all answered, some with a rejected update.
ALL_ANSWERED = "all answered"


def quorum_of(fraction: float, selected: int) -> int:
    """The reports that close a round of ``selected`` members at its deadline: ``fraction`` of
    them, rounded up, at least one."""
    return max(1, math.ceil(fraction * selected - 1e-9))


@dataclass(frozen=True)
class RoundRules:
    """Who takes part in a round and when it closes.

    ``fraction`` of the members are selected (at least one; a seeded draw from
    ``(seed, round)`` when not all); a round closes when every selected member reported, or
    when ``quorum`` (a fraction of the selected, at least one) has once ``deadline_s`` passed
    since it opened. ``sorted_ids``: the selection (and so the aggregation order) sorted by id,
    as the coordinator keeps it; otherwise in the members' order, as the simulation does.
    """

    num_rounds: int
    fraction: float = 1.0
    quorum: float = 1.0
    deadline_s: float = math.inf
    seed: int = 0
    sorted_ids: bool = False

    def __post_init__(self) -> None:
        if not 0.0 < self.fraction <= 1.0:
            raise ValueError(f"fraction must lie in (0, 1], got {self.fraction}")
        if not 0.0 < self.quorum <= 1.0:
            raise ValueError(f"quorum must lie in (0, 1], got {self.quorum}")
        if not self.deadline_s > 0:
            raise ValueError(f"deadline_s must be > 0, got {self.deadline_s}")


class Participants(Protocol):
    """An in-process transport: trains the round's tasks and hands the updates back (in any
    order; each member at most once)."""

    def collect(self, rnd: int, tasks: Mapping[str, TrainTask]) -> Iterable[ClientUpdate]: ...


@dataclass
class RoundOutcome:
    """What :meth:`RoundDriver.run_round` did in one round."""

    round: int
    selected: tuple[str, ...]
    tasks: dict[str, TrainTask]
    #: the updates aggregated, in the selection's order
    accepted: list[ClientUpdate]
    #: the updates left out, by member: why (:mod:`fedepth.updates`' message)
    rejected: dict[str, str] = field(default_factory=dict)
    closed_by: str = ALL_REPORTED
    #: seconds in configure_train, in collecting (training and transport), in aggregate_train
    configure_s: float = 0.0
    collect_s: float = 0.0
    aggregate_s: float = 0.0


@dataclass
class RoundDriver:
    """Runs the server side of a round for ``strategy``: :meth:`run_round` in-process, its
    steps one by one for an event-driven transport (see the module's docstring)."""

    strategy: Strategy
    rules: RoundRules
    #: the training recipe of a round's tasks (None: the tasks carry none)
    recipe: Callable[[int], TrainRecipe | None] = lambda rnd: None
    bounds: UpdateBounds = field(default_factory=UpdateBounds)
    clock: Callable[[], float] = time.monotonic

    # -- the steps ----------------------------------------------------------------------------
    def select(self, rnd: int, members: Sequence[str]) -> tuple[str, ...]:
        """The members taking part in round ``rnd`` (step 1)."""
        n = len(members)
        k = max(1, math.ceil(self.rules.fraction * n - 1e-9))
        if k < n:
            rng = np.random.default_rng([self.rules.seed, rnd])
            chosen = [int(i) for i in rng.choice(n, size=k, replace=False)]
            if self.rules.sorted_ids:
                return tuple(sorted(members[i] for i in chosen))
            return tuple(members[i] for i in sorted(chosen))
        return tuple(sorted(members)) if self.rules.sorted_ids else tuple(members)

    def tasks(self, rnd: int, cids: Sequence[str]) -> dict[str, TrainTask]:
        """The tasks of round ``rnd`` for ``cids``, with the round's recipe (step 2)."""
        recipe = self.recipe(rnd)
        return {
            cid: replace(task, recipe=recipe)
            for cid, task in self.strategy.configure_train(rnd, list(cids)).items()
        }

    def task(self, rnd: int, cid: str) -> TrainTask:
        """One member's task of round ``rnd`` (what a coordinator serves a robot)."""
        return self.tasks(rnd, [cid])[cid]

    def validate(self, update: ClientUpdate, task: TrainTask) -> None:
        """Raise :class:`~fedepth.updates.UpdateRejectedError` unless ``update`` (trained from
        ``task``) may touch an aggregate (step 4)."""
        check_update(update.state, update.extra, reference=task.state, bounds=self.bounds)

    def quorum(self, selected: int) -> int:
        """The reports that close a round of ``selected`` members at its deadline."""
        return quorum_of(self.rules.quorum, selected)

    def close_reason(
        self, reported: int, selected: int, now: float, deadline: float
    ) -> str | None:
        """Why a round with ``reported`` of ``selected`` updates accepted closes at ``now``
        (None: it stays open) (step 5)."""
        if reported == selected:
            return ALL_REPORTED
        if reported >= self.quorum(selected) and now >= deadline:
            return QUORUM_AT_DEADLINE
        return None

    def aggregate(
        self, rnd: int, selected: Sequence[str], accepted: Mapping[str, ClientUpdate]
    ) -> list[ClientUpdate]:
        """Fold the accepted updates into the strategy in the selection's order (step 6);
        returns them in that order."""
        updates = [accepted[cid] for cid in selected if cid in accepted]
        self.strategy.aggregate_train(rnd, updates)
        return updates

    # -- the loop, in-process ----------------------------------------------------------------
    def run_round(
        self, rnd: int, members: Sequence[str], participants: Participants
    ) -> RoundOutcome:
        """Round ``rnd`` through an in-process transport: select, plan, collect (validating each
        update as it arrives) until the round closes or every participant answered, aggregate.
        The caller records the outcome."""
        selected = self.select(rnd, members)
        t0 = time.perf_counter()
        tasks = self.tasks(rnd, selected)
        configure_s = time.perf_counter() - t0
        deadline = self.clock() + self.rules.deadline_s
        accepted: dict[str, ClientUpdate] = {}
        rejected: dict[str, str] = {}
        closed_by: str | None = None
        t_collect = time.perf_counter()
        for update in participants.collect(rnd, tasks):
            if update.cid not in tasks or update.cid in accepted or update.cid in rejected:
                raise ValueError(
                    f"round {rnd}: an update from {update.cid!r}, which was not asked for one "
                    "or already answered"
                )
            try:
                self.validate(update, tasks[update.cid])
            except UpdateRejectedError as exc:
                rejected[update.cid] = str(exc)
            else:
                accepted[update.cid] = update
            closed_by = self.close_reason(len(accepted), len(selected), self.clock(), deadline)
            if closed_by is not None:
                break
        collect_s = time.perf_counter() - t_collect
        if closed_by is None:  # every participant answered; the rejected ones are left out
            closed_by = ALL_ANSWERED
        t_agg = time.perf_counter()
        updates = self.aggregate(rnd, selected, accepted)
        aggregate_s = time.perf_counter() - t_agg
        return RoundOutcome(
            rnd,
            selected,
            tasks,
            updates,
            rejected,
            closed_by,
            configure_s=configure_s,
            collect_s=collect_s,
            aggregate_s=aggregate_s,
        )
