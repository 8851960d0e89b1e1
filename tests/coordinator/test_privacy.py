"""Everything a robot sends during a full run is registration data, its descriptor or weights."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import grpc
from google.protobuf.message import Message

from fedepth_coordinator._proto.fedepth.v1 import coordinator_pb2 as pb
from fedepth_coordinator.client import CoordinatorClient
from fedepth_coordinator.config import CoordinatorConfig
from fedepth_coordinator.server import load_initial_model, running
from fedepth_coordinator.simulate import SimulatedFleet, robot_ids

#: Every field a robot may fill in, per message type; anything else fails the test.
ALLOWED = {
    "RegisterRequest": {"robot_id", "num_samples", "labels"},
    "UploadDescriptorRequest": {"robot_id", "descriptor"},
    "Descriptor": {"mean", "var", "num_frames"},
    "GetRoundPlanRequest": {"robot_id", "after_round", "wait_s"},
    "DownloadModelRequest": {"robot_id", "round", "latest"},
    "UploadMessage": {"header"},
    "UploadHeader": {"robot_id", "round", "num_samples", "num_steps", "state", "total_bytes"},
    "TensorGroup": {"name", "tensors"},
    "TensorSpec": {"name", "dtype", "shape"},
}


class Recorder(
    grpc.UnaryUnaryClientInterceptor,
    grpc.UnaryStreamClientInterceptor,
    grpc.StreamUnaryClientInterceptor,
):
    """Records every request message a robot's channel sends, as it is sent."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, Any]] = []
        self._lock = threading.Lock()

    def _record(self, method: str, message: Any) -> None:
        with self._lock:
            self.sent.append((method, message))

    def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        self._record(details.method, request)
        return continuation(details, request)

    def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        self._record(details.method, request)
        return continuation(details, request)

    def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        def recorded() -> Iterator[Any]:
            for message in requests:
                self._record(details.method, message)
                yield message

        return continuation(details, recorded())


def _fields(message: Message) -> Iterator[tuple[str, str]]:
    for field, value in message.ListFields():
        yield type(message).__name__, field.name
        if field.message_type is not None and not field.message_type.GetOptions().map_entry:
            for item in value if field.is_repeated else [value]:
                yield from _fields(item)


def test_robots_send_only_registration_descriptor_and_weights(
    config_factory: Callable[..., CoordinatorConfig],
    creds: Any,
    connect: Callable[..., CoordinatorClient],
) -> None:
    config = config_factory(rounds={"num_rounds": 2, "min_robots": 4})
    recorder = Recorder()
    robots = robot_ids(4)
    with running(config) as server:
        fleet = SimulatedFleet(
            f"127.0.0.1:{server.port}", creds.tokens, poll_s=1.0, interceptors=[recorder]
        )
        fleet.start_all(robots)
        assert fleet.join(timeout_s=60) and not fleet.errors
    model_bytes = sum(a.nbytes for a in load_initial_model(config.model).values())

    weight_bytes = 0
    methods = set()
    for method, message in recorder.sent:
        methods.add(method.rsplit("/", 1)[-1])
        if isinstance(message, bytes):  # a streamed data message: tensor bytes of an update
            decoded = pb.UploadMessage.FromString(message)
            assert decoded.WhichOneof("body") == "data"
            weight_bytes += len(decoded.data)
            continue
        for owner, name in _fields(message):
            assert name in ALLOWED.get(owner, set()), f"robot sent {owner}.{name}"
        if isinstance(message, pb.RegisterRequest):
            assert set(message.labels) <= {"platform", "environment"}
        if isinstance(message, pb.UploadDescriptorRequest):
            assert len(message.descriptor.mean) == len(message.descriptor.var) == 8
        if isinstance(message, pb.UploadMessage):
            names = {t.name for t in message.header.state.tensors}
            assert names == set(load_initial_model(config.model))
        assert message.ByteSize() < 1024, f"{type(message).__name__} is {message.ByteSize()} bytes"
    # every byte of payload is a weight of an update: 4 robots x 2 rounds x one model
    assert weight_bytes == len(robots) * 2 * model_bytes
    assert methods == {
        "Register",
        "UploadDescriptor",
        "GetRoundPlan",
        "DownloadModel",
        "UploadUpdate",
    }
