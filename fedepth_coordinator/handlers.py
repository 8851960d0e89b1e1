"""The coordinator's logic, free of gRPC: fleet, rounds, uploads, routing, persistence.

:class:`Coordinator` runs one fedepth :class:`~fedepth.strategies.Strategy` unchanged:

- robots register and send descriptors; once ``rounds.min_robots`` are ready the strategy is
  initialized with them (sorted by id) and round 0 opens. A robot that becomes ready later is
  placed by ``strategy.add_client`` (FeDepth routes its descriptor).
- a round selects members (seeded fraction), serves each one ``configure_train``'s task with
  the run's training recipe (config section ``training``), and closes when every selected
  robot reported, or when a quorum has and the deadline passed.
- an upload is checked against the robot's task (names, shapes, dtypes, finite values, optional
  norm bound) while it streams into a blob; only then is it recorded. Aggregation reads the
  spilled blobs tensor by tensor, so memory does not grow with the number of updates.
- after every aggregation the strategy state and round bookkeeping are stored in one
  transaction; accepted uploads of the open round are stored as they arrive. A coordinator
  restarted on the same store resumes the open round with the uploads it had accepted.

Every public method takes the authenticated caller and raises
:class:`~fedepth_coordinator.errors.CoordinatorError` subclasses with actionable messages.

:class:`Coordinator` is the facade the servicer calls; the work is done by its parts, which
share one :class:`~fedepth_coordinator.coordstate.CoordinatorState` (and its lock):

- :class:`~fedepth_coordinator.fleet.FleetRegistry`: registration, descriptors, their checks
- :class:`~fedepth_coordinator.formation.Formation`: forming the fleet, late joins
- :class:`~fedepth_coordinator.rounds.RoundController`: selection, plans, tasks, closing rounds
- :class:`~fedepth_coordinator.uploads.UploadSink`: receiving, checking and spilling updates
- :class:`~fedepth_coordinator.router.Router`: Route, the cluster map, the fleet status
- :class:`~fedepth_coordinator.checkpoints.Checkpoints`: the strategy, checkpoints, restoring
- :class:`~fedepth_coordinator.transfers.TransferSlots`: weight streams in flight
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping

import numpy as np

from fedepth.descriptor import Descriptor
from fedepth.models.state import State
from fedepth.strategies import Strategy
from fedepth_coordinator.checkpoints import Checkpoints
from fedepth_coordinator.config import CoordinatorConfig
from fedepth_coordinator.coordstate import INITIAL_BLOB, CoordinatorState, OpenRound, log
from fedepth_coordinator.domain import (
    ClusterMap,
    DescriptorAck,
    FleetStatus,
    ModelStream,
    Phase,
    Registration,
    RoundPlan,
    RoundRelease,
    RouteStream,
    UpdateHeader,
    UploadReceipt,
)
from fedepth_coordinator.errors import FailedPreconditionError
from fedepth_coordinator.fleet import MAX_LABEL_CHARS, MAX_LABELS, FleetRegistry
from fedepth_coordinator.formation import Formation
from fedepth_coordinator.rounds import RoundController
from fedepth_coordinator.router import Router
from fedepth_coordinator.state.base import Checkpoint, Store
from fedepth_coordinator.transfers import TransferSlots
from fedepth_coordinator.uploads import MAX_METRICS, SPILL_QUEUE_CHUNKS, UploadSink

__all__ = [
    "INITIAL_BLOB",
    "MAX_LABELS",
    "MAX_LABEL_CHARS",
    "MAX_METRICS",
    "SPILL_QUEUE_CHUNKS",
    "Coordinator",
]


class Coordinator:
    """Fleet and round state of one federated run (thread-safe; one lock, one condition)."""

    def __init__(
        self,
        config: CoordinatorConfig,
        store: Store,
        initial_model: Mapping[str, np.ndarray],
        *,
        clock: Callable[[], float] = time.time,
        strategy_factory: Callable[[], Strategy] | None = None,
        model_card: str | None = None,
    ) -> None:
        self._state = state = CoordinatorState(
            config,
            store,
            clock,
            model_card=model_card,
            strategy_factory=strategy_factory,
            initial=dict(initial_model),
            model_order=list(initial_model),
        )
        self._transfers = TransferSlots(state)
        self._checkpoints = Checkpoints(state)
        self._rounds = RoundController(state, self._checkpoints, self._transfers)
        self._formation = Formation(state, self._checkpoints, self._rounds)
        # built once now: a strategy that cannot take the configured rule refuses to start,
        # and robots learn at Register which data summaries it needs (and send no others)
        probe = self._checkpoints.new_strategy()
        self.summaries_wanted = probe.client_summaries
        self._fleet = FleetRegistry(
            state,
            self._formation,
            summaries_wanted=self.summaries_wanted,
            strategy_name=probe.name,
        )
        self._uploads = UploadSink(state, self._rounds, self._transfers)
        self._router = Router(state, self._fleet, self._transfers)
        if not self._checkpoints.restore():
            try:
                self._formation.form_fleet()  # enough robots may have been ready before a restart
            except FailedPreconditionError as exc:
                log.warning("%s", exc)

    # -- what the parts share ----------------------------------------------------------------
    @property
    def config(self) -> CoordinatorConfig:
        return self._state.config

    @property
    def store(self) -> Store:
        return self._state.store

    @property
    def clock(self) -> Callable[[], float]:
        return self._state.clock

    @property
    def model_card(self) -> str | None:
        """The served model's card (JSON), sent in every model header; None: no card."""
        return self._state.model_card

    @property
    def strategy_factory(self) -> Callable[[], Strategy] | None:
        """Builds the strategy (default: ``create_strategy`` with the config's name and params)."""
        return self._state.strategy_factory

    @property
    def phase(self) -> Phase:
        return self._state.phase

    @property
    def _round(self) -> OpenRound | None:
        """The open round (tests watch its uploads)."""
        return self._state.open_round

    @property
    def _checkpoint(self) -> Checkpoint | None:
        """The run's last checkpoint (tests check which blobs it keeps)."""
        return self._state.checkpoint

    @property
    def _streams(self) -> Counter[str]:
        """Weight streams each principal has open (tests watch them close)."""
        return self._transfers.streams

    # -- fleet -------------------------------------------------------------------------------
    def register(
        self,
        caller: str,
        robot_id: str,
        num_samples: int,
        labels: Mapping[str, str],
        *,
        model_card: str | None = None,
    ) -> Registration:
        return self._fleet.register(caller, robot_id, num_samples, labels, model_card=model_card)

    def upload_descriptor(
        self,
        caller: str,
        robot_id: str,
        descriptor: Descriptor,
        summaries: Mapping[str, np.ndarray],
    ) -> DescriptorAck:
        return self._fleet.upload_descriptor(caller, robot_id, descriptor, summaries)

    # -- rounds ------------------------------------------------------------------------------
    def round_plan(self, caller: str, robot_id: str, after_round: int, wait_s: float) -> RoundPlan:
        """The robot's plan; waits up to ``wait_s`` (capped) for one that is not WAIT."""
        return self._rounds.round_plan(caller, robot_id, after_round, wait_s)

    def download(
        self, caller: str, robot_id: str, rnd: int, latest: bool, initial: bool = False
    ) -> ModelStream:
        """The robot's task for round ``rnd`` (or, with ``latest``, its current model; with
        ``initial``, the run's initial model, the descriptors' frozen encoder)."""
        return self._rounds.download(caller, robot_id, rnd, latest, initial)

    def tick(self) -> float | None:
        """Close the open round if its deadline passed with a quorum; seconds to its deadline."""
        return self._rounds.tick()

    def release_round(self, caller: str, rnd: int) -> RoundRelease:
        """Open round ``rnd``, held by ``rounds.hold_after`` (operators: the interceptor lets
        no robot call it)."""
        return self._rounds.release(rnd)

    # -- uploads -----------------------------------------------------------------------------
    def upload(
        self, caller: str, header: UpdateHeader, chunks: Iterable[bytes | memoryview]
    ) -> UploadReceipt:
        """Check, spill and record one update; closes the round when it completes it."""
        return self._uploads.upload(caller, header, chunks)

    # -- routing and views -------------------------------------------------------------------
    def route(
        self,
        caller: str,
        descriptor: Descriptor | None,
        *,
        include_model: bool,
        labels: Mapping[str, str] | None = None,
        summaries: Mapping[str, np.ndarray] | None = None,
    ) -> RouteStream:
        """The clusters serving an unseen sequence and, optionally, their averaged model."""
        return self._router.route(
            caller, descriptor, include_model=include_model, labels=labels, summaries=summaries
        )

    def cluster_map(self) -> ClusterMap:
        return self._router.cluster_map()

    def fleet_status(self) -> FleetStatus:
        return self._router.fleet_status()

    def final_states(self) -> dict[str, State]:
        """Every member's current model (for tests and tools running in-process)."""
        return self._router.final_states()
