"""The robot side of a run: register, send the descriptor, then train every planned round.

:func:`run_robot` is the loop a robot node (or a benchmark's client process) runs around a
:class:`~fedepth_coordinator.client.CoordinatorClient` and a training function; it survives a
coordinator restart (retryable errors are retried for ``retry_for_s`` and the robot re-joins,
which is idempotent) and treats a duplicate upload as already delivered.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import TypeVar

import grpc
import numpy as np

from fedepth.descriptor import Descriptor
from fedepth.strategies import ClientUpdate, TrainTask
from fedepth_coordinator.client import CoordinatorCallError, CoordinatorClient
from fedepth_coordinator.domain import PlanAction

log = logging.getLogger(__name__)

#: Local training: (round, task downloaded for it) -> the update to send back.
TrainFn = Callable[[int, TrainTask], ClientUpdate]

T = TypeVar("T")


@dataclass(frozen=True)
class RobotProfile:
    """What a robot tells the coordinator about itself (never its data)."""

    num_samples: int
    descriptor: Descriptor
    labels: Mapping[str, str] = field(default_factory=dict)
    summaries: Mapping[str, np.ndarray] = field(default_factory=dict)


@dataclass
class RobotReport:
    """What a robot did: the rounds whose update the coordinator accepted, and whether the run
    finished (False: stopped, or gave up after an outage)."""

    rounds: list[int] = field(default_factory=list)
    finished: bool = False


class RobotLoop:
    """One robot's participation in a run (see :func:`run_robot`)."""

    def __init__(
        self,
        client: CoordinatorClient,
        profile: RobotProfile,
        train: TrainFn,
        *,
        stop: threading.Event | None = None,
        poll_s: float = 10.0,
        retry_for_s: float = 120.0,
    ) -> None:
        self.client = client
        self.profile = profile
        self.train = train
        self.stop = stop or threading.Event()
        self.poll_s = poll_s
        self.retry_for_s = retry_for_s
        self.report = RobotReport()

    def join(self) -> None:
        """Register and send the descriptor (again after an outage: idempotent)."""
        p = self.profile
        self.client.register(p.num_samples, p.labels)
        self.client.upload_descriptor(p.descriptor, p.summaries)

    def _retrying(self, step: Callable[[], T]) -> T:
        """Run a step; on a retryable error wait (backoff) and re-join, for ``retry_for_s``."""
        waited, backoff = 0.0, 0.1
        while True:
            try:
                return step()
            except CoordinatorCallError as exc:
                if not exc.retryable or waited >= self.retry_for_s or self.stop.is_set():
                    raise
                log.info("robot %s: %s; retrying in %.1f s", self.client.robot_id, exc, backoff)
            if self.stop.wait(backoff):
                raise CoordinatorCallError("stop", grpc.StatusCode.CANCELLED, "robot stopped")
            waited += backoff
            backoff = min(2.0, backoff * 2)
            try:
                self.join()
            except CoordinatorCallError as exc:
                if not exc.retryable:
                    raise

    def run(self) -> RobotReport:
        rid = self.client.robot_id
        self._retrying(self.join)
        last = -1
        while not self.stop.is_set():
            plan = self._retrying(partial(self.client.round_plan, last, wait_s=self.poll_s))
            if plan.action is PlanAction.FINISHED:
                self.report.finished = True
                break
            if plan.action is PlanAction.WAIT:
                continue
            rnd = plan.round
            model = self._retrying(partial(self.client.download_model, rnd))
            update = self.train(rnd, model.task)
            try:
                receipt = self._retrying(partial(self.client.upload_update, rnd, update))
                log.debug(
                    "robot %s: round %d accepted (%d/%d)",
                    rid,
                    rnd,
                    receipt.accepted,
                    receipt.selected,
                )
                self.report.rounds.append(rnd)
            except CoordinatorCallError as exc:
                if exc.code is grpc.StatusCode.ALREADY_EXISTS:
                    self.report.rounds.append(rnd)  # delivered before a lost reply
                elif exc.code is grpc.StatusCode.FAILED_PRECONDITION:
                    log.info("robot %s: round %d update not taken: %s", rid, rnd, exc.details)
                else:
                    raise
            last = rnd
        return self.report


def run_robot(
    client: CoordinatorClient,
    profile: RobotProfile,
    train: TrainFn,
    *,
    stop: threading.Event | None = None,
    poll_s: float = 10.0,
    retry_for_s: float = 120.0,
) -> RobotReport:
    """Take part in the run until it finishes (or ``stop`` is set); returns what was done."""
    loop = RobotLoop(client, profile, train, stop=stop, poll_s=poll_s, retry_for_s=retry_for_s)
    return loop.run()
