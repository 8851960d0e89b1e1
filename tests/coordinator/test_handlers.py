"""The round logic without gRPC: handlers on an in-memory store with a fake clock."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from fedepth.descriptor import Descriptor
from fedepth.strategies import TrainTask
from fedepth_coordinator.config import CoordinatorConfig
from fedepth_coordinator.domain import Phase, PlanAction, UpdateHeader
from fedepth_coordinator.errors import (
    AlreadyExistsError,
    FailedPreconditionError,
    NotFoundError,
    PermissionDeniedError,
)
from fedepth_coordinator.handlers import Coordinator
from fedepth_coordinator.server import synthetic_model
from fedepth_coordinator.simulate import (
    deterministic_train,
    reference_run,
    robot_ids,
    robot_profile,
)
from fedepth_coordinator.state import MemoryStore
from fedepth_coordinator.tensors import Layout, assemble, iter_chunks


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def cfg(config_factory: Callable[..., CoordinatorConfig]) -> Callable[..., CoordinatorConfig]:
    def factory(**rounds: object) -> CoordinatorConfig:
        return config_factory(
            rounds={"num_rounds": 3, "min_robots": 4, "deadline_s": 60.0, "quorum": 0.5, **rounds},
            state={"backend": "memory"},
        )

    return factory


INITIAL = synthetic_model(2, 0.001)
ROBOTS = robot_ids(5)


def join(c: Coordinator, rid: str) -> None:
    p = robot_profile(rid)
    c.register(rid, rid, p.num_samples, p.labels)
    c.upload_descriptor(rid, rid, p.descriptor, {})


def train_and_upload(c: Coordinator, rid: str, rnd: int) -> None:
    stream = c.download(rid, rid, rnd, latest=False)
    task_state = assemble(stream.header.layout, stream.payload.chunks())["state"]
    update = deterministic_train(rid, robot_profile(rid).num_samples)(rnd, TrainTask(task_state))
    header_layout = Layout.of({"state": update.state})
    header = UpdateHeader(rid, rnd, update.num_samples, header_layout, num_steps=1)
    c.upload(rid, header, iter_chunks([update.state], 100))


def test_fleet_forms_at_min_robots_and_rounds_close_when_all_report(
    cfg: Callable[..., CoordinatorConfig],
) -> None:
    c = Coordinator(cfg(), MemoryStore(), INITIAL, clock=Clock())
    for rid in ROBOTS[:3]:
        join(c, rid)
        plan = c.round_plan(rid, rid, -1, 0.0)
        assert (
            plan.action is PlanAction.WAIT and "robots registered with a descriptor" in plan.reason
        )
    assert c.phase is Phase.WAITING_FOR_FLEET
    join(c, ROBOTS[3])
    assert c.phase is Phase.TRAINING
    for rnd in range(3):
        for rid in ROBOTS[:4]:
            plan = c.round_plan(rid, rid, rnd - 1, 0.0)
            assert plan.action is PlanAction.TRAIN and plan.round == rnd and plan.model_bytes > 0
            train_and_upload(c, rid, rnd)
    assert c.phase is Phase.FINISHED
    assert c.round_plan(ROBOTS[0], ROBOTS[0], 2, 0.0).action is PlanAction.FINISHED
    expected = reference_run("fedepth", {"overlap": 0.3}, INITIAL, ROBOTS[:4], 3)
    for rid, state in c.final_states().items():
        for name in INITIAL:
            np.testing.assert_array_equal(state[name], expected[rid][name])
    assert [h.closed_by for h in c.fleet_status().history] == ["all reported"] * 3


def test_deadline_closes_on_quorum_only(cfg: Callable[..., CoordinatorConfig]) -> None:
    clock = Clock()
    c = Coordinator(cfg(quorum=0.75), MemoryStore(), INITIAL, clock=clock)
    for rid in ROBOTS[:4]:
        join(c, rid)
    train_and_upload(c, ROBOTS[0], 0)
    train_and_upload(c, ROBOTS[1], 0)
    clock.now += 61
    assert c.tick() == 0.0  # past the deadline but 2 < quorum 3: still open
    assert c.fleet_status().round == 0
    train_and_upload(c, ROBOTS[2], 0)  # the quorum-th upload after the deadline closes it
    status = c.fleet_status()
    assert status.round == 1 and status.history[0].closed_by == "quorum at deadline"
    assert status.history[0].accepted == 3
    with pytest.raises(FailedPreconditionError, match="round 0 is closed; the open round is 1"):
        train_and_upload(c, ROBOTS[3], 0)
    train_and_upload(c, ROBOTS[3], 1)
    with pytest.raises(AlreadyExistsError, match="already uploaded"):
        train_and_upload(c, ROBOTS[3], 1)
    train_and_upload(c, ROBOTS[0], 1)
    train_and_upload(c, ROBOTS[1], 1)
    assert c.fleet_status().round == 1  # quorum before the deadline: the round stays open
    assert c.tick() == pytest.approx(60.0)
    clock.now += 61
    assert c.tick() is not None  # the deadline ticker closes it
    assert c.fleet_status().round == 2


def test_late_robot_is_placed_by_routing_and_trains_next_round(
    cfg: Callable[..., CoordinatorConfig],
) -> None:
    c = Coordinator(cfg(), MemoryStore(), INITIAL, clock=Clock())
    for rid in ROBOTS[:4]:
        join(c, rid)
    late = ROBOTS[4]
    c.register(late, late, 20, {})
    ack = c.upload_descriptor(late, late, robot_profile(late).descriptor, {})
    assert ack.member and ack.clusters
    assert c.round_plan(late, late, -1, 0.0).reason == "not selected for round 0"
    members = {m for cl in c.cluster_map().clusters for m in cl}
    assert late in members
    for rid in ROBOTS[:4]:
        train_and_upload(c, rid, 0)
    assert c.round_plan(late, late, -1, 0.0).action is PlanAction.TRAIN


def test_registration_data_is_fixed_once_a_member(cfg: Callable[..., CoordinatorConfig]) -> None:
    c = Coordinator(cfg(), MemoryStore(), INITIAL, clock=Clock())
    for rid in ROBOTS[:4]:
        join(c, rid)
    rid = ROBOTS[0]
    join(c, rid)  # rejoining with the same data is fine
    p = robot_profile(rid)
    with pytest.raises(FailedPreconditionError, match="cannot change during a run"):
        c.register(rid, rid, p.num_samples + 1, p.labels)
    other = Descriptor(p.descriptor.mean + 1, p.descriptor.var, 32)
    with pytest.raises(FailedPreconditionError, match="already clustered"):
        c.upload_descriptor(rid, rid, other, {})
    with pytest.raises(PermissionDeniedError, match="may not act as robot"):
        c.register(ROBOTS[1], rid, 10, {})
    with pytest.raises(NotFoundError, match="call Register first"):
        c.round_plan("robot-999", "robot-999", -1, 0.0)


def test_fraction_selects_a_seeded_subset(cfg: Callable[..., CoordinatorConfig]) -> None:
    picks = []
    for _ in range(2):
        c = Coordinator(cfg(fraction=0.5), MemoryStore(), INITIAL, clock=Clock())
        for rid in ROBOTS[:4]:
            join(c, rid)
        picks.append([r.robot_id for r in c.fleet_status().robots if r.selected])
    assert len(picks[0]) == 2 and picks[0] == picks[1]


def test_a_restarted_coordinator_resumes_the_open_round(
    cfg: Callable[..., CoordinatorConfig],
) -> None:
    store = MemoryStore()
    c = Coordinator(cfg(), store, INITIAL, clock=Clock())
    for rid in ROBOTS[:4]:
        join(c, rid)
    for rid in ROBOTS[:4]:
        train_and_upload(c, rid, 0)
    train_and_upload(c, ROBOTS[0], 1)
    train_and_upload(c, ROBOTS[1], 1)
    restarted = Coordinator(cfg(), store, synthetic_model(2, 0.001, seed=9), clock=Clock())
    status = restarted.fleet_status()
    assert status.round == 1 and [r.reported for r in status.robots[:4]] == [
        True,
        True,
        False,
        False,
    ]
    with pytest.raises(AlreadyExistsError):
        train_and_upload(restarted, ROBOTS[0], 1)
    for rid in ROBOTS[2:4]:
        train_and_upload(restarted, rid, 1)
    for rid in ROBOTS[:4]:
        train_and_upload(restarted, rid, 2)
    expected = reference_run("fedepth", {"overlap": 0.3}, INITIAL, ROBOTS[:4], 3)
    for rid, state in restarted.final_states().items():
        for name in INITIAL:
            np.testing.assert_array_equal(state[name], expected[rid][name])
    assert store.blob_keys() == sorted(["initial", restarted._checkpoint.blob])  # type: ignore[union-attr]
