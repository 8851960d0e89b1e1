"""The shared coordinator state alone: its queries over a hand-filled fleet."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from fedepth.descriptor import Descriptor
from fedepth.strategies import create_strategy
from fedepth_coordinator.config import CoordinatorConfig
from fedepth_coordinator.coordstate import CoordinatorState, check_caller, client_info
from fedepth_coordinator.domain import Phase
from fedepth_coordinator.errors import (
    FailedPreconditionError,
    NotFoundError,
    PermissionDeniedError,
)
from fedepth_coordinator.state import MemoryStore
from fedepth_coordinator.state.base import RobotRecord


def descriptor(dim: int, shift: float = 0.0) -> Descriptor:
    return Descriptor(mean=np.full(dim, shift), var=np.ones(dim), num_frames=4)


def state_with(config: CoordinatorConfig, dims: dict[str, int | None]) -> CoordinatorState:
    s = CoordinatorState(config, MemoryStore())
    for rid, dim in dims.items():
        d = None if dim is None else descriptor(dim)
        s.robots[rid] = RobotRecord(rid, 10, {"k": "v"}, descriptor=d)
    return s


@pytest.fixture
def config(config_factory: Callable[..., CoordinatorConfig]) -> CoordinatorConfig:
    return config_factory(rounds={"min_robots": 3, "quorum": 0.5}, state={"backend": "memory"})


def test_ready_robots_are_those_of_the_majority_dimension_sorted(
    config: CoordinatorConfig,
) -> None:
    s = state_with(config, {"r-3": 8, "r-1": 8, "r-2": 4, "r-0": None, "r-4": 8})
    assert s.expected_dim() is None  # no members, nothing configured
    assert s.ready() == ["r-1", "r-3", "r-4"]
    tie = state_with(config, {"a": 8, "b": 4})
    assert tie.ready() == ["b"]  # a tie goes to the smaller dimension, not the first sender


def test_the_members_fix_the_dimension_once_the_fleet_formed(
    config: CoordinatorConfig, config_factory: Callable[..., CoordinatorConfig]
) -> None:
    s = state_with(config, {"a": 4, "b": 8, "c": 8})
    s.members = ["a"]
    assert s.expected_dim() == 4 and s.ready() == ["a"]
    fixed = config_factory(validation={"descriptor_dim": 8}, state={"backend": "memory"})
    s.config = fixed
    assert s.expected_dim() == 8 and s.ready() == ["b", "c"]


def test_phase_strategy_and_robot_lookups(config: CoordinatorConfig) -> None:
    s = state_with(config, {"a": 8})
    assert s.phase is Phase.WAITING_FOR_FLEET and s.describe_clusters() == "no clusters"
    with pytest.raises(FailedPreconditionError, match=r"\(1/3 robots registered"):
        s.require_strategy()
    s.strategy = create_strategy("fedavg")
    assert s.require_strategy() is s.strategy and s.phase is Phase.TRAINING
    s.finished = True
    assert s.phase is Phase.FINISHED
    assert s.robot("a").robot_id == "a"
    with pytest.raises(NotFoundError, match="call Register first"):
        s.robot("nobody")
    s.touch("a")
    assert "a" in s.last_seen
    assert s.clusters_of("a") == ()  # not a member


def test_quorum_rounds_up_and_is_at_least_one(config: CoordinatorConfig) -> None:
    s = CoordinatorState(config, MemoryStore())
    assert [s.quorum(n) for n in (0, 1, 2, 3, 4)] == [1, 1, 1, 2, 2]


def test_clusters_of_a_member_of_a_clustered_strategy(config: CoordinatorConfig) -> None:
    s = state_with(config, {"a": 2, "b": 2, "c": 2})
    for rid, shift in (("a", 0.0), ("b", 0.0), ("c", 50.0)):
        s.robots[rid] = RobotRecord(rid, 10, {}, descriptor=descriptor(2, shift))
    strategy = create_strategy("fedepth", tau=1.0)
    strategy.initialize([client_info(s.robots[r]) for r in "abc"], {"w": np.zeros(2)})
    s.strategy, s.members, s.member_set = strategy, list("abc"), set("abc")
    assert s.clusters_of("a") == s.clusters_of("b") != s.clusters_of("c")
    assert s.describe_clusters() == "2 clusters, overlap 0%"


def test_a_caller_acts_in_its_own_name_only() -> None:
    check_caller("r-1", "r-1")
    with pytest.raises(PermissionDeniedError, match="in its own name"):
        check_caller("r-1", "r-2")
