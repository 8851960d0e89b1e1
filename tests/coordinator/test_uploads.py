"""The upload sink alone, with a fake round controller: checks, spilling, recording, weights."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pytest

from fedepth.strategies import TrainTask, create_strategy
from fedepth_coordinator.config import CoordinatorConfig
from fedepth_coordinator.coordstate import CoordinatorState, OpenRound
from fedepth_coordinator.domain import UpdateHeader
from fedepth_coordinator.errors import (
    AbortedError,
    AlreadyExistsError,
    FailedPreconditionError,
    InvalidArgumentError,
)
from fedepth_coordinator.state import MemoryStore
from fedepth_coordinator.state.base import RobotRecord, RoundRecord
from fedepth_coordinator.tensors import Layout, iter_chunks
from fedepth_coordinator.transfers import TransferSlots
from fedepth_coordinator.uploads import UploadSink

REFERENCE = {"a": np.zeros(8, dtype=np.float32), "b": np.ones((2, 3), dtype=np.float32)}


class FakeRounds:
    """Round 0 is open for robots r-1 and r-2, whose task is REFERENCE."""

    def __init__(self) -> None:
        self.closes = 0

    def open_round_for(self, robot_id: str, rnd: int) -> RoundRecord:
        if rnd != 0:
            raise FailedPreconditionError(f"round {rnd} is not open")
        return RoundRecord(0, ("r-1", "r-2"), 0.0, 60.0)

    def task(self, rnd: int, robot_id: str) -> TrainTask:
        return TrainTask(state=REFERENCE)

    def maybe_close(self) -> None:
        self.closes += 1


def make(
    config_factory: Callable[..., CoordinatorConfig], **validation: object
) -> tuple[UploadSink, FakeRounds, CoordinatorState]:
    config = config_factory(validation=validation, state={"backend": "memory"})
    state = CoordinatorState(config, MemoryStore())
    state.strategy = create_strategy("fedavg")  # formed (the sink only asks whether it is)
    for rid in ("r-1", "r-2"):
        state.robots[rid] = RobotRecord(rid, 10, {})
    state.open_round = OpenRound(RoundRecord(0, ("r-1", "r-2"), 0.0, 60.0))
    rounds = FakeRounds()
    sink = UploadSink(state, rounds, TransferSlots(state))  # type: ignore[arg-type]
    return sink, rounds, state


def header(rid: str, num_samples: int = 10, **kw: object) -> UpdateHeader:
    return UpdateHeader(rid, 0, num_samples, Layout.of({"state": REFERENCE}), **kw)  # type: ignore[arg-type]


def chunks(state: dict[str, np.ndarray] = REFERENCE) -> Iterator[bytes]:
    return iter_chunks([state], 16)


def test_an_upload_is_spilled_recorded_and_may_close_the_round(
    config_factory: Callable[..., CoordinatorConfig],
) -> None:
    sink, rounds, state = make(config_factory)
    update = {k: v + 1 for k, v in REFERENCE.items()}
    receipt = sink.upload("r-1", header("r-1", num_steps=3, metrics={"loss": 0.5}), chunks(update))
    assert (receipt.round, receipt.accepted, receipt.selected) == (0, 1, 2)
    assert rounds.closes == 1
    assert state.open_round is not None and state.open_round.uploading == set()
    rec = state.open_round.reported["r-1"]
    assert (rec.num_samples, rec.num_steps, dict(rec.metrics)) == (10, 3, {"loss": 0.5})
    assert rec.blob == "upd-r000000-r-1" and rec.blob in state.store.blob_keys()
    assert state.store.load().updates == [rec]
    with pytest.raises(AlreadyExistsError, match="already uploaded its update for round 0"):
        sink.upload("r-1", header("r-1"), chunks())
    state.open_round.uploading.add("r-2")
    with pytest.raises(AbortedError, match="still in progress"):
        sink.upload("r-2", header("r-2"), chunks())


def test_bad_headers_and_values_record_nothing(
    config_factory: Callable[..., CoordinatorConfig],
) -> None:
    sink, rounds, state = make(config_factory)
    with pytest.raises(InvalidArgumentError, match="num_samples must be > 0"):
        sink.upload("r-1", header("r-1", num_samples=0), chunks())
    with pytest.raises(InvalidArgumentError, match="num_steps must be >= 0"):
        sink.upload("r-1", header("r-1", num_steps=-1), chunks())
    metrics = {f"m{i}": 0.0 for i in range(65)}
    with pytest.raises(InvalidArgumentError, match="at most 64 metrics"):
        sink.upload("r-1", header("r-1", metrics=metrics), chunks())
    nan = {k: np.full_like(v, np.nan) for k, v in REFERENCE.items()}
    with pytest.raises(InvalidArgumentError):
        sink.upload("r-1", header("r-1"), chunks(nan))
    wrong = UpdateHeader("r-1", 0, 10, Layout.of({"state": {"a": REFERENCE["a"]}}))
    with pytest.raises(InvalidArgumentError):
        sink.upload("r-1", wrong, iter_chunks([{"a": REFERENCE["a"]}], 16))
    with pytest.raises(FailedPreconditionError, match="round 1 is not open"):
        sink.upload("r-1", UpdateHeader("r-1", 1, 10, header("r-1").layout), chunks())
    assert state.open_round is not None
    assert state.open_round.reported == {} and state.open_round.uploading == set()
    assert state.store.blob_keys() == [] and rounds.closes == 0


def test_an_update_whose_round_closed_while_streaming_is_discarded(
    config_factory: Callable[..., CoordinatorConfig],
) -> None:
    sink, _, state = make(config_factory)

    def closing() -> Iterator[bytes]:
        for i, chunk in enumerate(chunks()):
            if i == 1:  # the round closes meanwhile
                state.open_round = OpenRound(RoundRecord(1, ("r-1",), 0.0, 60.0))
            yield chunk

    with pytest.raises(FailedPreconditionError, match="late"):
        sink.upload("r-1", header("r-1"), closing())
    assert state.store.blob_keys() == []


def test_sample_weight_policies(
    config_factory: Callable[..., CoordinatorConfig], caplog: pytest.LogCaptureFixture
) -> None:
    robot = RobotRecord("r-1", 10, {})
    weights = {}
    for policy in ("equal", "registered", "clipped"):
        sink, _, _ = make(config_factory, sample_weights=policy)
        weights[policy] = [sink.sample_weight(robot, n) for n in (4, 10, 10**12)]
    assert weights == {"equal": [1, 1, 1], "registered": [10, 10, 10], "clipped": [4, 10, 10]}
    strict, _, _ = make(config_factory, sample_weights="strict")
    assert strict.sample_weight(robot, 10) == 10
    with pytest.raises(InvalidArgumentError, match="re-register with the count"):
        strict.sample_weight(robot, 11)
    clipped, _, _ = make(config_factory, sample_weights="clipped")
    caplog.clear()
    with caplog.at_level("WARNING", logger="fedepth_coordinator.handlers"):
        clipped.sample_weight(robot, 11)
        clipped.sample_weight(robot, 12)
    assert caplog.text.count("claims") == 1 and clipped.overclaimed == {"r-1"}
