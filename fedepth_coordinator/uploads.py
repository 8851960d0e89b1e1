"""The upload sink: an update checked while it streams, spilled to a blob, then recorded.

An upload is checked against the robot's task (names, shapes, dtypes, finite values, optional
norm bound) while it streams into a blob, by a worker thread while the gRPC thread receives the
next chunks; only a complete, valid, durable update is recorded (and may close the round).
Its aggregation weight follows ``validation.sample_weights``.
"""

from __future__ import annotations

from collections.abc import Iterable

from fedepth_coordinator.blobs import start_blob
from fedepth_coordinator.coordstate import CoordinatorState, check_caller, log
from fedepth_coordinator.domain import UpdateHeader, UploadReceipt
from fedepth_coordinator.errors import (
    AbortedError,
    AlreadyExistsError,
    FailedPreconditionError,
    InvalidArgumentError,
)
from fedepth_coordinator.pipeline import consume_in_worker
from fedepth_coordinator.rounds import RoundController
from fedepth_coordinator.state.base import RobotRecord, UpdateRecord
from fedepth_coordinator.tensors import STATE, Layout, StreamChecker, check_matches
from fedepth_coordinator.transfers import TransferSlots

MAX_METRICS = 64
#: Chunks of an upload received but not yet checked and written, at most (per transfer).
SPILL_QUEUE_CHUNKS = 2


class UploadSink:
    """Receives the robots' updates of the open round."""

    def __init__(
        self, state: CoordinatorState, rounds: RoundController, transfers: TransferSlots
    ) -> None:
        self._state = state
        self._rounds = rounds
        self._transfers = transfers
        #: robots told once that their claimed sample count was clipped to the registered one
        self.overclaimed: set[str] = set()

    def upload(
        self, caller: str, header: UpdateHeader, chunks: Iterable[bytes | memoryview]
    ) -> UploadReceipt:
        """Check, spill and record one update; closes the round when it completes it."""
        s = self._state
        robot_id, rnd = header.robot_id, header.round
        check_caller(caller, robot_id)
        if header.num_samples <= 0:
            raise InvalidArgumentError(f"num_samples must be > 0, got {header.num_samples}")
        if header.num_steps < 0:
            raise InvalidArgumentError(f"num_steps must be >= 0, got {header.num_steps}")
        if len(header.metrics) > MAX_METRICS:
            raise InvalidArgumentError(f"at most {MAX_METRICS} metrics, got {len(header.metrics)}")
        validation = s.config.validation
        with s.cond:
            weight = self.sample_weight(s.robot(robot_id), header.num_samples)
            s.touch(robot_id)
            s.require_strategy()
            self._rounds.open_round_for(robot_id, rnd)
            self.check_not_duplicate(robot_id, rnd)
            reference = self._rounds.task(rnd, robot_id).state
            check_matches(
                header.layout,
                Layout.of({STATE: reference}).groups[0],
                max_extra_groups=validation.max_extra_groups,
            )
            assert s.open_round is not None
            s.open_round.uploading.add(robot_id)
        key = f"upd-r{rnd:06d}-{robot_id}"
        try:
            checker = StreamChecker(
                header.layout,
                reference=reference,
                bounds=validation.update_bounds(),
            )
            with self._transfers.slots, start_blob(s.store, key, header.layout) as writer:

                def spill(chunk: bytes | memoryview) -> None:
                    checker.feed(chunk)
                    writer.write(chunk)

                # check and write in a worker while this thread receives the next chunks
                consume_in_worker(chunks, spill, depth=SPILL_QUEUE_CHUNKS, name=f"spill-{key}")
                checker.finish()
                writer.commit()
        finally:
            with s.cond:
                if s.open_round is not None:
                    s.open_round.uploading.discard(robot_id)
        with s.cond:
            if s.open_round is None or s.open_round.record.round != rnd:
                s.store.delete_blob(key)
                raise FailedPreconditionError(
                    f"round {rnd} closed while the upload was streaming (late); the update "
                    "was discarded: ask for the round plan"
                )
            record = UpdateRecord(
                rnd, robot_id, weight, header.num_steps, dict(header.metrics), key
            )
            s.store.add_update(record)
            s.open_round.reported[robot_id] = record
            selected = len(s.open_round.record.selected)
            accepted = len(s.open_round.reported)
            self._rounds.maybe_close()
            s.cond.notify_all()
            return UploadReceipt(rnd, accepted, selected)

    def sample_weight(self, robot: RobotRecord, claimed: int) -> int:
        """The aggregation weight of an update claiming ``claimed`` samples (never more than the
        robot registered; see validation.sample_weights)."""
        policy, registered = self._state.config.validation.sample_weights, robot.num_samples
        if policy == "equal":
            return 1
        if policy == "registered":
            return registered
        if claimed != registered and policy == "strict":
            raise InvalidArgumentError(
                f"the update claims {claimed} samples but robot {robot.robot_id!r} registered "
                f"{registered} (validation.sample_weights: strict): re-register with the count"
            )
        if claimed > registered and robot.robot_id not in self.overclaimed:
            # once per robot: a robot_node registers with the frames it had buffered when it
            # joined and trains on more later, every round
            self.overclaimed.add(robot.robot_id)
            log.warning(
                "robot %s claims %d samples, registered %d: weighted %d (said once per robot)",
                robot.robot_id,
                claimed,
                registered,
                registered,
            )
        return min(claimed, registered)

    def check_not_duplicate(self, robot_id: str, rnd: int) -> None:
        """ALREADY_EXISTS for a recorded update, ABORTED for one still streaming (lock held)."""
        r = self._state.open_round
        assert r is not None
        if robot_id in r.reported:
            raise AlreadyExistsError(
                f"robot {robot_id!r} already uploaded its update for round {rnd}"
            )
        if robot_id in r.uploading:
            raise AbortedError(
                f"an upload from robot {robot_id!r} for round {rnd} is still in progress and "
                "nothing is recorded yet: retry shortly (it is accepted or dropped when it ends)"
            )
