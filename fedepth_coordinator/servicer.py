"""The gRPC servicer of ``fedepth.v1.Coordinator``: converts messages, calls the handlers, and
maps domain errors to status codes. It holds no logic of its own."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TypeVar

import grpc
from google.protobuf.message import Message

from fedepth_coordinator import serde, wire
from fedepth_coordinator._proto.fedepth.v1 import coordinator_pb2 as pb
from fedepth_coordinator._proto.fedepth.v1 import coordinator_pb2_grpc as pb_grpc
from fedepth_coordinator.auth import caller_id
from fedepth_coordinator.errors import (
    AbortedError,
    AlreadyExistsError,
    CoordinatorError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
    ResourceExhaustedError,
)
from fedepth_coordinator.handlers import Coordinator
from fedepth_coordinator.watchdog import IdleWatch

log = logging.getLogger(__name__)

T = TypeVar("T")

STATUS_CODES: dict[type[CoordinatorError], grpc.StatusCode] = {
    InvalidArgumentError: grpc.StatusCode.INVALID_ARGUMENT,
    FailedPreconditionError: grpc.StatusCode.FAILED_PRECONDITION,
    NotFoundError: grpc.StatusCode.NOT_FOUND,
    AlreadyExistsError: grpc.StatusCode.ALREADY_EXISTS,
    AbortedError: grpc.StatusCode.ABORTED,
    PermissionDeniedError: grpc.StatusCode.PERMISSION_DENIED,
    ResourceExhaustedError: grpc.StatusCode.RESOURCE_EXHAUSTED,
}


@contextmanager
def _status(context: grpc.ServicerContext, method: str) -> Iterator[None]:
    """Abort the call with the status code of a domain error (INTERNAL for anything else)."""
    try:
        yield
    except CoordinatorError as exc:
        code = STATUS_CODES.get(type(exc), grpc.StatusCode.UNKNOWN)
        log.info("%s rejected (%s): %s", method, code.name, exc)
        context.abort(code, str(exc))
    except grpc.RpcError:
        raise
    except Exception:
        if not context.is_active():
            log.info("%s: the client went away", method)
            raise
        log.exception("%s failed", method)
        context.abort(grpc.StatusCode.INTERNAL, f"{method} failed; see the coordinator's log")


def _upload_data(
    requests: Iterator[pb.UploadMessage | memoryview],
) -> Iterator[bytes | memoryview]:
    for msg in requests:
        if isinstance(msg, memoryview):
            yield msg
        elif msg.WhichOneof("body") == "data":
            yield msg.data
        else:
            raise InvalidArgumentError("only data messages may follow the upload header")


class CoordinatorServicer(pb_grpc.CoordinatorServicer):
    """Adapter from gRPC calls to :class:`~fedepth_coordinator.handlers.Coordinator`."""

    def __init__(self, coordinator: Coordinator, *, idle_s: float | None = None) -> None:
        self.coordinator = coordinator
        #: cancels weight streams idle for longer than server.stream_idle_s
        self._idle = IdleWatch(idle_s) if idle_s is not None else None

    def _watched(
        self, items: Iterator[T], context: grpc.ServicerContext, what: str
    ) -> Iterator[T]:
        if self._idle is None:
            return items
        return self._idle.watch(items, context.cancel, f"{what} of {caller_id(context)!r}")

    def Register(
        self, request: pb.RegisterRequest, context: grpc.ServicerContext
    ) -> pb.RegisterReply:
        with _status(context, "Register"):
            reg = self.coordinator.register(
                caller_id(context),
                request.robot_id,
                request.num_samples,
                dict(request.labels),
                model_card=request.model_card or None,
            )
            return serde.registration_to_pb(reg)

    def UploadDescriptor(
        self, request: pb.UploadDescriptorRequest, context: grpc.ServicerContext
    ) -> pb.UploadDescriptorReply:
        with _status(context, "UploadDescriptor"):
            ack = self.coordinator.upload_descriptor(
                caller_id(context),
                request.robot_id,
                serde.descriptor_from_pb(request.descriptor),
                serde.inline_from_pb(list(request.summaries)),
            )
            return serde.ack_to_pb(ack)

    def GetRoundPlan(
        self, request: pb.GetRoundPlanRequest, context: grpc.ServicerContext
    ) -> pb.RoundPlan:
        with _status(context, "GetRoundPlan"):
            plan = self.coordinator.round_plan(
                caller_id(context), request.robot_id, request.after_round, request.wait_s
            )
            return serde.plan_to_pb(plan)

    def DownloadModel(
        self, request: pb.DownloadModelRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.DownloadMessage | bytes]:
        with _status(context, "DownloadModel"):
            stream = self.coordinator.download(
                caller_id(context),
                request.robot_id,
                request.round,
                request.latest,
                request.initial,
            )
        try:
            yield pb.DownloadMessage(header=serde.model_header_to_pb(stream.header))
            yield from self._watched(stream.payload.chunks(frame=wire.frame), context, "download")
        finally:
            stream.payload.close()

    def UploadUpdate(
        self,
        request_iterator: Iterator[pb.UploadMessage | memoryview],
        context: grpc.ServicerContext,
    ) -> pb.UploadUpdateReply:
        with _status(context, "UploadUpdate"):
            first = next(request_iterator, None)
            if not isinstance(first, pb.UploadMessage) or first.WhichOneof("body") != "header":
                raise InvalidArgumentError("an upload must start with its header message")
            header = serde.update_header_from_pb(first.header)
            data = self._watched(_upload_data(request_iterator), context, "upload")
            try:
                receipt = self.coordinator.upload(caller_id(context), header, data)
            finally:
                getattr(data, "close", lambda: None)()  # stop watching an abandoned upload
            return serde.receipt_to_pb(receipt)

    def Route(
        self, request: pb.RouteRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.RouteMessage | bytes]:
        with _status(context, "Route"):
            descriptor = (
                serde.descriptor_from_pb(request.descriptor)
                if request.HasField("descriptor")
                else None
            )
            stream = self.coordinator.route(
                caller_id(context),
                descriptor,
                include_model=request.include_model,
                labels=dict(request.labels),
                summaries=serde.inline_from_pb(list(request.summaries)),
            )
        try:
            yield pb.RouteMessage(header=serde.route_header_to_pb(stream.header))
            yield from self._watched(stream.payload.chunks(frame=wire.frame), context, "route")
        finally:
            stream.payload.close()

    def GetClusterMap(
        self, request: pb.GetClusterMapRequest, context: grpc.ServicerContext
    ) -> pb.ClusterMap:
        with _status(context, "GetClusterMap"):
            return serde.cluster_map_to_pb(self.coordinator.cluster_map())

    def GetFleetStatus(
        self, request: pb.GetFleetStatusRequest, context: grpc.ServicerContext
    ) -> pb.FleetStatus:
        with _status(context, "GetFleetStatus"):
            return serde.fleet_to_pb(self.coordinator.fleet_status())

    def ReleaseRound(
        self, request: pb.ReleaseRoundRequest, context: grpc.ServicerContext
    ) -> pb.ReleaseRoundReply:
        with _status(context, "ReleaseRound"):
            out = self.coordinator.release_round(caller_id(context), request.round)
            return pb.ReleaseRoundReply(round=out.round, released=out.released)


def add_to_server(servicer: CoordinatorServicer, server: grpc.Server) -> None:
    """Register the service, with :mod:`~fedepth_coordinator.wire`'s fast path for the streamed
    data messages (the generated ``add_CoordinatorServicer_to_server`` parses them with
    protobuf, at half the throughput)."""

    def unary(method: str, req: type[Message], rep: type[Message]) -> grpc.RpcMethodHandler:
        return grpc.unary_unary_rpc_method_handler(
            getattr(servicer, method),
            request_deserializer=req.FromString,
            response_serializer=rep.SerializeToString,
        )

    handlers = {
        "Register": unary("Register", pb.RegisterRequest, pb.RegisterReply),
        "UploadDescriptor": unary(
            "UploadDescriptor", pb.UploadDescriptorRequest, pb.UploadDescriptorReply
        ),
        "GetRoundPlan": unary("GetRoundPlan", pb.GetRoundPlanRequest, pb.RoundPlan),
        "GetClusterMap": unary("GetClusterMap", pb.GetClusterMapRequest, pb.ClusterMap),
        "GetFleetStatus": unary("GetFleetStatus", pb.GetFleetStatusRequest, pb.FleetStatus),
        "ReleaseRound": unary("ReleaseRound", pb.ReleaseRoundRequest, pb.ReleaseRoundReply),
        "DownloadModel": grpc.unary_stream_rpc_method_handler(
            servicer.DownloadModel,
            request_deserializer=pb.DownloadModelRequest.FromString,
            response_serializer=wire.serialize,
        ),
        "Route": grpc.unary_stream_rpc_method_handler(
            servicer.Route,
            request_deserializer=pb.RouteRequest.FromString,
            response_serializer=wire.serialize,
        ),
        "UploadUpdate": grpc.stream_unary_rpc_method_handler(
            servicer.UploadUpdate,
            request_deserializer=wire.deserializer(pb.UploadMessage),
            response_serializer=pb.UploadUpdateReply.SerializeToString,
        ),
    }
    service = pb.DESCRIPTOR.services_by_name["Coordinator"].full_name
    missing = set(pb.DESCRIPTOR.services_by_name["Coordinator"].methods_by_name) - set(handlers)
    if missing:
        raise RuntimeError(f"no handler for {sorted(missing)}")
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, handlers),))
    server.add_registered_method_handlers(service, handlers)
