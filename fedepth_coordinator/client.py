"""``CoordinatorClient``: the one way robots and tools talk to the coordinator.

The client takes its channel in the constructor (:func:`open_channel` makes one, plaintext or
TLS / mutual TLS) and the principal's id and token, which it attaches to every call. It speaks
fedepth types: :class:`~fedepth.descriptor.Descriptor` in, :class:`~fedepth.strategies.TrainTask`
and :class:`~fedepth.strategies.RouteDecision` out, :class:`~fedepth.strategies.ClientUpdate`
up. Weights stream in chunks both ways and are assembled in place (one copy of the model).
Failed calls raise :class:`CoordinatorCallError` with the gRPC status and the server's message.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, TypeVar

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc

from fedepth.descriptor import Descriptor
from fedepth.strategies import ClientUpdate, RouteDecision, TrainTask
from fedepth_coordinator import serde, wire
from fedepth_coordinator._proto.fedepth.v1 import coordinator_pb2 as pb
from fedepth_coordinator._proto.fedepth.v1 import coordinator_pb2_grpc as pb_grpc
from fedepth_coordinator.auth import call_metadata
from fedepth_coordinator.domain import (
    ClusterMap,
    DescriptorAck,
    FleetStatus,
    PlanAction,
    Registration,
    RoundPlan,
    UpdateHeader,
    UploadReceipt,
)
from fedepth_coordinator.errors import CoordinatorError
from fedepth_coordinator.tensors import STATE, Layout, assemble, iter_chunks

if TYPE_CHECKING:  # fedepth.models (torchvision) is imported only when a card arrives
    from fedepth.models.card import ModelCard

SERVICE: str = pb.DESCRIPTOR.services_by_name["Coordinator"].full_name
DEFAULT_MAX_MESSAGE_BYTES = 4 << 20
DEFAULT_CHUNK_BYTES = 1 << 20

#: Statuses after which the same call may succeed later (coordinator restarting, overloaded).
#: ABORTED: a request on the same object (an upload) is still in progress; nothing recorded.
RETRYABLE = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.ABORTED}
)


class CoordinatorCallError(RuntimeError):
    """A call failed: ``code`` is the gRPC status, ``details`` the coordinator's explanation."""

    def __init__(self, method: str, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{method}: {code.name}: {details}")
        self.method = method
        self.code = code
        self.details = details

    @property
    def status(self) -> str:
        """The status name, e.g. ``"FAILED_PRECONDITION"``."""
        return str(self.code.name)

    @property
    def retryable(self) -> bool:
        return self.code in RETRYABLE


@dataclass(frozen=True)
class ClientTls:
    """TLS settings of a client: the CA that signed the server, and for mutual TLS the robot's
    certificate and key (PEM files)."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    #: Expected server name when it differs from the target host (test certificates).
    server_name: str | None = None


def open_channel(
    target: str,
    *,
    tls: ClientTls | None = None,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
) -> grpc.Channel:
    """A channel to ``target`` (HOST:PORT), plaintext unless ``tls`` is given."""
    options: list[tuple[str, int | str]] = [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
        # reconnect soon after a coordinator restart (gRPC's default backoff grows to 120 s)
        ("grpc.initial_reconnect_backoff_ms", 250),
        ("grpc.max_reconnect_backoff_ms", 5000),
    ]
    if tls is None:
        return grpc.insecure_channel(target, options=options)

    def read(path: str | None) -> bytes | None:
        return None if path is None else Path(path).read_bytes()

    creds = grpc.ssl_channel_credentials(
        root_certificates=read(tls.ca_file),
        private_key=read(tls.key_file),
        certificate_chain=read(tls.cert_file),
    )
    if tls.server_name:
        options.append(("grpc.ssl_target_name_override", tls.server_name))
    return grpc.secure_channel(target, creds, options=options)


@dataclass(frozen=True)
class DownloadedModel:
    """A robot's model for a round: the task its trainer runs."""

    round: int
    task: TrainTask
    #: the served model's card; None: the coordinator sent none (a synthetic model)
    card: ModelCard | None = None


class CoordinatorClient:
    """Calls of one principal (a robot, or an operator tool) over a given channel."""

    def __init__(
        self,
        channel: grpc.Channel,
        principal: str,
        token: str,
        *,
        timeout_s: float = 60.0,
        transfer_timeout_s: float = 900.0,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        wait_for_ready: bool = False,
    ) -> None:
        self.channel = channel
        #: Queue calls while the channel (re)connects, up to their timeout, instead of failing
        #: at once with UNAVAILABLE.
        self.wait_for_ready = wait_for_ready
        self.robot_id = principal
        self._stub = pb_grpc.CoordinatorStub(channel)
        # the streamed calls use wire's fast path for their data messages
        self._download = channel.unary_stream(
            f"/{SERVICE}/DownloadModel",
            request_serializer=pb.DownloadModelRequest.SerializeToString,
            response_deserializer=wire.deserializer(pb.DownloadMessage),
        )
        self._route = channel.unary_stream(
            f"/{SERVICE}/Route",
            request_serializer=pb.RouteRequest.SerializeToString,
            response_deserializer=wire.deserializer(pb.RouteMessage),
        )
        self._upload = channel.stream_unary(
            f"/{SERVICE}/UploadUpdate",
            request_serializer=wire.serialize,
            response_deserializer=pb.UploadUpdateReply.FromString,
        )
        self._metadata = call_metadata(principal, token)
        self.timeout_s = timeout_s
        self.transfer_timeout_s = transfer_timeout_s
        self.chunk_bytes = chunk_bytes

    def close(self) -> None:
        """Close the channel (when the client's owner is done with both)."""
        self.channel.close()

    def __enter__(self) -> CoordinatorClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    @contextmanager
    def _call(self, method: str) -> Iterator[None]:
        try:
            yield
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
            details = exc.details() if hasattr(exc, "details") else str(exc)
            raise CoordinatorCallError(method, code, details or "") from None
        except CoordinatorError as exc:
            raise CoordinatorCallError(method, grpc.StatusCode.DATA_LOSS, str(exc)) from exc

    # -- robot lifecycle ---------------------------------------------------------------------
    def register(
        self,
        num_samples: int,
        labels: Mapping[str, str] | None = None,
        *,
        model_card: str | None = None,
    ) -> Registration:
        """Register this robot (again, after a drop-out: the same values). ``model_card``
        (JSON) declares the model the robot can take; a coordinator serving a different one
        refuses it with FAILED_PRECONDITION. The reply carries the served card."""
        req = pb.RegisterRequest(
            robot_id=self.robot_id,
            num_samples=num_samples,
            labels=dict(labels or {}),
            model_card=model_card or "",
        )
        with self._call("Register"):
            reply = self._stub.Register(
                req,
                timeout=self.timeout_s,
                metadata=self._metadata,
                wait_for_ready=self.wait_for_ready,
            )
        return serde.registration_from_pb(reply)

    def upload_descriptor(
        self, descriptor: Descriptor, summaries: Mapping[str, np.ndarray] | None = None
    ) -> DescriptorAck:
        """Send this robot's descriptor (and optional algorithm summaries of its data)."""
        req = pb.UploadDescriptorRequest(
            robot_id=self.robot_id,
            descriptor=serde.descriptor_to_pb(descriptor),
            summaries=serde.inline_to_pb(summaries or {}),
        )
        with self._call("UploadDescriptor"):
            reply = self._stub.UploadDescriptor(
                req,
                timeout=self.timeout_s,
                metadata=self._metadata,
                wait_for_ready=self.wait_for_ready,
            )
        return serde.ack_from_pb(reply)

    def round_plan(self, after_round: int = -1, wait_s: float = 0.0) -> RoundPlan:
        """The plan now, or the first non-waiting one within ``wait_s`` (server-capped)."""
        req = pb.GetRoundPlanRequest(
            robot_id=self.robot_id, after_round=after_round, wait_s=wait_s
        )
        with self._call("GetRoundPlan"):
            reply = self._stub.GetRoundPlan(
                req,
                timeout=self.timeout_s + wait_s,
                metadata=self._metadata,
                wait_for_ready=self.wait_for_ready,
            )
        return serde.plan_from_pb(reply)

    def wait_for_round(
        self, after_round: int = -1, timeout_s: float = 600.0, poll_s: float = 15.0
    ) -> RoundPlan:
        """Long-poll until a round to train after ``after_round`` opens or the run finishes;
        returns the last (waiting) plan when ``timeout_s`` runs out."""
        end = time.monotonic() + timeout_s
        while True:
            remaining = end - time.monotonic()
            plan = self.round_plan(after_round, wait_s=max(0.0, min(poll_s, remaining)))
            if plan.action is not PlanAction.WAIT or remaining <= 0:
                return plan

    def download_model(
        self, round: int = 0, *, latest: bool = False, initial: bool = False
    ) -> DownloadedModel:
        """This robot's task for ``round`` (with the run's training recipe), or with ``latest``
        its current model, or with ``initial`` the run's initial model, the frozen encoder of
        every descriptor (both without a recipe)."""
        req = pb.DownloadModelRequest(
            robot_id=self.robot_id, round=round, latest=latest, initial=initial
        )
        with self._call("DownloadModel"):
            stream = self._download(
                req,
                timeout=self.transfer_timeout_s,
                metadata=self._metadata,
                wait_for_ready=self.wait_for_ready,
            )
            header = serde.model_header_from_pb(_first(stream, pb.DownloadMessage).header)
            groups = assemble(header.layout, _data(stream))
        task = TrainTask(
            state=groups.pop(STATE),
            hook=header.hook,
            hook_params=dict(header.hook_params),
            hook_state=dict(groups.items()),
            recipe=header.recipe,
        )
        card = None
        if header.card is not None:
            from fedepth.models.card import ModelCard

            card = ModelCard.from_json(header.card, "served model")
        return DownloadedModel(header.round, task, card)

    def upload_update(self, round: int, update: ClientUpdate) -> UploadReceipt:
        """Stream a trained update (state, sample count, extra state) for ``round``."""
        if update.cid != self.robot_id:
            raise ValueError(f"update of {update.cid!r} cannot be sent as {self.robot_id!r}")
        groups: dict[str, Mapping[str, np.ndarray]] = {STATE: update.state, **update.extra}
        header = UpdateHeader(
            robot_id=self.robot_id,
            round=round,
            num_samples=update.num_samples,
            layout=Layout.of(groups),
            num_steps=update.num_steps,
            metrics=dict(update.metrics),
        )

        def messages() -> Iterator[pb.UploadMessage | bytes]:
            yield pb.UploadMessage(header=serde.update_header_to_pb(header))
            yield from iter_chunks(list(groups.values()), self.chunk_bytes, frame=wire.frame)

        with self._call("UploadUpdate"):
            reply = self._upload(
                messages(),
                timeout=self.transfer_timeout_s,
                metadata=self._metadata,
                wait_for_ready=self.wait_for_ready,
            )
        return serde.receipt_from_pb(reply)

    # -- routing and fleet views -------------------------------------------------------------
    def route(
        self,
        descriptor: Descriptor | None,
        *,
        include_model: bool = True,
        labels: Mapping[str, str] | None = None,
        summaries: Mapping[str, np.ndarray] | None = None,
    ) -> RouteDecision:
        """Clusters (and, with ``include_model``, the averaged model) for an unseen sequence;
        the state is empty when the model was not requested."""
        req = pb.RouteRequest(
            include_model=include_model,
            labels=dict(labels or {}),
            summaries=serde.inline_to_pb(summaries or {}),
        )
        if descriptor is not None:
            req.descriptor.CopyFrom(serde.descriptor_to_pb(descriptor))
        with self._call("Route"):
            stream = self._route(
                req,
                timeout=self.transfer_timeout_s,
                metadata=self._metadata,
                wait_for_ready=self.wait_for_ready,
            )
            header = serde.route_header_from_pb(_first(stream, pb.RouteMessage).header)
            state = (
                assemble(header.layout, _data(stream))[STATE] if header.layout is not None else {}
            )
        return RouteDecision(list(header.clusters), list(header.weights), state)

    def cluster_map(self) -> ClusterMap:
        with self._call("GetClusterMap"):
            reply = self._stub.GetClusterMap(
                pb.GetClusterMapRequest(),
                timeout=self.timeout_s,
                metadata=self._metadata,
                wait_for_ready=self.wait_for_ready,
            )
        return serde.cluster_map_from_pb(reply)

    def fleet_status(self) -> FleetStatus:
        with self._call("GetFleetStatus"):
            reply = self._stub.GetFleetStatus(
                pb.GetFleetStatusRequest(),
                timeout=self.timeout_s,
                metadata=self._metadata,
                wait_for_ready=self.wait_for_ready,
            )
        return serde.fleet_from_pb(reply)

    def release_round(self, round: int) -> bool:
        """Open ``round``, held by the coordinator's rounds.hold_after (an operator's call);
        True when this call opened it, False when it was open already."""
        with self._call("ReleaseRound"):
            reply = self._stub.ReleaseRound(
                pb.ReleaseRoundRequest(round=round),
                timeout=self.timeout_s,
                metadata=self._metadata,
                wait_for_ready=self.wait_for_ready,
            )
        return bool(reply.released)

    def health(self, service: str = "fedepth.v1.Coordinator") -> str:
        """The standard health status of the service (``"SERVING"`` when up)."""
        stub = health_pb2_grpc.HealthStub(self.channel)
        with self._call("Health.Check"):
            reply = stub.Check(
                health_pb2.HealthCheckRequest(service=service), timeout=self.timeout_s
            )
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))


_Msg = TypeVar("_Msg", pb.DownloadMessage, pb.RouteMessage)


def _first(stream: Iterator[_Msg | memoryview], cls: type[_Msg]) -> _Msg:
    """The header message a stream starts with."""
    first = next(stream, None)
    if not isinstance(first, cls) or first.WhichOneof("body") != "header":
        raise CoordinatorError("the coordinator's stream did not start with a header")
    return first


def _data(
    stream: Iterator[pb.DownloadMessage | pb.RouteMessage | memoryview],
) -> Iterator[bytes | memoryview]:
    for msg in stream:
        if isinstance(msg, memoryview):
            yield msg
        elif msg.WhichOneof("body") == "data":
            yield msg.data
        else:
            raise CoordinatorError("the coordinator's stream repeated its header")
