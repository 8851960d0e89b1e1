"""A third of the robots vanish mid-round: quorum closes the rounds at the deadline, the run goes
on, and the robots that come back are served."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fedepth.strategies import ClientUpdate, TrainTask
from fedepth_coordinator.client import CoordinatorClient
from fedepth_coordinator.config import CoordinatorConfig
from fedepth_coordinator.domain import PlanAction
from fedepth_coordinator.robot import TrainFn
from fedepth_coordinator.server import running
from fedepth_coordinator.simulate import (
    SimulatedFleet,
    deterministic_train,
    robot_ids,
    robot_profile,
)


class VanishedError(Exception):
    """The robot lost power with its model downloaded."""


def vanishing_at(rnd_gone: int, robot_id: str, num_samples: int) -> TrainFn:
    train = deterministic_train(robot_id, num_samples)

    def fn(rnd: int, task: TrainTask) -> ClientUpdate:
        if rnd == rnd_gone:
            raise VanishedError(robot_id)
        return train(rnd, task)

    return fn


def test_dropouts_close_on_quorum_and_returning_robots_are_served(
    config_factory: Callable[..., CoordinatorConfig],
    creds: Any,
    connect: Callable[..., CoordinatorClient],
) -> None:
    robots = robot_ids(6)
    gone = robots[4:]  # a third
    config = config_factory(
        rounds={"num_rounds": 4, "min_robots": 6, "quorum": 0.6, "deadline_s": 1.5}
    )
    with running(config) as server:
        target = f"127.0.0.1:{server.port}"

        def train_for(rid: str, n: int) -> TrainFn:
            return vanishing_at(1, rid, n) if rid in gone else deterministic_train(rid, n)

        fleet = SimulatedFleet(target, creds.tokens, poll_s=1.0, train_for=train_for)
        fleet.start_all(robots)
        # the vanished robots come back once round 3 is open
        watcher = connect(server.port, gone[0])
        watcher.register(robot_profile(gone[0]).num_samples, robot_profile(gone[0]).labels)
        plan = watcher.wait_for_round(after_round=2, timeout_s=30)
        assert plan.action is PlanAction.TRAIN and plan.round == 3
        assert set(fleet.errors) == set(gone)
        assert all(isinstance(e, VanishedError) for e in fleet.errors.values())
        returned = SimulatedFleet(target, creds.tokens, poll_s=1.0)
        returned.start_all(gone)
        assert fleet.join(timeout_s=30) and returned.join(timeout_s=30)
        assert not returned.errors

        history = server.coordinator.fleet_status().history
        assert [h.closed_by for h in history] == [
            "all reported",
            "quorum at deadline",
            "quorum at deadline",
            "all reported",
        ]
        assert [h.accepted for h in history] == [6, 4, 4, 6]
        assert all(h.duration_s >= 1.5 for h in history[1:3])
        for rid in gone:
            assert fleet.reports[rid].rounds == [0]
            assert returned.reports[rid].rounds == [3] and returned.reports[rid].finished
        for rid in robots[:4]:
            assert fleet.reports[rid].rounds == [0, 1, 2, 3]
