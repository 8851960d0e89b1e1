"""The round controller alone, on a hand-formed fleet: selection, plans, closing rounds."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from fedepth_coordinator.blobs import write_blob
from fedepth_coordinator.checkpoints import Checkpoints
from fedepth_coordinator.coordstate import CoordinatorState
from fedepth_coordinator.domain import PlanAction, RoundRelease
from fedepth_coordinator.errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
)
from fedepth_coordinator.rounds import RoundController
from fedepth_coordinator.state.base import UpdateRecord
from fedepth_coordinator.tensors import STATE

Formed = Callable[..., tuple[CoordinatorState, Checkpoints, RoundController]]


def report(state: CoordinatorState, rid: str, shift: float, weight: int = 10) -> None:
    """Record an accepted update of the open round: the robot's model plus ``shift``."""
    assert state.open_round is not None and state.strategy is not None
    rnd = state.open_round.record.round
    model = state.strategy.model_for(rid)
    key = f"upd-r{rnd:06d}-{rid}"
    write_blob(state.store, key, {STATE: {k: v + np.float32(shift) for k, v in model.items()}})
    rec = UpdateRecord(rnd, rid, weight, 1, {}, key)
    state.store.add_update(rec)
    state.open_round.reported[rid] = rec


def close(state: CoordinatorState, rounds: RoundController) -> None:
    with state.cond:  # as the upload sink calls it
        rounds.maybe_close()


def test_selection_is_seeded_sorted_and_of_the_configured_fraction(formed_state: Formed) -> None:
    _, _, rounds = formed_state(6, fraction=0.5, seed=3)
    picks = [rounds.new_round(r).selected for r in range(4)]
    assert all(len(p) == 3 and list(p) == sorted(p) for p in picks)
    assert picks == [rounds.new_round(r).selected for r in range(4)]  # seeded by (seed, round)
    assert len(set(picks)) > 1
    record = rounds.new_round(0)
    assert record.opened_at == 1000.0 and record.deadline == 1000.0 + 120.0


def test_plans_say_why_a_robot_waits(formed_state: Formed) -> None:
    state, _, rounds = formed_state(4)
    rid = state.members[0]
    plan = rounds.plan(rid, -1)
    assert plan.action is PlanAction.TRAIN and plan.round == 0 and plan.model_bytes > 0
    assert "after round 0" in rounds.plan(rid, 0).reason
    assert "not a member yet" in rounds.plan("robot-999", -1).reason
    report(state, rid, 0.1)
    assert rounds.plan(rid, -1).reason == "round 0 already reported"
    with pytest.raises(InvalidArgumentError, match="wait_s must be a finite"):
        rounds.round_plan(rid, rid, -1, float("nan"))
    with pytest.raises(NotFoundError):
        rounds.round_plan("robot-999", "robot-999", -1, 0.0)
    state.strategy = None
    assert "waiting for the fleet: 4/4 robots" in rounds.plan(rid, -1).reason


def test_only_the_open_round_is_served_to_its_selected_robots(formed_state: Formed) -> None:
    state, _, rounds = formed_state(4, fraction=0.5)
    assert state.open_round is not None
    selected = state.open_round.record.selected
    other = next(r for r in state.members if r not in selected)
    assert rounds.open_round_for(selected[0], 0).round == 0
    with pytest.raises(FailedPreconditionError, match="round 1 is not open yet"):
        rounds.open_round_for(selected[0], 1)
    with pytest.raises(FailedPreconditionError, match="not selected for round 0"):
        rounds.open_round_for(other, 0)
    assert "not selected for round 0" in rounds.plan(other, -1).reason
    stream = rounds.download(selected[0], selected[0], 0, latest=False)
    assert stream.header.round == 0 and stream.header.recipe is not None
    stream.payload.close()
    latest = rounds.download(other, other, 5, latest=True)
    assert latest.header.round == 0 and latest.header.recipe is None
    latest.payload.close()
    with pytest.raises(FailedPreconditionError, match="not a member of the run"):
        state.robots["robot-999"] = state.robots[other]
        rounds.download("robot-999", "robot-999", 0, latest=True)
    state.open_round = None
    with pytest.raises(FailedPreconditionError, match="the run finished after 0 rounds"):
        rounds.open_round_for(selected[0], 0)


def test_a_round_closes_when_all_report_aggregating_in_id_order(formed_state: Formed) -> None:
    state, _, rounds = formed_state(4)
    old_checkpoint = state.checkpoint
    assert old_checkpoint is not None and state.strategy is not None
    before = {k: v.copy() for k, v in state.strategy.model_for(state.members[0]).items()}
    shifts = {rid: 0.1 * (i + 1) for i, rid in enumerate(state.members)}
    for rid in reversed(state.members):  # arrival order does not matter
        report(state, rid, shifts[rid], weight=10 * (len(shifts) - list(shifts).index(rid)))
        close(state, rounds)
    assert state.rounds_done == 1 and [h.closed_by for h in state.history] == ["all reported"]
    assert state.open_round is not None and state.open_round.record.round == 1
    weights = [40, 30, 20, 10]
    expected = sum(w * s for w, s in zip(weights, shifts.values(), strict=True)) / sum(weights)
    after = state.strategy.model_for(state.members[0])
    for name, arr in before.items():
        np.testing.assert_allclose(after[name], arr + expected, rtol=1e-5, atol=1e-6)
    # the updates and the previous checkpoint are gone; the new checkpoint is recorded
    assert state.checkpoint is not None and state.checkpoint != old_checkpoint
    assert state.store.blob_keys() == sorted(["initial", state.checkpoint.blob])
    snap = state.store.load()
    assert snap.run is not None and snap.run.checkpoint.blob == state.checkpoint.blob
    assert [h.reported for h in snap.history] == [tuple(state.members)]


