"""The bad-input catalogue: each bad request gets its status code and leaves the state alone."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import grpc
import numpy as np
import pytest

from fedepth.strategies import ClientUpdate
from fedepth_coordinator import serde, wire
from fedepth_coordinator._proto.fedepth.v1 import coordinator_pb2 as pb
from fedepth_coordinator._proto.fedepth.v1 import coordinator_pb2_grpc as pb_grpc
from fedepth_coordinator.auth import call_metadata
from fedepth_coordinator.client import CoordinatorCallError, CoordinatorClient, open_channel
from fedepth_coordinator.config import CoordinatorConfig
from fedepth_coordinator.domain import UpdateHeader
from fedepth_coordinator.server import CoordinatorServer, running
from fedepth_coordinator.simulate import deterministic_train, robot_ids, robot_profile
from fedepth_coordinator.tensors import Layout, iter_chunks

ROBOTS = robot_ids(4)
A, B = ROBOTS[0], ROBOTS[1]


@dataclass
class World:
    """A formed fleet in round 0 where robot A has already uploaded and B has not."""

    server: CoordinatorServer
    clients: dict[str, CoordinatorClient]
    channel: grpc.Channel
    stub: pb_grpc.CoordinatorStub
    tokens: dict[str, str]

    def md(self, principal: str = B) -> tuple[tuple[str, str], ...]:
        return call_metadata(principal, self.tokens[principal])

    def update(self, rid: str = B) -> ClientUpdate:
        task = self.clients[rid].download_model(0).task
        return deterministic_train(rid, 10)(0, task)

    def upload_raw(
        self, update: ClientUpdate, chunks: Iterator[bytes] | None = None, **hdr: Any
    ) -> Any:
        header = UpdateHeader(
            update.cid, 0, update.num_samples, Layout.of({"state": update.state})
        )
        msg = serde.update_header_to_pb(replace(header, **hdr))
        body = (
            chunks if chunks is not None else iter_chunks([update.state], 4096, frame=wire.frame)
        )

        def messages() -> Iterator[Any]:
            yield pb.UploadMessage(header=msg)
            yield from body

        upload = self.channel.stream_unary(
            "/fedepth.v1.Coordinator/UploadUpdate",
            request_serializer=wire.serialize,
            response_deserializer=pb.UploadUpdateReply.FromString,
        )
        return upload(messages(), metadata=self.md(update.cid), timeout=20)

    def snapshot(self) -> tuple[Any, ...]:
        status = self.server.coordinator.fleet_status()
        robots = tuple(replace(r, last_seen_s=0.0) for r in status.robots)
        snap = self.server.store.load()
        return (
            replace(status, robots=robots),
            snap.updates,
            snap.robots.__repr__(),
            self.server.store.blob_keys(),
        )


@pytest.fixture
def world(config_factory: Callable[..., CoordinatorConfig], creds: Any) -> Iterator[World]:
    config = config_factory(rounds={"num_rounds": 2, "min_robots": 4})
    with running(config) as server:
        channel = open_channel(f"127.0.0.1:{server.port}")
        clients = {r: CoordinatorClient(channel, r, creds.tokens[r]) for r in ROBOTS}
        for rid, client in clients.items():
            p = robot_profile(rid)
            client.register(p.num_samples, p.labels)
            client.upload_descriptor(p.descriptor)
        w = World(server, clients, channel, pb_grpc.CoordinatorStub(channel), creds.tokens)
        clients[A].upload_update(0, w.update(A))
        yield w
        channel.close()


def _descriptor_request(
    rid: str, mean: list[float], var: list[float]
) -> pb.UploadDescriptorRequest:
    return pb.UploadDescriptorRequest(
        robot_id=rid, descriptor=pb.Descriptor(mean=mean, var=var, num_frames=4)
    )


def _nan(w: World) -> Any:
    u = w.update()
    name = next(iter(u.state))
    u.state[name][3] = np.nan  # type: ignore[index]
    return w.upload_raw(u)


def _inf(w: World) -> Any:
    u = w.update()
    name = list(u.state)[-1]
    u.state[name][-1] = np.inf  # type: ignore[index]
    return w.upload_raw(u)


def _wrong_shape(w: World) -> Any:
    u = w.update()
    name = next(iter(u.state))
    u.state[name] = u.state[name][:-1]  # type: ignore[index]
    return w.upload_raw(u)


def _wrong_name(w: World) -> Any:
    u = w.update()
    name = next(iter(u.state))
    u.state["not.in.model"] = u.state.pop(name)  # type: ignore[attr-defined]
    return w.upload_raw(u)


def _wrong_dtype(w: World) -> Any:
    u = w.update()
    u.state.update({k: v.astype(np.float64) for k, v in u.state.items()})  # type: ignore[attr-defined]
    return w.upload_raw(u)


def _truncated(w: World) -> Any:
    u = w.update()
    chunks = list(iter_chunks([u.state], 4096, frame=wire.frame))
    return w.upload_raw(u, iter(chunks[:-1]))


def _oversized(w: World) -> Any:
    u = w.update()
    data = bytes(5 << 20)  # over the 4 MiB message limit
    big = wire.frame(len(data)) + data
    return w.upload_raw(u, iter([big]))


def _data_before_header(w: World) -> Any:
    return w.stub.UploadUpdate(iter([pb.UploadMessage(data=b"1234")]), metadata=w.md(), timeout=20)


def _unregistered_robot(w: World) -> Any:
    rid = "robot-005"  # has credentials, never registered
    return w.stub.GetRoundPlan(
        pb.GetRoundPlanRequest(robot_id=rid), metadata=w.md(rid), timeout=20
    )


CASES: dict[str, tuple[grpc.StatusCode, str, Callable[[World], Any]]] = {
    "no credentials": (
        grpc.StatusCode.UNAUTHENTICATED,
        "missing credentials",
        lambda w: w.stub.Register(pb.RegisterRequest(robot_id=B, num_samples=5), timeout=20),
    ),
    "wrong credentials": (
        grpc.StatusCode.UNAUTHENTICATED,
        "invalid credentials",
        lambda w: w.stub.Register(
            pb.RegisterRequest(robot_id=B, num_samples=5),
            metadata=call_metadata(B, "not-the-token"),
            timeout=20,
        ),
    ),
    "another robot's id": (
        grpc.StatusCode.PERMISSION_DENIED,
        "may not act as robot",
        lambda w: w.stub.UploadDescriptor(
            _descriptor_request(B, [0.0] * 8, [1.0] * 8), metadata=w.md(A), timeout=20
        ),
    ),
    "operator uploading": (
        grpc.StatusCode.PERMISSION_DENIED,
        "role 'operator'",
        lambda w: w.stub.Register(
            pb.RegisterRequest(robot_id="ops", num_samples=5), metadata=w.md("ops"), timeout=20
        ),
    ),
    "robot releasing a round": (
        grpc.StatusCode.PERMISSION_DENIED,
        "role 'robot', which may not call ReleaseRound",
        lambda w: w.stub.ReleaseRound(
            pb.ReleaseRoundRequest(round=1), metadata=w.md(A), timeout=20
        ),
    ),
    "releasing a round not reached": (
        grpc.StatusCode.FAILED_PRECONDITION,
        "round 5 is not held: the run is at round 0",
        lambda w: w.stub.ReleaseRound(
            pb.ReleaseRoundRequest(round=5), metadata=w.md("ops"), timeout=20
        ),
    ),
    "wrong round": (
        grpc.StatusCode.FAILED_PRECONDITION,
        "round 1 is not open yet",
        lambda w: w.upload_raw(w.update(), round=1),
    ),
    "duplicate upload": (
        grpc.StatusCode.ALREADY_EXISTS,
        "already uploaded",
        lambda w: w.upload_raw(w.update(A)),
    ),
    "NaN weights": (grpc.StatusCode.INVALID_ARGUMENT, "NaN or Inf", _nan),
    "Inf weights": (grpc.StatusCode.INVALID_ARGUMENT, "NaN or Inf", _inf),
    "wrong shapes": (grpc.StatusCode.INVALID_ARGUMENT, "the model has F32", _wrong_shape),
    "wrong names": (grpc.StatusCode.INVALID_ARGUMENT, "names differ", _wrong_name),
    "wrong dtypes": (grpc.StatusCode.INVALID_ARGUMENT, "got F64", _wrong_dtype),
    "truncated stream": (grpc.StatusCode.INVALID_ARGUMENT, "truncated", _truncated),
    "oversized message": (grpc.StatusCode.RESOURCE_EXHAUSTED, "", _oversized),
    "data before header": (
        grpc.StatusCode.INVALID_ARGUMENT,
        "start with its header",
        _data_before_header,
    ),
    "bad sample count": (
        grpc.StatusCode.INVALID_ARGUMENT,
        "num_samples must be > 0",
        lambda w: w.upload_raw(w.update(), num_samples=0),
    ),
    "unregistered robot": (grpc.StatusCode.NOT_FOUND, "call Register first", _unregistered_robot),
    "negative variances": (
        grpc.StatusCode.INVALID_ARGUMENT,
        "variances must be > 0",
        lambda w: w.stub.UploadDescriptor(
            _descriptor_request(B, [0.0] * 8, [1.0] * 7 + [-1.0]), metadata=w.md(), timeout=20
        ),
    ),
    "zero variances": (
        grpc.StatusCode.INVALID_ARGUMENT,
        "variances must be > 0",
        lambda w: w.stub.UploadDescriptor(
            _descriptor_request(B, [0.0] * 8, [0.0] * 8), metadata=w.md(), timeout=20
        ),
    ),
    "descriptor lengths differ": (
        grpc.StatusCode.INVALID_ARGUMENT,
        "8 means but 7 variances",
        lambda w: w.stub.UploadDescriptor(
            _descriptor_request(B, [0.0] * 8, [1.0] * 7), metadata=w.md(), timeout=20
        ),
    ),
    "descriptor of another dimension": (
        grpc.StatusCode.INVALID_ARGUMENT,
        "the fleet's have 8",
        lambda w: w.stub.Route(
            pb.RouteRequest(descriptor=pb.Descriptor(mean=[0.0] * 3, var=[1.0] * 3, num_frames=2)),
            metadata=w.md(),
            timeout=20,
        ).next(),
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_rejected_and_changes_nothing(case: str, world: World) -> None:
    code, message, call = CASES[case]
    before = world.snapshot()
    with pytest.raises(grpc.RpcError) as err:
        call(world)
    assert err.value.code() == code, err.value.details()
    assert message in (err.value.details() or "")
    assert world.snapshot() == before
    # the coordinator still works: B's proper upload is accepted afterwards
    receipt = world.clients[B].upload_update(0, world.update())
    assert receipt.accepted == 2


def test_route_before_clustering_fails_with_failed_precondition(
    server: CoordinatorServer, creds: Any
) -> None:
    with CoordinatorClient(
        open_channel(f"127.0.0.1:{server.port}"), "ops", creds.tokens["ops"]
    ) as c:
        with pytest.raises(CoordinatorCallError) as err:
            c.route(robot_profile(A).descriptor)
        assert err.value.status == "FAILED_PRECONDITION"
        assert "fleet has not formed yet" in err.value.details
        with pytest.raises(CoordinatorCallError) as err:
            c.cluster_map()
            c.route(None)
        assert err.value.status == "FAILED_PRECONDITION"
        assert not c.cluster_map().clustered
