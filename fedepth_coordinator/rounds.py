"""The round controller: the coordinator's side of :class:`fedepth.rounds.RoundDriver`.

The round driver (the one the in-process simulation runs) owns the rules of a round; this
controller feeds it the coordinator's events. Opening a round asks it for the selection (all
members, or a seeded ``rounds.fraction``, sorted by id); every plan, download and upload asks
it for the robot's task (the strategy's ``configure_train`` with the run's training recipe);
every upload streams through the checks of its update bounds (``validation``); after every
accepted upload and every deadline tick it says whether the round closes (every selected robot
reported, or a quorum has and the deadline passed); closing has it aggregate the spilled
updates in the selection's (robot-id) order, then checkpoints the strategy and records the
round in one store transaction.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import replace

import numpy as np

from fedepth.rounds import RoundDriver, RoundRules
from fedepth.strategies import ClientUpdate, TrainTask
from fedepth.updates import UpdateBounds
from fedepth_coordinator.blobs import BlobReader
from fedepth_coordinator.checkpoints import Checkpoints
from fedepth_coordinator.coordstate import (
    INITIAL_BLOB,
    CoordinatorState,
    OpenRound,
    check_caller,
    log,
)
from fedepth_coordinator.domain import (
    ModelHeader,
    ModelStream,
    PlanAction,
    RoundPlan,
    RoundRelease,
)
from fedepth_coordinator.errors import FailedPreconditionError, InvalidArgumentError
from fedepth_coordinator.state.base import CorruptBlobError, RoundRecord
from fedepth_coordinator.tensors import STATE, Layout
from fedepth_coordinator.transfers import TransferSlots

#: The round number in the header of an initial-model download (no round's task).
INITIAL_ROUND = -1


def task_groups(task: TrainTask) -> dict[str, Mapping[str, np.ndarray]]:
    """The tensor groups a task is streamed as: ``state`` first, then the hook state."""
    if STATE in task.hook_state:
        raise RuntimeError(f"hook state may not use the reserved name {STATE!r}")
    return {STATE: task.state, **task.hook_state}


class RoundController:
    """Opens, serves and closes the run's rounds. :meth:`round_plan`, :meth:`download` and
    :meth:`tick` take the state's lock; the other methods expect it held."""

    def __init__(
        self, state: CoordinatorState, checkpoints: Checkpoints, transfers: TransferSlots
    ) -> None:
        self._state = state
        self._checkpoints = checkpoints
        self._transfers = transfers
        r = state.config.rounds
        self._rules = RoundRules(
            r.num_rounds, r.fraction, r.quorum, r.deadline_s, r.seed, sorted_ids=True
        )
        #: the update bounds every upload's stream is checked against (validation section)
        self.bounds: UpdateBounds = state.config.validation.update_bounds()

    def driver(self) -> RoundDriver:
        """The round driver of the run's strategy (FAILED_PRECONDITION before the fleet formed)."""
        s = self._state
        num_rounds = self._rules.num_rounds
        return RoundDriver(
            s.require_strategy(),
            self._rules,
            recipe=lambda rnd: s.config.training.recipe(rnd, num_rounds),
            bounds=self.bounds,
            clock=s.clock,
        )

    # -- opening -----------------------------------------------------------------------------
    def new_round(self, number: int) -> RoundRecord:
        """Round ``number``'s record: its seeded selection and deadline."""
        s = self._state
        selected = self.driver().select(number, s.members)
        now = s.clock()
        return RoundRecord(number, selected, now, now + s.config.rounds.deadline_s)

    def task(self, rnd: int, robot_id: str) -> TrainTask:
        """The strategy's task for the robot, with the run's training recipe."""
        return self.driver().task(rnd, robot_id)

    def open_round_for(self, robot_id: str, rnd: int) -> RoundRecord:
        """The open round, which must be ``rnd`` and have selected the robot."""
        s = self._state
        if s.open_round is None:
            raise FailedPreconditionError(
                f"round {rnd} is not open: the run finished after {s.rounds_done} rounds"
            )
        r = s.open_round.record
        if rnd != r.round:
            state = "closed" if rnd < r.round else "not open yet"
            raise FailedPreconditionError(
                f"round {rnd} is {state}; the open round is {r.round}: ask for the round plan"
            )
        if s.held:
            raise FailedPreconditionError(
                f"round {rnd} is held until an operator releases it: ask for the round plan"
            )
        if robot_id not in r.selected:
            raise FailedPreconditionError(
                f"robot {robot_id!r} is not selected for round {r.round}"
            )
        return r

    # -- serving -----------------------------------------------------------------------------
    def plan(self, robot_id: str, after_round: int) -> RoundPlan:
        """The robot's plan now (no waiting)."""
        s = self._state
        num_rounds = s.config.rounds.num_rounds

        def wait(reason: str, rnd: int = s.rounds_done) -> RoundPlan:
            return RoundPlan(PlanAction.WAIT, s.phase, rnd, num_rounds, reason=reason)

        if s.strategy is None:
            ready = len(s.ready())
            return wait(
                f"waiting for the fleet: {ready}/{s.config.rounds.min_robots} robots "
                "registered with a descriptor"
            )
        if s.finished or s.open_round is None:
            return RoundPlan(PlanAction.FINISHED, s.phase, s.rounds_done, num_rounds)
        r = s.open_round.record
        if s.held:
            return wait(f"round {r.round} is held until an operator releases it", r.round)
        if robot_id not in s.member_set:
            return wait(f"robot {robot_id} is not a member yet: upload its descriptor", r.round)
        if robot_id not in r.selected:
            return wait(f"not selected for round {r.round}", r.round)
        if robot_id in s.open_round.reported:
            return wait(f"round {r.round} already reported", r.round)
        if r.round <= after_round:
            return wait(f"round {r.round} is not after round {after_round}", r.round)
        layout = Layout.of(task_groups(self.task(r.round, robot_id)))
        return RoundPlan(
            PlanAction.TRAIN,
            s.phase,
            r.round,
            num_rounds,
            deadline_unix=r.deadline,
            model_bytes=layout.total_bytes,
        )

    def round_plan(self, caller: str, robot_id: str, after_round: int, wait_s: float) -> RoundPlan:
        """The robot's plan; waits up to ``wait_s`` (capped) for one that is not WAIT."""
        s = self._state
        check_caller(caller, robot_id)
        if not math.isfinite(wait_s) or wait_s < 0:
            raise InvalidArgumentError(
                f"wait_s must be a finite number of seconds >= 0, got {wait_s!r}"
            )
        end = time.monotonic() + min(wait_s, s.config.server.max_wait_s)
        with s.cond:
            s.robot(robot_id)
            while True:
                s.touch(robot_id)
                plan = self.plan(robot_id, after_round)
                remaining = end - time.monotonic()
                if plan.action is not PlanAction.WAIT or remaining <= 0:
                    return plan
                s.cond.wait(remaining)

    def download(
        self, caller: str, robot_id: str, rnd: int, latest: bool, initial: bool = False
    ) -> ModelStream:
        """The robot's task for round ``rnd`` (or, with ``latest``, its current model; with
        ``initial``, the run's initial model)."""
        s = self._state
        check_caller(caller, robot_id)
        if initial:
            if latest:
                raise InvalidArgumentError("a download asks for latest or initial, not both")
            return self.initial_model(caller)
        with s.cond:
            s.robot(robot_id)
            s.touch(robot_id)
            s.require_strategy()
            if robot_id not in s.member_set:
                raise FailedPreconditionError(
                    f"robot {robot_id!r} is not a member of the run yet: upload its descriptor"
                )
            if latest:
                assert s.strategy is not None
                task = TrainTask(state=s.strategy.model_for(robot_id))
                rnd = s.rounds_done
            else:
                r = self.open_round_for(robot_id, rnd)
                task = self.task(r.round, robot_id)
        groups = task_groups(task)
        header = ModelHeader(
            rnd,
            Layout.of(groups),
            task.hook,
            dict(task.hook_params),
            recipe=task.recipe,
            card=s.model_card,
        )
        return ModelStream(header, self._transfers.payload(list(groups.values()), caller))

    def initial_model(self, caller: str) -> ModelStream:
        """The run's initial model, the frozen encoder of every descriptor (FeDepth Sec. 3.3):
        a robot or depth node without weights of its own describes its frames with it, so
        that every descriptor of the run comes from the same encoder. Any robot principal
        may download it, registered or not (a Route answer carries more), before the fleet
        forms (from memory) and after (from the run's initial blob, which a restart keeps)."""
        s = self._state
        with s.cond:
            held, card = s.initial, s.model_card
        state: Mapping[str, np.ndarray]
        if held is not None:
            state = held
        else:  # the run started: its initial blob is written once, never changed
            try:
                state = BlobReader(s.store, INITIAL_BLOB).read_all()[STATE]
            except (CorruptBlobError, OSError, KeyError, ValueError) as exc:
                log.error("the initial model cannot be served: %s", exc)
                raise FailedPreconditionError(
                    f"the run's initial model cannot be read: {exc}"
                ) from exc
        header = ModelHeader(INITIAL_ROUND, Layout.of({STATE: state}), card=card)
        return ModelStream(header, self._transfers.payload([state], caller))

    # -- closing -----------------------------------------------------------------------------
    def tick(self) -> float | None:
        """Close the open round if its deadline passed with a quorum; seconds to its deadline."""
        s = self._state
        with s.cond:
            self.maybe_close()
            if s.open_round is None:
                return None
            return max(0.0, s.open_round.record.deadline - s.clock())

    def maybe_close(self) -> None:
        """Close the open round if it is complete, or has a quorum at its deadline."""
        s = self._state
        r = s.open_round
        if r is None or s.held:
            return
        reason = self.driver().close_reason(
            len(r.reported), len(r.record.selected), s.clock(), r.record.deadline
        )
        if reason is not None:
            self.close_round(reason)

    def close_round(self, closed_by: str) -> None:
        """Aggregate the open round, checkpoint, record it and open the next one."""
        s = self._state
        assert s.open_round is not None and s.strategy is not None
        r = s.open_round
        rnd = r.record.round
        t0 = time.monotonic()
        order = s.model_order
        updates = []
        for robot_id in sorted(r.reported):  # reading order; the driver aggregates in its own
            rec = r.reported[robot_id]
            try:
                reader = BlobReader(s.store, rec.blob)
            except (CorruptBlobError, OSError, KeyError, ValueError) as exc:
                # changed on disk since it was accepted: never aggregated (nor served)
                where = s.store.quarantine_blob(rec.blob)
                log.error(
                    "round %d: the accepted update of robot %s is left out of the aggregate: "
                    "%s; moved to %s",
                    rnd,
                    robot_id,
                    exc,
                    where or "(kept in place)",
                )
                del r.reported[robot_id]
                continue
            updates.append(
                ClientUpdate(
                    cid=robot_id,
                    state=reader.lazy(STATE, order),
                    num_samples=rec.num_samples,
                    num_steps=rec.num_steps,
                    extra={g.name: reader.lazy(g.name) for g in reader.layout.groups[1:]},
                    metrics=dict(rec.metrics),
                )
            )
        try:
            self.driver().aggregate(rnd, r.record.selected, {u.cid: u for u in updates})
            s.rounds_done = rnd + 1
            checkpoint = self._checkpoints.write()
        except Exception:
            log.exception("aggregating round %d failed; reloading the last checkpoint", rnd)
            assert s.checkpoint is not None
            self._checkpoints.load(s.checkpoint)
            raise
        more = s.rounds_done < s.config.rounds.num_rounds
        next_round = self.new_round(s.rounds_done) if more else None
        closed = replace(
            r.record,
            closed_at=s.clock(),
            reported=tuple(sorted(r.reported)),
            closed_by=closed_by,
        )
        s.store.close_round(closed, checkpoint, next_round)
        old = s.checkpoint
        s.checkpoint = checkpoint
        s.history.append(closed)
        s.open_round = None if next_round is None else OpenRound(next_round)
        s.finished = next_round is None
        s.held = next_round is not None and rnd in s.config.rounds.hold_after
        for rec in r.reported.values():
            s.store.delete_blob(rec.blob)
        if old is not None:
            s.store.delete_blob(old.blob)
        log.info(
            "round %d/%d closed (%s): %d/%d updates, quorum %d, open %.1f s, aggregated in "
            "%.2f s; %s",
            rnd + 1,
            s.config.rounds.num_rounds,
            closed_by,
            len(r.reported),
            len(r.record.selected),
            s.quorum(len(r.record.selected)),
            s.clock() - r.record.opened_at,
            time.monotonic() - t0,
            f"round {next_round.round} {'held' if s.held else 'opened'}"
            if next_round
            else "run finished",
        )
        s.cond.notify_all()

    # -- holds -------------------------------------------------------------------------------
    def release(self, rnd: int) -> RoundRelease:
        """Open round ``rnd``, held after its predecessor closed (rounds.hold_after); its
        deadline counts from now. A repeated call for a round already open (or closed) is a
        no-op; a round not reached yet is FAILED_PRECONDITION."""
        s = self._state
        with s.cond:
            s.require_strategy()
            r = s.open_round
            current = s.rounds_done if r is None else r.record.round
            if rnd > current or (rnd == current and r is None):
                raise FailedPreconditionError(
                    f"round {rnd} is not held: the run is at round {current} "
                    f"({s.rounds_done} done); release a round once its predecessor closed"
                )
            if rnd < current or not s.held:
                return RoundRelease(rnd, False)
            assert r is not None
            now = s.clock()
            r.record = replace(r.record, opened_at=now, deadline=now + s.config.rounds.deadline_s)
            s.held = False
            log.info("round %d released by an operator", rnd)
            s.cond.notify_all()
            return RoundRelease(rnd, True)
