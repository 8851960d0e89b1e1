"""The robot side of a run: register, send the descriptor, then train every planned round.

:func:`run_robot` is the loop a robot node (or a benchmark's client process) runs around a
:class:`~fedepth_coordinator.client.CoordinatorClient` and a training function; it survives a
coordinator restart (retryable errors are retried for ``retry_for_s`` and the robot re-joins,
which is idempotent); a duplicate upload (ALREADY_EXISTS) counts as delivered only once the
round plan confirms the coordinator recorded it, and an upload still in progress (ABORTED) is
retried.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, TypeVar

import grpc
import numpy as np

from fedepth.descriptor import Descriptor
from fedepth.strategies import ClientUpdate, TrainTask
from fedepth_coordinator.client import CoordinatorCallError, CoordinatorClient
from fedepth_coordinator.domain import PlanAction

if TYPE_CHECKING:  # fedepth.models (torchvision) is imported only when a card is checked
    from fedepth.models.card import ModelCard

log = logging.getLogger(__name__)

#: Local training: (round, task downloaded for it) -> the update to send back.
TrainFn = Callable[[int, TrainTask], ClientUpdate]

T = TypeVar("T")

#: Uploads of one round's update before the robot gives up on that round.
UPLOAD_ATTEMPTS = 3


class ModelChangedError(ValueError):
    """The coordinator serves another model than the one this robot joined with."""


@dataclass(frozen=True)
class RobotProfile:
    """What a robot tells the coordinator about itself (never its data)."""

    num_samples: int
    descriptor: Descriptor
    labels: Mapping[str, str] = field(default_factory=dict)
    summaries: Mapping[str, np.ndarray] = field(default_factory=dict)
    #: the model the robot can take (ModelCard JSON), declared at every Register; None: any
    model_card: str | None = None


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
        """Register and send the descriptor (again after an outage: idempotent), with only
        the data summaries the coordinator's strategy asked for at Register."""
        p = self.profile
        reg = self.client.register(p.num_samples, p.labels, model_card=p.model_card)
        wanted = {k: v for k, v in p.summaries.items() if k in reg.summaries}
        self.client.upload_descriptor(p.descriptor, wanted)

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
            self._check_card(rnd, model.card)
            update = self.train(rnd, model.task)
            if self._deliver(rnd, update):
                self.report.rounds.append(rnd)
            last = rnd
        return self.report

    def _check_card(self, rnd: int, served: ModelCard | None) -> None:
        """Every round's model is the one the robot joined with: a coordinator restarted on
        another model (its state wiped) is caught here, before training on weights that do
        not fit (the coordinator checks the card at every Register as well)."""
        if self.profile.model_card is None:
            return
        from fedepth.models.card import ModelCard

        mine = ModelCard.from_json(self.profile.model_card, "this robot's model card")
        diff = ["the model card"] if served is None else served.differences(mine)
        if diff:
            now = "a model without a card" if served is None else served.describe()
            raise ModelChangedError(
                f"round {rnd}: the coordinator now serves {now}, but this robot joined with "
                f"{mine.describe()} (differs in {', '.join(diff)}); restart the robot to "
                "build the served model"
            )

    def _deliver(self, rnd: int, update: ClientUpdate) -> bool:
        """Upload; True once the coordinator recorded the update. ALREADY_EXISTS counts only
        after the coordinator's plan confirms it (the round no longer asks for this update)."""
        rid = self.client.robot_id
        for _ in range(UPLOAD_ATTEMPTS):
            try:
                receipt = self._retrying(partial(self.client.upload_update, rnd, update))
                log.debug(
                    "robot %s: round %d accepted (%d/%d)",
                    rid,
                    rnd,
                    receipt.accepted,
                    receipt.selected,
                )
                return True
            except CoordinatorCallError as exc:
                if exc.code is grpc.StatusCode.FAILED_PRECONDITION:
                    log.info("robot %s: round %d update not taken: %s", rid, rnd, exc.details)
                    return False
                if exc.code is not grpc.StatusCode.ALREADY_EXISTS:
                    raise
            plan = self._retrying(partial(self.client.round_plan, rnd - 1, wait_s=0.0))
            if not (plan.action is PlanAction.TRAIN and plan.round == rnd):
                return True  # recorded before a lost reply: the round no longer asks for it
            log.warning(
                "robot %s: round %d upload reported as duplicate but not recorded", rid, rnd
            )
        return False


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
