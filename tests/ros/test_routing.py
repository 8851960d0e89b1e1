"""fedepth_ros.routing without ROS: a route with its round, retries until stopped."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any, cast

import grpc

from fedepth.descriptor import Descriptor
from fedepth_coordinator.client import CoordinatorCallError, CoordinatorClient
from fedepth_ros.routing import retry_until_stopped, route_with_round


class _Client:
    """The two calls route_with_round makes, recorded in order."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def fleet_status(self) -> SimpleNamespace:
        self.calls.append(("fleet_status", None))
        return SimpleNamespace(round=7)

    def route(self, descriptor: Any, **kwargs: Any) -> str:
        self.calls.append(("route", (descriptor, kwargs)))
        return "decision"


def test_a_route_comes_with_the_round_read_before_it_was_asked_for() -> None:
    client = _Client()
    descriptor = cast(Descriptor, object())
    summaries = {"gem": None}
    decision, rounds = route_with_round(
        cast(CoordinatorClient, client), descriptor, cast(Any, summaries)
    )
    assert (decision, rounds) == ("decision", 7)
    assert client.calls == [
        ("fleet_status", None),
        ("route", (descriptor, {"include_model": True, "summaries": summaries})),
    ]


def test_retry_doubles_its_backoff_until_the_call_answers() -> None:
    answers: list[Any] = [
        CoordinatorCallError("Route", grpc.StatusCode.UNAVAILABLE, "down"),
        CoordinatorCallError("Route", grpc.StatusCode.UNAVAILABLE, "down"),
        "ok",
    ]
    backoffs: list[float] = []

    def call() -> str:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return str(answer)

    got = retry_until_stopped(call, threading.Event(), lambda exc, b: backoffs.append(b))
    assert got == "ok" and backoffs == [0.5, 1.0]


def test_retry_gives_none_once_stopped() -> None:
    stop = threading.Event()
    stop.set()
    assert retry_until_stopped(lambda: "never", stop, lambda exc, b: None) is None
