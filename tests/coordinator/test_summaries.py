"""The coordinator asks for the data summaries its strategy needs, requires them, and keeps no
others (what real robot_nodes send in a full run: tests/ros/test_privacy.py)."""

from __future__ import annotations

from collections.abc import Callable

import grpc
import numpy as np
import pytest

from fedepth.clustering import subspace_basis
from fedepth.descriptor import Descriptor
from fedepth.strategies import create_strategy
from fedepth_coordinator.client import CoordinatorCallError, CoordinatorClient
from fedepth_coordinator.config import CoordinatorConfig
from fedepth_coordinator.server import running

DIM = 8


def _descriptor() -> Descriptor:
    return Descriptor(mean=np.zeros(DIM), var=np.ones(DIM), num_frames=4)


def _basis() -> np.ndarray:
    return subspace_basis(np.random.default_rng(0).normal(size=(DIM, 12)), 3)


@pytest.mark.parametrize(
    ("name", "params", "wanted"),
    [
        ("fedepth", {}, ()),
        ("fedavg", {}, ()),
        ("hard", {}, ()),
        ("pacfl", {}, ("pacfl_basis",)),
        # tau chosen to reproduce PACFL's partition (the paper's BMR rule) needs the bases too
        ("fedepth", {"match": "pacfl"}, ("pacfl_basis",)),
        ("hard", {"match": "pacfl"}, ("pacfl_basis",)),
    ],
)
def test_register_reply_names_the_summaries_the_strategy_needs(
    name: str,
    params: dict[str, str],
    wanted: tuple[str, ...],
    config_factory: Callable[..., CoordinatorConfig],
    connect: Callable[..., CoordinatorClient],
) -> None:
    assert create_strategy(name, **params).client_summaries == wanted
    with running(config_factory(strategy={"name": name, "params": params})) as server:
        reg = connect(server.port, "robot-000").register(10, {})
    assert reg.summaries == wanted


def test_a_summary_the_strategy_did_not_ask_for_is_not_kept(
    config_factory: Callable[..., CoordinatorConfig],
    connect: Callable[..., CoordinatorClient],
) -> None:
    with running(config_factory()) as server:  # fedepth: the descriptor is all it uses
        robot = connect(server.port, "robot-000")
        robot.register(10, {})
        robot.upload_descriptor(_descriptor(), {"pacfl_basis": _basis()})
        (record,) = server.store.load().robots
    assert record.descriptor is not None and dict(record.summaries) == {}


def test_pacfl_refuses_a_descriptor_without_its_basis_and_serves_the_next_robot(
    config_factory: Callable[..., CoordinatorConfig],
    connect: Callable[..., CoordinatorClient],
) -> None:
    config = config_factory(strategy={"name": "pacfl", "params": {}})
    with running(config) as server:
        robot = connect(server.port, "robot-000")
        robot.register(10, {})
        with pytest.raises(CoordinatorCallError) as err:
            robot.upload_descriptor(_descriptor())
        assert err.value.code is grpc.StatusCode.INVALID_ARGUMENT
        assert "pacfl_basis" in str(err.value) and "RegisterReply.summaries" in str(err.value)
        (record,) = server.store.load().robots
        assert record.descriptor is None  # nothing of the refused upload was kept
        other = connect(server.port, "robot-001")
        other.register(10, {})
        other.upload_descriptor(_descriptor(), {"pacfl_basis": _basis()})
        kept = {r.robot_id: r for r in server.store.load().robots}["robot-001"]
    np.testing.assert_array_equal(kept.summaries["pacfl_basis"], _basis())
