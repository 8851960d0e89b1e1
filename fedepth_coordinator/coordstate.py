"""The state the coordinator's parts share: the fleet, the run and the one lock guarding them.

:class:`CoordinatorState` is the only mutable state of a
:class:`~fedepth_coordinator.handlers.Coordinator` besides each part's own bookkeeping (transfer
counts, the robots warned about their sample counts). Every part holds the same instance and
reads or changes it only while holding ``cond``; the queries here (:meth:`~CoordinatorState.
ready`, :meth:`~CoordinatorState.require_strategy`, ...) expect the caller to hold it too.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from fedepth.rounds import quorum_of
from fedepth.strategies import ClientInfo, ClusteredStrategy, Strategy
from fedepth_coordinator.config import CoordinatorConfig
from fedepth_coordinator.domain import Phase
from fedepth_coordinator.errors import (
    FailedPreconditionError,
    NotFoundError,
    PermissionDeniedError,
    shown,
)
from fedepth_coordinator.state.base import (
    Checkpoint,
    RobotRecord,
    RoundRecord,
    Store,
    UpdateRecord,
)

#: Every part logs as the coordinator always has (one logger, whatever module the line is in).
log = logging.getLogger("fedepth_coordinator.handlers")

#: The blob holding the run's starting model.
INITIAL_BLOB = "initial"


@dataclass
class OpenRound:
    """The round in progress: its record, the updates accepted, the uploads still streaming."""

    record: RoundRecord
    reported: dict[str, UpdateRecord] = field(default_factory=dict)
    uploading: set[str] = field(default_factory=set)


def client_info(r: RobotRecord) -> ClientInfo:
    """What the strategy knows of a robot."""
    return ClientInfo(
        cid=r.robot_id,
        num_samples=r.num_samples,
        descriptor=r.descriptor,
        labels=dict(r.labels),
        extra=dict(r.summaries),
    )


def check_caller(caller: str, robot_id: str) -> None:
    """A robot acts in its own name only."""
    if caller != robot_id:
        raise PermissionDeniedError(
            f"principal {caller!r} may not act as robot {shown(robot_id)}: a robot can only "
            "send requests in its own name"
        )


def some(keys: list[str]) -> str:
    """The first few of ``keys``, for a log line."""
    return ", ".join(keys[:5]) + (", ..." if len(keys) > 5 else "")


@dataclass(eq=False)
class CoordinatorState:
    """Fleet and round state of one federated run, guarded by ``cond`` (one lock, one
    condition: a change that may unblock a waiting round plan notifies it)."""

    config: CoordinatorConfig
    store: Store
    clock: Callable[[], float] = time.time
    #: the served model's card (JSON), sent in every model header; None: no card
    model_card: str | None = None
    #: builds the strategy (default: ``create_strategy`` with the config's name and params)
    strategy_factory: Callable[[], Strategy] | None = None
    #: the starting model until the run starts (then only in its blob), and its tensor order
    initial: dict[str, np.ndarray] | None = None
    model_order: list[str] = field(default_factory=list)
    cond: threading.Condition = field(default_factory=threading.Condition)
    robots: dict[str, RobotRecord] = field(default_factory=dict)
    #: time.monotonic() of each robot's last call
    last_seen: dict[str, float] = field(default_factory=dict)
    strategy: Strategy | None = None
    members: list[str] = field(default_factory=list)
    member_set: set[str] = field(default_factory=set)
    num_initial: int = 0
    rounds_done: int = 0
    checkpoint: Checkpoint | None = None
    open_round: OpenRound | None = None
    finished: bool = False
    #: the robots a fleet is being formed with (None: no formation in progress)
    forming: set[str] | None = None
    #: True while the open round waits for an operator's ReleaseRound (rounds.hold_after)
    held: bool = False
    history: list[RoundRecord] = field(default_factory=list)

    @property
    def phase(self) -> Phase:
        if self.strategy is None:
            return Phase.WAITING_FOR_FLEET
        return Phase.FINISHED if self.finished else Phase.TRAINING

    @property
    def chunk_bytes(self) -> int:
        return self.config.server.chunk_bytes

    def robot(self, robot_id: str) -> RobotRecord:
        try:
            return self.robots[robot_id]
        except KeyError:
            raise NotFoundError(
                f"robot {shown(robot_id)} is not registered; call Register first"
            ) from None

    def touch(self, robot_id: str) -> None:
        self.last_seen[robot_id] = time.monotonic()

    def expected_dim(self) -> int | None:
        """The descriptor dimension every robot must send: configured, else the members' once
        the fleet formed (None before: any dimension is stored, the majority's forms it)."""
        if self.config.validation.descriptor_dim is not None:
            return self.config.validation.descriptor_dim
        if self.members:
            d = self.robots[self.members[0]].descriptor
            return None if d is None else d.dim
        return None

    def ready(self) -> list[str]:
        """Robots with a descriptor of the fleet's dimension, sorted by id."""
        dim = self.expected_dim()
        if dim is None:  # not fixed yet: the dimension most robots sent (one robot cannot
            # impose its own on the fleet by sending first)
            dims = Counter(r.descriptor.dim for r in self.robots.values() if r.descriptor)
            dim = min(dims, key=lambda d: (-dims[d], d)) if dims else None
        return sorted(
            rid
            for rid, r in self.robots.items()
            if r.descriptor is not None and r.descriptor.dim == dim
        )

    def require_strategy(self) -> Strategy:
        if self.strategy is None:
            ready, need = len(self.ready()), self.config.rounds.min_robots
            raise FailedPreconditionError(
                f"the fleet has not formed yet ({ready}/{need} robots registered with a "
                "descriptor): try again once training has started"
            )
        return self.strategy

    def quorum(self, selected: int) -> int:
        """The reports that close a round of ``selected`` robots at its deadline (the round
        driver's rule)."""
        return quorum_of(self.config.rounds.quorum, selected)

    def clusters_of(self, robot_id: str) -> tuple[int, ...]:
        s = self.strategy
        if not isinstance(s, ClusteredStrategy) or robot_id not in self.member_set:
            return ()
        return tuple(int(k) for k in np.flatnonzero(s.M_star[:, s.index(robot_id)]))

    def describe_clusters(self) -> str:
        s = self.strategy
        if not isinstance(s, ClusteredStrategy):
            return "no clusters"
        overlap = float((s.M_star.sum(axis=0) > 1).mean())
        return f"{s.M_star.shape[0]} clusters, overlap {overlap:.0%}"
