"""The served model and its card: fresh, from a weights file, synthetic; carried in the header."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

from fedepth.descriptor import Descriptor
from fedepth.models import ModelCard, card_of, create_model, get_state, save_state, save_weights
from fedepth.strategies import ClientUpdate, TrainTask
from fedepth_coordinator import serde
from fedepth_coordinator.client import CoordinatorCallError, CoordinatorClient, DownloadedModel
from fedepth_coordinator.config import ConfigError, CoordinatorConfig, ModelConfig
from fedepth_coordinator.domain import (
    DescriptorAck,
    ModelHeader,
    Phase,
    PlanAction,
    Registration,
    RoundPlan,
)
from fedepth_coordinator.robot import ModelChangedError, RobotLoop, RobotProfile, run_robot
from fedepth_coordinator.server import initial_model, running
from fedepth_coordinator.simulate import SimulatedFleet, robot_ids
from fedepth_coordinator.tensors import Layout


def test_a_fresh_named_model_is_seeded_and_carries_its_card() -> None:
    cfg = ModelConfig(name="regression-lite", max_depth=80.0, seed=3, pretrain="none")
    a, b = initial_model(cfg, (64, 96)), initial_model(cfg, (64, 96))
    assert a.card is not None and a.card.model == "regression-lite"
    assert a.card.max_depth == 80.0 and a.card.input_size == (64, 96)
    assert "FRESH" in a.source
    assert all(np.array_equal(a.state[k], b.state[k]) for k in a.state)
    assert a.state.keys() == get_state(create_model("regression-lite")).keys()


def test_weights_file_card_is_served_and_checked(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    save_weights(create_model("regression-lite", max_depth=20.0), path, input_size=(48, 64))
    got = initial_model(ModelConfig(initial_weights=str(path)))
    assert got.card is not None and got.card.max_depth == 20.0
    served = initial_model(ModelConfig(name="newcrfs-lite", initial_weights=str(path)))
    assert served.card == got.card  # the card wins over model.name
    old = tmp_path / "old.safetensors"  # no card: must fit model.name, which gives the card
    save_state(old, get_state(create_model("regression-lite")))
    assert initial_model(ModelConfig(name=None, initial_weights=str(old))).card is None
    named = initial_model(ModelConfig(name="regression-lite", initial_weights=str(old)))
    assert named.card is not None and named.card.model == "regression-lite"
    with pytest.raises(ValueError, match=r"old\.safetensors.*no model card.*newcrfs-lite"):
        initial_model(ModelConfig(name="newcrfs-lite", initial_weights=str(old)))


def test_synthetic_model_has_no_card_and_unknown_names_fail() -> None:
    got = initial_model(ModelConfig(name=None))
    assert got.card is None and "SYNTHETIC" in got.source
    with pytest.raises(ConfigError, match=r"model\.name.*nosuchnet"):
        CoordinatorConfig(model=ModelConfig(name="nosuchnet"))


def test_card_survives_the_download_header() -> None:
    card = ModelCard(model="newcrfs-lite", max_depth=80.0, input_size=(64, 96)).to_json()
    layout = Layout.of({"state": {"w": np.zeros(3, np.float32)}})
    header = ModelHeader(1, layout, card=card)
    msg = type(serde.model_header_to_pb(header)).FromString(
        serde.model_header_to_pb(header).SerializeToString()
    )
    assert serde.model_header_from_pb(msg) == header
    assert (
        serde.model_header_from_pb(serde.model_header_to_pb(ModelHeader(0, layout))).card is None
    )


def test_robots_download_the_card_of_a_served_network(
    config_factory: Callable[..., CoordinatorConfig],
    creds: Any,
    connect: Callable[..., CoordinatorClient],
) -> None:
    config = config_factory(
        model={"name": "regression-lite", "max_depth": 40.0},
        rounds={"num_rounds": 1, "min_robots": 4},
    )
    robots = robot_ids(4)
    with running(config) as server:
        fleet = SimulatedFleet(f"127.0.0.1:{server.port}", creds.tokens, poll_s=1.0)
        fleet.start_all(robots)
        assert fleet.join(timeout_s=120), "robots did not finish"
        assert not fleet.errors
        got = connect(server.port, robots[0]).download_model(latest=True)
    assert got.card is not None and got.card.model == "regression-lite"
    assert got.card.max_depth == 40.0
    assert got.card.input_size == tuple(config.training.image_size)
    model = got.card.build()
    assert set(got.task.state) == set(get_state(model))


def test_register_refuses_a_robot_whose_model_cannot_take_the_served_weights(
    config_factory: Callable[..., CoordinatorConfig],
    connect: Callable[..., CoordinatorClient],
) -> None:
    config = config_factory(model={"name": "regression-lite", "max_depth": 40.0})
    served = card_of(create_model("regression-lite", max_depth=40.0))
    other_net = card_of(create_model("newcrfs-lite", max_depth=40.0))
    other_range = card_of(create_model("regression-lite", max_depth=10.0))
    with running(config) as server:
        robot = connect(server.port, "robot-000")
        for declared, differs in ((other_net, "model"), (other_range, "max_depth")):
            with pytest.raises(CoordinatorCallError) as info:
                robot.register(10, model_card=declared.to_json())
            assert info.value.code is grpc.StatusCode.FAILED_PRECONDITION
            # one message naming both sides and what differs
            assert declared.describe() in info.value.details
            assert "serves regression-lite {" in info.value.details
            assert "depth 0.001-40 m" in info.value.details
            assert f"differs in {differs}" in info.value.details
        assert connect(server.port, "ops").fleet_status().robots == ()  # nothing recorded
        # the same model is taken, and no card at all means "whatever is served"
        reg = robot.register(10, model_card=served.to_json())
        assert reg.model_card is not None
        assert ModelCard.from_json(reg.model_card).differences(served) == []
        other = connect(server.port, "robot-001").register(10)
        assert other.model_card == reg.model_card
        status = connect(server.port, "ops").fleet_status()
        assert {r.robot_id for r in status.robots} == {"robot-000", "robot-001"}
        assert status.model_card == reg.model_card
        with pytest.raises(CoordinatorCallError) as bad:
            robot.register(10, model_card="{not json")
        assert bad.value.code is grpc.StatusCode.INVALID_ARGUMENT


def test_register_refuses_a_declared_model_when_only_a_synthetic_one_is_served(
    server: Any, connect: Callable[..., CoordinatorClient]
) -> None:
    robot = connect(server.port, "robot-000")
    card = card_of(create_model("regression-lite"))
    with pytest.raises(CoordinatorCallError) as info:
        robot.register(10, model_card=card.to_json())
    assert info.value.code is grpc.StatusCode.FAILED_PRECONDITION
    assert "without a card" in info.value.details and card.describe() in info.value.details
    assert robot.register(10).model_card is None


class _UncheckedCoordinator:
    """A coordinator that does not check cards at Register (an older one), and serves
    ``served`` with every round's task: the robot's own per-round check must catch it."""

    robot_id = "robot-000"

    def __init__(self, served: ModelCard | None) -> None:
        self.served = served

    def register(self, *_: Any, **__: Any) -> Registration:
        return Registration(Phase.TRAINING, True)

    def upload_descriptor(self, *_: Any) -> DescriptorAck:
        return DescriptorAck(Phase.TRAINING, True)

    def round_plan(self, after_round: int, wait_s: float = 0.0) -> RoundPlan:
        return RoundPlan(PlanAction.TRAIN, Phase.TRAINING, after_round + 1, 2)

    def download_model(self, rnd: int) -> DownloadedModel:
        return DownloadedModel(rnd, TrainTask(state={}), self.served)


@pytest.mark.parametrize("served", ["other depth range", "no card"])
def test_a_robot_refuses_a_round_whose_model_is_not_the_one_it_joined_with(served: str) -> None:
    mine = ModelCard(model="regression-lite", max_depth=80.0)
    other = None if served == "no card" else ModelCard(model="regression-lite", max_depth=10.0)
    trained: list[int] = []

    def train(rnd: int, task: TrainTask) -> ClientUpdate:
        trained.append(rnd)
        raise AssertionError("trained on a model it cannot take")

    profile = RobotProfile(
        num_samples=4,
        descriptor=Descriptor(np.zeros(8), np.ones(8), 4),
        model_card=mine.to_json(),
    )
    client: Any = _UncheckedCoordinator(other)
    with pytest.raises(ModelChangedError) as err:
        run_robot(client, profile, train, poll_s=0.0)
    assert trained == []
    assert "round 0: the coordinator now serves" in str(err.value)
    assert mine.describe() in str(err.value)
    if other is not None:
        assert other.describe() in str(err.value) and "max_depth" in str(err.value)
    # the same card passes: the check does not refuse the model the robot joined with
    same: Any = _UncheckedCoordinator(mine)
    RobotLoop(same, profile, train)._check_card(0, ModelCard.from_json(mine.to_json()))
