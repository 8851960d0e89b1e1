"""Forming the fleet: the strategy initialized with the ready robots, and late joins.

Once ``rounds.min_robots`` robots are ready (registered with a descriptor of the fleet's
dimension), the strategy is initialized with them sorted by id, the run is recorded and round 0
opens. The formation work (``initialize``: divergences, PACFL's principal angles) runs without
the lock, so the coordinator answers other calls meanwhile; the robots it is formed with cannot
change their records until it is done (ABORTED). A robot that becomes ready later is placed by
``strategy.add_client``.
"""

from __future__ import annotations

from fedepth.strategies import Strategy
from fedepth_coordinator.blobs import write_blob
from fedepth_coordinator.checkpoints import Checkpoints
from fedepth_coordinator.coordstate import (
    INITIAL_BLOB,
    CoordinatorState,
    OpenRound,
    client_info,
    log,
)
from fedepth_coordinator.errors import (
    AbortedError,
    FailedPreconditionError,
    InvalidArgumentError,
)
from fedepth_coordinator.rounds import RoundController
from fedepth_coordinator.state.base import RunRecord
from fedepth_coordinator.tensors import STATE


class Formation:
    """Forms the fleet once, and lets robots join the formed one."""

    def __init__(
        self, state: CoordinatorState, checkpoints: Checkpoints, rounds: RoundController
    ) -> None:
        self._state = state
        self._checkpoints = checkpoints
        self._rounds = rounds

    def check_not_forming(self, robot_id: str) -> None:
        """ABORTED while the fleet is being formed with this robot (lock held)."""
        forming = self._state.forming
        if forming is not None and robot_id in forming:
            raise AbortedError(
                f"the fleet is being formed with robot {robot_id!r}'s current registration and "
                "descriptor, which cannot change meanwhile: retry shortly"
            )

    def after_fleet_change(self, robot_id: str) -> None:
        """A robot's record changed (lock held); one that is ready joins a running fleet (the
        caller then calls :meth:`form_fleet`, outside the lock, for a fleet not formed yet)."""
        s = self._state
        if s.strategy is None or s.forming is not None:
            return
        if robot_id not in s.member_set and s.robots[robot_id].descriptor is not None:
            self.join(robot_id)

    def form_fleet(self) -> None:
        """Form the fleet once enough robots are ready (call it without the lock)."""
        s = self._state
        with s.cond:
            if s.strategy is not None or s.forming is not None:
                return
            ready = s.ready()
            if len(ready) < s.config.rounds.min_robots:
                return
            assert s.initial is not None
            infos = [client_info(s.robots[r]) for r in ready]
            initial = s.initial
            s.forming = set(ready)
        try:
            strategy = self._checkpoints.new_strategy()
            try:
                strategy.initialize(infos, initial)
            except ValueError as exc:
                raise FailedPreconditionError(
                    f"the fleet of {len(ready)} robots could not be formed: {exc}"
                ) from exc
            with s.cond:
                self._start_run(strategy, ready)
        finally:
            with s.cond:
                s.forming = None
        with s.cond:  # robots that became ready while it was formed join now
            for rid in s.ready():
                if rid not in s.member_set:
                    try:
                        self.join(rid)
                    except (FailedPreconditionError, InvalidArgumentError) as exc:
                        log.warning("robot %s did not join the formed fleet: %s", rid, exc)

    def _start_run(self, strategy: Strategy, ready: list[str]) -> None:
        """Record the run of a formed strategy and open round 0 (lock held)."""
        s = self._state
        assert s.initial is not None
        s.strategy = strategy
        s.members, s.member_set, s.num_initial = list(ready), set(ready), len(ready)
        s.rounds_done = 0
        try:
            write_blob(s.store, INITIAL_BLOB, {STATE: s.initial}, chunk_bytes=s.chunk_bytes)
            checkpoint = self._checkpoints.write()
            first = self._rounds.new_round(0)
            s.store.start_run(RunRecord(INITIAL_BLOB, checkpoint, first))
        except BaseException:
            s.strategy = None
            s.members, s.member_set, s.num_initial = [], set(), 0
            raise
        s.checkpoint = checkpoint
        s.open_round = OpenRound(first)
        s.initial = None  # the strategy holds the model now; the blob keeps the original
        log.info(
            "fleet formed with %d robots (strategy %s, %s); round 0 opened for %d robots",
            len(ready),
            strategy.name,
            s.describe_clusters(),
            len(first.selected),
        )
        s.cond.notify_all()

    def join(self, robot_id: str) -> None:
        """Add a ready robot to the formed fleet and checkpoint (lock held)."""
        s = self._state
        strategy = s.require_strategy()
        try:
            strategy.add_client(client_info(s.robots[robot_id]))
        except NotImplementedError as exc:
            raise FailedPreconditionError(
                f"strategy {strategy.name} does not accept robots after the fleet formed: {exc}"
            ) from exc
        except ValueError as exc:
            raise InvalidArgumentError(f"robot {robot_id!r} cannot join: {exc}") from exc
        s.members.append(robot_id)
        s.member_set.add(robot_id)
        old = s.checkpoint
        checkpoint = self._checkpoints.write()
        s.store.save_checkpoint(checkpoint)
        s.checkpoint = checkpoint
        if old is not None:
            s.store.delete_blob(old.blob)
        log.info(
            "robot %s joined the running fleet in clusters %s",
            robot_id,
            list(s.clusters_of(robot_id)),
        )
