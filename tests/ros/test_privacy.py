"""What real robot_nodes send during a full run: registration data, the descriptor, the
summaries the strategy asked for, and weights; nothing else.

A coordinator in this process records, behind authentication, every request message two
robot_node processes send (each fed its own bag) through two FeDepth rounds. The allow-list
below is the whole of what a robot may tell the coordinator; any other field, label or summary
fails the test. docs/ros.md ("What a robot tells the coordinator") documents the same list.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.message import Message

from fedepth.data.bag_writer import synthetic_frames, write_rgbd_bag
from fedepth_coordinator._proto.fedepth.v1 import coordinator_pb2 as pb
from fedepth_coordinator.client import CoordinatorClient, open_channel
from fedepth_coordinator.domain import Phase
from fedepth_coordinator.server import running

from .conftest import PLAY_AFTER_MATCH
from .test_end_to_end import Processes, small_federation, wait_until

pytestmark = [pytest.mark.ros, pytest.mark.slow]

#: Every field a robot may fill in, per message type; anything else fails the test.
ALLOWED = {
    "RegisterRequest": {"robot_id", "num_samples", "labels", "model_card"},
    "UploadDescriptorRequest": {"robot_id", "descriptor"},  # fedepth asks for no summaries
    "Descriptor": {"mean", "var", "num_frames"},
    "GetRoundPlanRequest": {"robot_id", "after_round", "wait_s"},
    "DownloadModelRequest": {"robot_id", "round", "latest", "initial"},
    "UploadMessage": {"header"},
    "UploadHeader": {
        "robot_id",
        "round",
        "num_samples",
        "num_steps",
        "metrics",
        "state",
        "total_bytes",
    },
    "TensorGroup": {"name", "tensors"},
    "TensorSpec": {"name", "dtype", "shape"},
}
#: The labels a robot may send: those its operator declared (robot_node's parameters).
LABELS = {"platform", "environment"}
#: The metrics an upload may report: training loss and step count, never data.
METRICS = {"loss"}
ROBOTS = {"robot_a": ("robot-a", {"platform": "spot"}), "robot_b": ("robot-b", {})}


class Recorder(grpc.ServerInterceptor):
    """Records every request message the server receives, by method, as it is received."""

    def __init__(self) -> None:
        self.received: list[tuple[str, Any]] = []
        self._lock = threading.Lock()

    def _record(self, method: str, message: Any) -> Any:
        with self._lock:
            self.received.append((method, message))
        return message

    def intercept_service(self, continuation: Any, details: Any) -> Any:
        handler = continuation(details)
        if handler is None:
            return None
        method = details.method.rsplit("/", 1)[-1]
        kind = ("stream" if handler.request_streaming else "unary") + "_"
        kind += "stream" if handler.response_streaming else "unary"
        inner = getattr(handler, kind)  # e.g. handler.unary_stream
        make = getattr(grpc, f"{kind}_rpc_method_handler")  # grpc.unary_stream_rpc_method_handler

        if handler.request_streaming:

            def behavior(requests: Iterator[Any], context: Any) -> Any:
                return inner((self._record(method, m) for m in requests), context)
        else:

            def behavior(request: Any, context: Any) -> Any:
                return inner(self._record(method, request), context)

        return make(
            behavior,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )


def _fields(message: Message) -> Iterator[tuple[str, str]]:
    for field, value in message.ListFields():
        yield type(message).__name__, field.name
        if field.message_type is not None and not field.message_type.GetOptions().map_entry:
            for item in value if field.is_repeated else [value]:
                yield from _fields(item)


def test_robot_nodes_send_only_registration_descriptor_and_weights(
    tmp_path: Path, ros_env: dict[str, str]
) -> None:
    fed = small_federation(tmp_path, [p for p, _ in ROBOTS.values()])
    config, tokens, ops_token = fed.config, fed.token_files, fed.ops_token
    recorder = Recorder()
    processes = Processes(tmp_path, ros_env)
    try:
        with running(config, interceptors=[recorder]) as server:
            address = f"127.0.0.1:{server.port}"
            for ns, (principal, labels) in ROBOTS.items():
                bag = write_rgbd_bag(
                    synthetic_frames(12, rate_hz=20.0), tmp_path / f"{ns}-bag", progress=False
                ).path
                # the node's defaults, but for where it connects and a buffer this bag fills
                params = {
                    "coordinator": address,
                    "robot_id": principal,
                    "token_file": tokens[principal],
                    "device": "cpu",
                    "frame_stride": 1,
                    "descriptor_frames": 4,
                    **labels,
                }
                processes.node(ns, "fedepth_ros.robot_node", ns, params)
                player = [sys.executable, "-m", "fedepth_ros.bag_player", str(bag)]
                player += [*PLAY_AFTER_MATCH, "--wait-timeout", "90"]
                processes.start(f"player_{ns}", [*player, "--ros-args", "-r", f"__ns:=/{ns}"])
            ops = CoordinatorClient(open_channel(address), "ops", ops_token, wait_for_ready=True)
            try:

                def finished() -> bool:
                    for name, proc in processes.procs.items():
                        assert proc.poll() is None or name.startswith("player"), processes.logs()
                    return ops.fleet_status().phase is Phase.FINISHED

                wait_until(finished, 180, "two federated rounds")
                assert [h.accepted for h in ops.fleet_status().history] == [2, 2]
            finally:
                ops.close()
            for ns in ROBOTS:
                processes.interrupt(ns)
            model_bytes = sum(a.nbytes for a in server.initial.state.values())
            names = set(server.initial.state)
    finally:
        processes.close()

    weight_bytes = 0
    methods = set()
    labels_sent: dict[str, dict[str, str]] = {}
    for method, message in recorder.received:
        methods.add(method)
        if isinstance(message, memoryview):  # a streamed data message: tensor bytes
            weight_bytes += len(message)
            continue
        for owner, name in _fields(message):
            assert name in ALLOWED.get(owner, set()), f"robot sent {owner}.{name}"
        if isinstance(message, pb.RegisterRequest):
            assert set(message.labels) <= LABELS, dict(message.labels)
            labels_sent[message.robot_id] = dict(message.labels)
        if isinstance(message, pb.UploadDescriptorRequest):
            d = message.descriptor
            assert len(d.mean) == len(d.var) > 0 and d.num_frames == 4
            # the two D-vectors and a few bytes: no room for anything else
            assert message.ByteSize() <= 2 * (9 * len(d.mean) + 4) + 64
            continue
        if isinstance(message, pb.UploadMessage):
            header = message.header
            assert {t.name for t in header.state.tensors} == names
            assert set(header.metrics) <= METRICS, dict(header.metrics)
            assert header.total_bytes == model_bytes
            continue  # its names, dtypes and shapes are the model's: nothing else fits in
        assert message.ByteSize() < 4096, f"{type(message).__name__}: {message.ByteSize()} B"
    # what the operator declared, and nothing the node made up
    assert labels_sent == {p: labels for p, labels in ROBOTS.values()}
    # every payload byte is a weight of an update: 2 robots x 2 rounds x one model
    assert weight_bytes == len(ROBOTS) * 2 * model_bytes
    robot_calls = {"Register", "UploadDescriptor", "GetRoundPlan", "DownloadModel", "UploadUpdate"}
    assert methods - {"GetFleetStatus"} == robot_calls  # GetFleetStatus: this test's operator
