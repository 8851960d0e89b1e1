"""The fleet registry alone: registration and descriptor checks, with a fake formation."""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import pytest

from fedepth.descriptor import Descriptor
from fedepth.models.card import ModelCard
from fedepth_coordinator.config import CoordinatorConfig
from fedepth_coordinator.coordstate import CoordinatorState
from fedepth_coordinator.domain import Phase
from fedepth_coordinator.errors import (
    AbortedError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    ResourceExhaustedError,
)
from fedepth_coordinator.fleet import MAX_LABELS, FleetRegistry
from fedepth_coordinator.state import MemoryStore


class FakeFormation:
    """Records what the registry tells it; ``forming`` robots are refused with ABORTED."""

    def __init__(self, state: CoordinatorState) -> None:
        self.state = state
        self.changed: list[str] = []
        self.formed = 0
        self.forming: set[str] = set()
        self.lock_free_when_forming: list[bool] = []

    def check_not_forming(self, robot_id: str) -> None:
        if robot_id in self.forming:
            raise AbortedError("forming")

    def after_fleet_change(self, robot_id: str) -> None:
        self.changed.append(robot_id)

    def form_fleet(self) -> None:
        self.formed += 1
        free: list[bool] = []

        def probe() -> None:  # another thread: the lock is reentrant for this one
            free.append(self.state.cond.acquire(blocking=False))
            if free[0]:
                self.state.cond.release()

        t = threading.Thread(target=probe)
        t.start()
        t.join()
        self.lock_free_when_forming.append(free[0])


def descriptor(dim: int = 4, mean: float = 0.0, var: float = 1.0) -> Descriptor:
    return Descriptor(mean=np.full(dim, mean), var=np.full(dim, var), num_frames=8)


@pytest.fixture
def config(config_factory: Callable[..., CoordinatorConfig]) -> CoordinatorConfig:
    return config_factory(state={"backend": "memory"})


def registry(
    config: CoordinatorConfig, *, wanted: tuple[str, ...] = (), card: str | None = None
) -> tuple[FleetRegistry, FakeFormation, CoordinatorState]:
    state = CoordinatorState(config, MemoryStore(), model_card=card)
    formation = FakeFormation(state)
    fleet = FleetRegistry(state, formation, summaries_wanted=wanted, strategy_name="pacfl")
    return fleet, formation, state


def test_register_stores_the_robot_tells_formation_and_forms_outside_the_lock(
    config: CoordinatorConfig,
) -> None:
    fleet, formation, state = registry(config)
    reg = fleet.register("r-1", "r-1", 10, {"platform": "spot"})
    assert reg.phase is Phase.WAITING_FOR_FLEET and not reg.member
    assert state.robots["r-1"].num_samples == 10 and "r-1" in state.last_seen
    assert state.store.load().robots[0].labels == {"platform": "spot"}
    assert formation.changed == ["r-1"] and formation.lock_free_when_forming == [True]
    fleet.register("r-1", "r-1", 10, {"platform": "spot"})  # the same again: no change
    assert formation.changed == ["r-1"] and formation.formed == 2


def test_register_refuses_bad_requests(config: CoordinatorConfig) -> None:
    fleet, formation, state = registry(config)
    with pytest.raises(PermissionDeniedError):
        fleet.register("r-2", "r-1", 10, {})
    with pytest.raises(InvalidArgumentError, match="must match"):
        fleet.register("bad id", "bad id", 10, {})
    with pytest.raises(InvalidArgumentError, match="num_samples must be > 0"):
        fleet.register("r-1", "r-1", 0, {})
    labels = {f"k{i}": "v" for i in range(MAX_LABELS + 1)}
    with pytest.raises(InvalidArgumentError, match="at most 16 labels"):
        fleet.register("r-1", "r-1", 10, labels)
    with pytest.raises(InvalidArgumentError, match="non-empty"):
        fleet.register("r-1", "r-1", 10, {"": "v"})
    formation.forming = {"r-1"}
    with pytest.raises(AbortedError):
        fleet.register("r-1", "r-1", 10, {})
    assert state.robots == {} and formation.formed == 0


