"""depth_node's routing calls to the coordinator, without ROS.

Calls retried until they answer or the node stops (:func:`retry_until_stopped`; the failures
in :data:`ROUTE_RETRY` may pass), a route with the round its models are at least as recent
as (:func:`route_with_round`), the drift monitor that re-routing measures against the
coordinator's tau (:func:`drift_monitor`), and the route of a window that has drifted
(:func:`reroute_on_drift`). The node logs through the ``log`` it passes (its own logger).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any, Protocol, TypeVar

import grpc
import numpy as np

from fedepth.descriptor import Descriptor
from fedepth.strategies import RouteDecision
from fedepth_coordinator.client import CoordinatorCallError, CoordinatorClient
from fedepth_ros.drift import DriftMonitor
from fedepth_ros.learner import describe

T = TypeVar("T")

#: Route calls that may succeed later: coordinator down, or no clusters yet (run not started).
ROUTE_RETRY = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.FAILED_PRECONDITION,
    }
)


class Log(Protocol):
    """The logging a node's logger offers (``rclpy`` loggers take the same calls)."""

    def info(self, message: str) -> Any: ...

    def warning(self, message: str) -> Any: ...


def retry_until_stopped(
    call: Callable[[], T],
    stop: threading.Event,
    on_failure: Callable[[CoordinatorCallError, float], None],
) -> T | None:
    """``call()`` until it answers; after each failure ``on_failure(exc, backoff)`` (which waits),
    the backoff doubling from 0.5 s up to 10 s. None once ``stop`` is set."""
    backoff = 0.5
    while not stop.is_set():
        try:
            return call()
        except CoordinatorCallError as exc:
            if stop.is_set():
                return None
            on_failure(exc, backoff)
            backoff = min(10.0, backoff * 2)
    return None


def route_with_round(
    client: CoordinatorClient,
    descriptor: Descriptor,
    summaries: Mapping[str, np.ndarray] | None,
) -> tuple[RouteDecision, int]:
    """The decision with the averaged model, and the rounds closed before it was asked
    for (the model is at least that recent)."""
    rounds = client.fleet_status().round
    return client.route(descriptor, include_model=True, summaries=summaries), rounds


def drift_monitor(
    client: Callable[[], CoordinatorClient],
    reference: Descriptor,
    params: Mapping[str, Any],
    log: Log,
) -> DriftMonitor | None:
    """The monitor of drift away from the routed ``reference``, against the coordinator's tau,
    set up by the node's ``reroute_*`` parameters; None (logged why) without a usable tau."""
    try:
        tau = client().cluster_map().tau
    except CoordinatorCallError as exc:
        log.warning(f"no re-routing: cluster map unavailable ({exc})")
        return None
    if tau is None or not tau > 0:
        why = "has no tau" if tau is None else f"has tau {tau:g}; drift is measured in tau"
        log.warning(f"no re-routing: the coordinator's strategy {why}")
        return None
    log.info(f"re-routing on: drift against tau {tau:.4g}")
    return DriftMonitor(
        reference,
        tau,
        window=int(params["reroute_window"]),
        check_period=int(params["reroute_check_period"]),
        enter=float(params["reroute_enter"]),
        exit=float(params["reroute_exit"]),
        patience=int(params["reroute_patience"]),
        cooldown_s=float(params["reroute_cooldown"]),
    )


def reroute_on_drift(
    monitor: DriftMonitor,
    gem_vector: np.ndarray,
    client: Callable[[], CoordinatorClient],
    log: Log,
) -> tuple[RouteDecision, Descriptor, dict[str, np.ndarray]] | None:
    """Feed one frame's GeM vector to ``monitor``; on sustained drift, route the window (one
    attempt) and return the decision with the window's descriptor and summaries. None: no
    drift, or the route failed (logged; the current model stays)."""
    window = monitor.add(gem_vector)
    if window is None:
        return None
    log.info(
        f"scene drift: divergence {monitor.last_divergence:.4g} > "
        f"{monitor.enter:g} x tau {monitor.tau:.4g}; re-routing"
    )
    try:
        summaries = describe(np.stack(monitor.vectors))[1]
        decision = client().route(window, include_model=True, summaries=summaries)
    except CoordinatorCallError as exc:
        log.warning(f"re-route failed, keeping the current model: {exc}")
        return None
    return decision, window, summaries
