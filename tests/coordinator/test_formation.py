"""Formation alone (with the real checkpoints and round controller on a memory store)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from fedepth.strategies import Strategy, create_strategy
from fedepth_coordinator.checkpoints import Checkpoints
from fedepth_coordinator.config import CoordinatorConfig
from fedepth_coordinator.coordstate import CoordinatorState
from fedepth_coordinator.errors import AbortedError, FailedPreconditionError
from fedepth_coordinator.formation import Formation
from fedepth_coordinator.rounds import RoundController
from fedepth_coordinator.server import synthetic_model
from fedepth_coordinator.simulate import robot_ids, robot_profile
from fedepth_coordinator.state import MemoryStore
from fedepth_coordinator.state.base import RobotRecord
from fedepth_coordinator.transfers import TransferSlots

INITIAL = synthetic_model(2, 0.001)


def make(
    config_factory: Callable[..., CoordinatorConfig],
    factory: Callable[[], Strategy] | None = None,
) -> tuple[Formation, CoordinatorState]:
    config = config_factory(rounds={"min_robots": 3}, state={"backend": "memory"})
    state = CoordinatorState(
        config,
        MemoryStore(),
        strategy_factory=factory,
        initial=dict(INITIAL),
        model_order=list(INITIAL),
    )
    checkpoints = Checkpoints(state)
    rounds = RoundController(state, checkpoints, TransferSlots(state))
    return Formation(state, checkpoints, rounds), state


def ready(state: CoordinatorState, *ids: str) -> None:
    for rid in ids:
        p = robot_profile(rid)
        state.robots[rid] = RobotRecord(rid, p.num_samples, p.labels, p.descriptor)


def test_the_fleet_forms_at_min_robots_sorted_and_round_0_opens(
    config_factory: Callable[..., CoordinatorConfig],
) -> None:
    formation, state = make(config_factory)
    ids = robot_ids(4)
    ready(state, ids[2], ids[0])
    formation.form_fleet()
    assert state.strategy is None and state.store.load().run is None
    ready(state, ids[1])
    formation.form_fleet()
    assert state.members == ids[:3] and state.num_initial == 3 and state.initial is None
    assert state.open_round is not None and state.open_round.record.selected == tuple(ids[:3])
    run = state.store.load().run
    assert run is not None and run.checkpoint == state.checkpoint and run.initial_blob == "initial"
    assert state.forming is None
    # a robot ready later joins the running fleet, with a new checkpoint replacing the old
    old = state.checkpoint
    assert old is not None
    ready(state, ids[3])
    with state.cond:
        formation.after_fleet_change(ids[3])
    assert state.members == ids and state.checkpoint != old
    assert old.blob not in state.store.blob_keys()
    snap = state.store.load()
    assert snap.run is not None and snap.run.checkpoint.members == tuple(ids)


def test_robots_being_formed_with_cannot_change(
    config_factory: Callable[..., CoordinatorConfig],
) -> None:
    formation, state = make(config_factory)
    state.forming = {"robot-000"}
    with pytest.raises(AbortedError, match="retry shortly"):
        formation.check_not_forming("robot-000")
    formation.check_not_forming("robot-001")
    state.forming = None
    formation.check_not_forming("robot-000")


def test_a_fleet_that_cannot_be_formed_leaves_no_run(
    config_factory: Callable[..., CoordinatorConfig],
) -> None:
    class Refusing(type(create_strategy("fedavg"))):  # type: ignore[misc]
        def initialize(self, *args: object) -> None:
            raise ValueError("no")

    formation, state = make(config_factory, Refusing)
    ready(state, *robot_ids(3))
    with pytest.raises(FailedPreconditionError, match="the fleet of 3 robots could not be formed"):
        formation.form_fleet()
    assert state.strategy is None and state.forming is None and state.members == []
    assert state.store.load().run is None


def test_a_strategy_refusing_late_robots_refuses_them_at_join(
    config_factory: Callable[..., CoordinatorConfig],
) -> None:
    class Closed(type(create_strategy("fedavg"))):  # type: ignore[misc]
        def add_client(self, info: object) -> None:
            raise NotImplementedError("closed fleet")

    formation, state = make(config_factory, Closed)
    ids = robot_ids(4)
    ready(state, *ids[:3])
    formation.form_fleet()
    ready(state, ids[3])
    with state.cond, pytest.raises(FailedPreconditionError, match="does not accept robots"):
        formation.after_fleet_change(ids[3])
    assert state.members == ids[:3]
