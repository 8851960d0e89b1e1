"""Container health check: the coordinator's standard gRPC health service answers SERVING."""

import os
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def main() -> int:
    port = os.environ.get("FEDEPTH_PORT", "50051")
    service = os.environ.get("FEDEPTH_HEALTH_SERVICE", "")  # "" = the whole server
    try:
        with grpc.insecure_channel(f"localhost:{port}") as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=3.0
            )
    except grpc.RpcError as exc:
        sys.stderr.write(f"health check failed: {exc.code().name} {exc.details()}\n")
        return 1
    if reply.status != health_pb2.HealthCheckResponse.SERVING:
        status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
        sys.stderr.write(f"coordinator not serving: {status}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