def test_a_member_cannot_change_its_registration_or_descriptor(
    config: CoordinatorConfig,
) -> None:
    fleet, _, state = registry(config)
    fleet.register("r-1", "r-1", 10, {"a": "b"})
    fleet.upload_descriptor("r-1", "r-1", descriptor(), {})
    state.members, state.member_set = ["r-1"], {"r-1"}
    assert fleet.register("r-1", "r-1", 10, {"a": "b"}).member
    with pytest.raises(FailedPreconditionError, match="cannot change during a run"):
        fleet.register("r-1", "r-1", 11, {"a": "b"})
    fleet.upload_descriptor("r-1", "r-1", descriptor(), {})  # the same one: accepted
    with pytest.raises(FailedPreconditionError, match="already clustered"):
        fleet.upload_descriptor("r-1", "r-1", descriptor(mean=0.5), {})


def test_descriptors_are_checked_against_bounds_and_the_fleet(
    config: CoordinatorConfig, config_factory: Callable[..., CoordinatorConfig]
) -> None:
    fleet, formation, state = registry(config)
    with pytest.raises(NotFoundError):
        fleet.upload_descriptor("r-1", "r-1", descriptor(), {})
    for rid in ("r-1", "r-2"):
        fleet.register(rid, rid, 10, {})
    fleet.upload_descriptor("r-1", "r-1", descriptor(), {})
    assert state.robots["r-1"].descriptor is not None and formation.changed[-1] == "r-1"
    with pytest.raises(InvalidArgumentError, match="descriptor out of range"):
        fleet.upload_descriptor("r-2", "r-2", descriptor(var=1e-300), {})
    with pytest.raises(InvalidArgumentError, match="num_frames"):
        fleet.upload_descriptor("r-2", "r-2", Descriptor(np.zeros(4), np.ones(4), 0), {})
    state.members = ["r-1"]  # a formed fleet fixes the dimension
    with pytest.raises(InvalidArgumentError, match="the fleet's have 4"):
        fleet.upload_descriptor("r-2", "r-2", descriptor(dim=3), {})
    fleet.check_descriptor("", descriptor())  # a routed descriptor: compared with all robots
    state.config = config_factory(
        validation={"descriptor_bound": 1e300}, state={"backend": "memory"}
    )
    with pytest.raises(InvalidArgumentError, match="not finite"):
        fleet.check_descriptor("r-2", descriptor(mean=1e200))


def test_summaries_wanted_are_required_checked_and_others_dropped(
    config: CoordinatorConfig,
) -> None:
    fleet, _, state = registry(config, wanted=("pacfl_basis",))
    fleet.register("r-1", "r-1", 10, {})
    basis = np.eye(4)[:, :2]
    with pytest.raises(InvalidArgumentError, match=r"needs the summaries \['pacfl_basis'\]"):
        fleet.upload_descriptor("r-1", "r-1", descriptor(), {})
    with pytest.raises(InvalidArgumentError, match="orthonormal"):
        fleet.upload_descriptor("r-1", "r-1", descriptor(), {"pacfl_basis": 2 * basis})
    with pytest.raises(InvalidArgumentError, match="D x p basis"):
        fleet.upload_descriptor("r-1", "r-1", descriptor(), {"pacfl_basis": np.eye(3)})
    with pytest.raises(InvalidArgumentError, match="NaN or Inf"):
        fleet.upload_descriptor("r-1", "r-1", descriptor(), {"pacfl_basis": basis * np.nan})
    big = {"pacfl_basis": basis, "other": np.zeros(1 << 18)}
    with pytest.raises(ResourceExhaustedError, match="max_summary_bytes"):
        fleet.upload_descriptor("r-1", "r-1", descriptor(), big)
    fleet.upload_descriptor("r-1", "r-1", descriptor(), {"pacfl_basis": basis, "x": basis})
    assert list(state.robots["r-1"].summaries) == ["pacfl_basis"]


def test_a_declared_model_card_must_match_the_served_one(config: CoordinatorConfig) -> None:
    card = ModelCard(model="regression-lite", min_depth=0.001, max_depth=10.0, input_size=(48, 64))
    other = ModelCard(
        model="regression-lite", min_depth=0.001, max_depth=80.0, input_size=(48, 64)
    )
    fleet, _, _ = registry(config, card=card.to_json())
    fleet.register("r-1", "r-1", 10, {}, model_card=card.to_json())
    with pytest.raises(FailedPreconditionError, match="max_depth"):
        fleet.register("r-1", "r-1", 10, {}, model_card=other.to_json())
    with pytest.raises(InvalidArgumentError):
        fleet.register("r-1", "r-1", 10, {}, model_card="{not json")
    cardless, _, _ = registry(config)
    with pytest.raises(FailedPreconditionError, match="without a card"):
        cardless.register("r-1", "r-1", 10, {}, model_card=card.to_json())
