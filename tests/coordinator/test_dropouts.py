"""A third of the robots vanish mid-round: quorum closes the rounds at the deadline, the run goes
on, and the robots that come back are served. The coordinator's clock is driven by the test, so
deadlines pass exactly when the test says, whatever the machine's load."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from fedepth.strategies import ClientUpdate, TrainTask
from fedepth_coordinator.config import CoordinatorConfig
from fedepth_coordinator.robot import TrainFn
from fedepth_coordinator.server import CoordinatorServer, running
from fedepth_coordinator.simulate import SimulatedFleet, deterministic_train, robot_ids

DEADLINE_S = 60.0


class VanishedError(Exception):
    """The robot lost power with its model downloaded."""


class Clock:
    """Wall time plus whatever the test adds."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset


def vanishing_at(rnd_gone: int, robot_id: str, num_samples: int) -> TrainFn:
    train = deterministic_train(robot_id, num_samples)

    def fn(rnd: int, task: TrainTask) -> ClientUpdate:
        if rnd == rnd_gone:
            raise VanishedError(robot_id)
        return train(rnd, task)

    return fn


def wait_for_reports(server: CoordinatorServer, rnd: int, count: int) -> None:
    pause = threading.Event()
    end = time.monotonic() + 60
    while True:
        status = server.coordinator.fleet_status()
        if status.round == rnd and sum(r.reported for r in status.robots) == count:
            return
        assert time.monotonic() < end, f"round {rnd} never got {count} reports"
        pause.wait(0.05)


def test_dropouts_close_on_quorum_and_returning_robots_are_served(
    config_factory: Callable[..., CoordinatorConfig], creds: Any
) -> None:
    robots = robot_ids(6)
    gone = robots[4:]  # a third
    config = config_factory(
        rounds={"num_rounds": 4, "min_robots": 6, "quorum": 0.6, "deadline_s": DEADLINE_S}
    )
    clock = Clock()
    with running(config, clock=clock) as server:
        target = f"127.0.0.1:{server.port}"

        def train_for(rid: str, n: int) -> TrainFn:
            return vanishing_at(1, rid, n) if rid in gone else deterministic_train(rid, n)

        fleet = SimulatedFleet(target, creds.tokens, poll_s=1.0, train_for=train_for)
        fleet.start_all(robots)
        for rnd in (1, 2):  # the others report; the deadline passes; quorum closes the round
            wait_for_reports(server, rnd, 4)
            assert fleet.join_some(gone, timeout_s=60), "the vanishing robots did not vanish"
            clock.offset += DEADLINE_S
            server.coordinator.tick()
        assert server.coordinator.fleet_status().round == 3
        assert set(fleet.errors) == set(gone)
        assert all(isinstance(e, VanishedError) for e in fleet.errors.values())
        returned = SimulatedFleet(target, creds.tokens, poll_s=1.0)
        returned.start_all(gone)  # they come back during round 3
        assert fleet.join(timeout_s=60) and returned.join(timeout_s=60)
        assert not returned.errors

        history = server.coordinator.fleet_status().history
        assert [h.closed_by for h in history] == [
            "all reported",
            "quorum at deadline",
            "quorum at deadline",
            "all reported",
        ]
        assert [h.accepted for h in history] == [6, 4, 4, 6]
        for rid in gone:
            assert fleet.reports[rid].rounds == [0]
            assert returned.reports[rid].rounds == [3] and returned.reports[rid].finished
        for rid in robots[:4]:
            assert fleet.reports[rid].rounds == [0, 1, 2, 3]