def test_a_quorum_closes_the_round_only_at_its_deadline(formed_state: Formed) -> None:
    state, _, rounds = formed_state(4, quorum=0.5, deadline_s=60.0)
    clock: Any = state.clock
    report(state, state.members[0], 0.1)
    clock.now += 100.0
    assert rounds.tick() == 0.0 and state.rounds_done == 0  # 1 of 4: under the quorum of 2
    clock.now -= 100.0
    report(state, state.members[1], 0.2)
    assert rounds.tick() == 60.0 and state.rounds_done == 0
    clock.now += 60.0
    assert rounds.tick() == 60.0  # closed; the next round's deadline is 60 s away
    assert [h.closed_by for h in state.history] == ["quorum at deadline"]
    assert state.history[0].reported == tuple(state.members[:2])


def test_a_held_round_opens_when_an_operator_releases_it(formed_state: Formed) -> None:
    """rounds.hold_after: the round after a listed one waits (say, for an evaluation of the
    closed round's models) and its deadline counts from the release."""
    state, _, rounds = formed_state(2, hold_after=[0], deadline_s=120.0)
    rid = state.members[0]
    for i, r in enumerate(state.members):
        report(state, r, 0.1 * i)
    close(state, rounds)
    assert state.rounds_done == 1 and state.held and state.open_round is not None
    plan = rounds.plan(rid, 0)
    assert plan.action is PlanAction.WAIT and plan.round == 1
    assert plan.reason == "round 1 is held until an operator releases it"
    with pytest.raises(FailedPreconditionError, match="round 1 is held until an operator"):
        rounds.open_round_for(rid, 1)
    with pytest.raises(FailedPreconditionError, match="round 2 is not held: the run is at"):
        rounds.release(2)
    state.clock.now += 500.0  # type: ignore[attr-defined]
    with state.cond:
        rounds.maybe_close()  # a held round does not close
    assert state.held and state.rounds_done == 1
    assert rounds.release(1) == RoundRelease(1, True)
    record = state.open_round.record
    assert (record.opened_at, record.deadline) == (1500.0, 1620.0)
    assert rounds.plan(rid, 0).action is PlanAction.TRAIN
    assert rounds.release(1) == RoundRelease(1, False)  # a repeated call changes nothing
    assert rounds.release(0) == RoundRelease(0, False)  # closed long ago
    assert state.open_round.record == record


def test_rounds_not_listed_are_not_held(formed_state: Formed) -> None:
    state, _, rounds = formed_state(2, num_rounds=3, hold_after=[1])
    for r in state.members:
        report(state, r, 0.1)
    close(state, rounds)
    assert state.rounds_done == 1 and not state.held
    assert rounds.plan(state.members[0], 0).action is PlanAction.TRAIN


def test_the_last_round_finishes_the_run(formed_state: Formed) -> None:
    state, _, rounds = formed_state(2, num_rounds=1)
    for rid in state.members:
        report(state, rid, 0.1)
    close(state, rounds)
    assert state.finished and state.open_round is None and rounds.tick() is None
    assert rounds.plan(state.members[0], -1).action is PlanAction.FINISHED


def test_a_corrupted_update_is_left_out_and_quarantined(
    formed_state: Formed, caplog: pytest.LogCaptureFixture
) -> None:
    state, _, rounds = formed_state(2)
    for rid in state.members:
        report(state, rid, 0.1)
    bad = state.members[1]
    state.store.corrupt_blob(f"upd-r000000-{bad}", 100, b"\xff\xff")  # type: ignore[attr-defined]
    with caplog.at_level("ERROR", logger="fedepth_coordinator.handlers"):
        close(state, rounds)
    assert f"the accepted update of robot {bad} is left out of the aggregate" in caplog.text
    assert state.history[0].reported == (state.members[0],)


def test_a_failed_aggregation_reloads_the_last_checkpoint(formed_state: Formed) -> None:
    state, _, rounds = formed_state(2)
    for rid in state.members:
        report(state, rid, 0.1)
    broken = state.strategy

    def fail(*args: object) -> None:
        raise RuntimeError("boom")

    broken.aggregate_train = fail  # type: ignore[method-assign,union-attr]
    with pytest.raises(RuntimeError, match="boom"):
        close(state, rounds)
    assert state.strategy is not broken and state.rounds_done == 0
    assert state.open_round is not None and len(state.open_round.reported) == 2
