"""A full run over gRPC on localhost: results equal the in-process strategy; routing, views."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import grpc
import numpy as np
import pytest
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from fedepth_coordinator.client import CoordinatorCallError, CoordinatorClient
from fedepth_coordinator.config import CoordinatorConfig
from fedepth_coordinator.domain import Phase, PlanAction
from fedepth_coordinator.server import CoordinatorServer, load_initial_model, running
from fedepth_coordinator.simulate import SimulatedFleet, reference_run, robot_ids, robot_profile


@pytest.mark.parametrize("strategy", ["fedepth", "fedavg"])
def test_full_run_equals_the_in_process_strategy(
    strategy: str,
    config_factory: Callable[..., CoordinatorConfig],
    creds: Any,
    connect: Callable[..., CoordinatorClient],
) -> None:
    params = {"overlap": 0.3} if strategy == "fedepth" else {}
    config = config_factory(
        strategy={"name": strategy, "params": params}, rounds={"num_rounds": 3, "min_robots": 5}
    )
    robots = robot_ids(5)
    with running(config) as server:
        fleet = SimulatedFleet(f"127.0.0.1:{server.port}", creds.tokens, poll_s=1.0)
        fleet.start_all(robots)
        assert fleet.join(timeout_s=60), "robots did not finish"
        assert not fleet.errors
        assert all(
            fleet.reports[r].rounds == [0, 1, 2] and fleet.reports[r].finished for r in robots
        )
        expected = reference_run(strategy, params, load_initial_model(config.model), robots, 3)
        for rid in robots:
            got = connect(server.port, rid).download_model(latest=True)
            assert got.round == 3
            for name, arr in expected[rid].items():
                np.testing.assert_array_equal(got.task.state[name], arr)

        # after the run the descriptors' encoder is still the initial model (from its blob)
        initial = connect(server.port, robots[1]).download_model(initial=True)
        assert initial.round == -1 and initial.task.recipe is None
        assert initial.card is None  # the synthetic test model has no card
        for name, arr in load_initial_model(config.model).items():
            np.testing.assert_array_equal(initial.task.state[name], arr)
        assert any(
            not np.array_equal(initial.task.state[k], v) for k, v in expected[robots[0]].items()
        )
        ops = connect(server.port, "ops")
        status = ops.fleet_status()
        assert status.phase is Phase.FINISHED and status.round == 3
        assert [h.accepted for h in status.history] == [5, 5, 5]
        assert all(
            r.member and r.updates_accepted == 3 for r in status.robots if r.robot_id in robots
        )
        cmap = ops.cluster_map()
        assert cmap.clustered and cmap.strategy == strategy
        assert sorted({m for c in cmap.clusters for m in c}) == robots
        assert (cmap.tau is not None) == (strategy == "fedepth")

        routed = ops.route(robot_profile(robots[0]).descriptor)
        assert routed.clusters and len(routed.weights) == len(routed.clusters)
        assert set(routed.state) == set(expected[robots[0]])
        light = ops.route(robot_profile(robots[0]).descriptor, include_model=False)
        assert light.clusters == routed.clusters and light.state == {}
        assert robots[0] in cmap.clusters[routed.clusters[0]] or strategy == "fedavg"


def test_health_and_reflection_are_served(server: CoordinatorServer, creds: Any) -> None:
    port = server.port
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        client = CoordinatorClient(channel, "ops", creds.tokens["ops"])
        assert client.health() == "SERVING" and client.health("") == "SERVING"
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        request = reflection_pb2.ServerReflectionRequest(list_services="")
        reply = next(stub.ServerReflectionInfo(iter([request])))
        names = {s.name for s in reply.list_services_response.service}
        assert {"fedepth.v1.Coordinator", "grpc.health.v1.Health"} <= names


def test_plans_wait_for_the_fleet_then_train(
    server: CoordinatorServer, connect: Callable[..., CoordinatorClient]
) -> None:
    port = server.port
    robots = robot_ids(4)
    clients = {r: connect(port, r) for r in robots}
    for rid in robots[:3]:
        p = robot_profile(rid)
        clients[rid].register(p.num_samples, p.labels)
        clients[rid].upload_descriptor(p.descriptor)
    plan = clients[robots[0]].round_plan(-1, wait_s=0.2)
    assert plan.action is PlanAction.WAIT and plan.phase is Phase.WAITING_FOR_FLEET
    # before the fleet forms, a robot gets the initial model (the frozen encoder its
    # descriptor must come from), registered (robots[0]) or not yet (robots[3])
    initial = load_initial_model(server.config.model)
    for caller in (clients[robots[0]], clients[robots[3]]):
        got = caller.download_model(initial=True).task.state
        assert set(got) == set(initial)
        assert all(np.array_equal(got[k], v) for k, v in initial.items())
    with pytest.raises(CoordinatorCallError) as err:
        clients[robots[0]].download_model(latest=True, initial=True)
    assert err.value.status == "INVALID_ARGUMENT" and "not both" in err.value.details
    with pytest.raises(CoordinatorCallError) as err:
        clients[robots[0]].download_model(0)
    assert err.value.status == "FAILED_PRECONDITION" and "3/4 robots" in err.value.details
    p = robot_profile(robots[3])
    assert not clients[robots[3]].register(p.num_samples, p.labels).member
    ack = clients[robots[3]].upload_descriptor(p.descriptor)
    assert ack.member and ack.phase is Phase.TRAINING
    plan = clients[robots[0]].wait_for_round(-1, timeout_s=5)
    assert plan.action is PlanAction.TRAIN and plan.round == 0
    model = clients[robots[0]].download_model(0)
    assert model.round == 0 and model.task.hook is None
    assert sum(a.nbytes for a in model.task.state.values()) == plan.model_bytes
    # every task carries the run's training recipe; the latest model is not a task to train
    assert model.task.recipe == server.config.training.recipe()
    assert clients[robots[0]].download_model(latest=True).task.recipe is None
