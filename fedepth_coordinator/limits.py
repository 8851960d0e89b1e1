"""Per-principal concurrency: one robot may not hold more than a few server workers at once.

Every call to the coordinator's service holds a worker thread while it runs (a long poll for up
to ``server.max_wait_s``, a weight stream for its whole transfer). Without a limit one robot
opening ``max_workers`` long polls fills the pool and nothing else is answered, the health
check included. :class:`CallLimitInterceptor` counts the calls in flight per principal and
answers RESOURCE_EXHAUSTED beyond ``server.max_calls_per_robot``. It sits after the auth
interceptor, so only verified principals are counted (an unauthenticated call is refused before
it runs); the health and reflection services are not counted.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable

import grpc

from fedepth_coordinator.auth import PRINCIPAL_KEY, SERVICE_PREFIX, _single, guarded


class CallLimitInterceptor(grpc.ServerInterceptor):
    """RESOURCE_EXHAUSTED for a principal's call beyond ``limit`` of its calls in flight."""

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        self.limit = limit
        self._lock = threading.Lock()
        self._active: Counter[str] = Counter()

    def in_flight(self, principal: str) -> int:
        with self._lock:
            return self._active[principal]

    def _enter(self, principal: str, context: grpc.ServicerContext) -> None:
        with self._lock:
            if self._active[principal] < self.limit:
                self._active[principal] += 1
                return
        context.abort(
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            f"principal {principal!r} already has {self.limit} calls in flight "
            "(server.max_calls_per_robot): wait for one to finish",
        )

    def _leave(self, principal: str) -> None:
        with self._lock:
            self._active[principal] -= 1
            if self._active[principal] <= 0:
                del self._active[principal]

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler | None:
        handler = continuation(handler_call_details)
        if handler is None or not handler_call_details.method.startswith(SERVICE_PREFIX):
            return handler
        principal = _single(handler_call_details.invocation_metadata, PRINCIPAL_KEY)
        if principal is None:
            return handler  # refused by the auth interceptor before it runs
        return guarded(
            handler,
            lambda context: self._enter(principal, context),
            lambda: self._leave(principal),
        )
