"""Which robot processes run when: at most ``max_robots`` alive, started while the
coordinator waits for them, stopped only to make room (:class:`Scheduler`)."""

from __future__ import annotations

from collections.abc import Sequence

from fedepth_coordinator.domain import FleetStatus, Phase


class Scheduler:
    """At most ``max_robots`` robot processes alive; which robots run when.

    A robot has work while the coordinator still needs something from it: before the fleet
    forms, its registration and descriptor; in an open round that selected it, its update.
    Every poll, robots with work that are not running are started (in fleet order) while a
    slot is free; when none is free, a running robot without work (enrolled, or reported for
    the open round) is stopped to free one. A robot keeps running as long as no one waits for
    its slot, so with ``max_robots`` >= the fleet no robot ever restarts, and otherwise the
    robots still running when a round closes are the first of the next round: each round
    restarts ``fleet - max_robots`` robots. A restarted robot replays its bag again and
    re-joins with the same sample count and descriptor (idempotent at the coordinator).
    """

    def __init__(self, order: Sequence[str], max_robots: int) -> None:
        self.order = list(order)
        self.max_robots = max_robots

    def decide(
        self, work: set[str], running: Sequence[str], excluded: set[str]
    ) -> tuple[list[str], list[str]]:
        """(robots to start, robots to stop) now."""
        waiting = [r for r in self.order if r in work and r not in running and r not in excluded]
        idle = [r for r in running if r not in work]
        free = max(0, self.max_robots - len(running))
        stop = idle[: max(0, len(waiting) - free)]
        return waiting[: free + len(stop)], stop


def robots_with_work(status: FleetStatus) -> set[str]:
    """The robots the coordinator waits for now (see :class:`Scheduler`)."""
    if status.phase is Phase.FINISHED:
        return set()
    if status.phase is Phase.WAITING_FOR_FLEET:
        return {r.robot_id for r in status.robots if not r.has_descriptor} | {"*enrol*"}
    return {r.robot_id for r in status.robots if r.selected and not r.reported}
