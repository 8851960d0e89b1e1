"""Transfer slots alone: the per-principal stream limit and its release."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from fedepth_coordinator.config import CoordinatorConfig
from fedepth_coordinator.coordstate import CoordinatorState
from fedepth_coordinator.errors import ResourceExhaustedError
from fedepth_coordinator.state import MemoryStore
from fedepth_coordinator.transfers import TransferSlots


@pytest.fixture
def slots(config_factory: Callable[..., CoordinatorConfig]) -> TransferSlots:
    config = config_factory(
        server={"max_transfers": 3, "max_transfers_per_robot": 2}, state={"backend": "memory"}
    )
    return TransferSlots(CoordinatorState(config, MemoryStore()))


def test_a_principal_holds_at_most_its_limit_of_streams(slots: TransferSlots) -> None:
    groups = [{"w": np.arange(4, dtype=np.float32)}]
    first, second = slots.payload(groups, "a"), slots.payload(groups, "a")
    other = slots.payload(groups, "b")
    assert slots.streams == {"a": 2, "b": 1}
    with pytest.raises(ResourceExhaustedError, match="max_transfers_per_robot"):
        slots.payload(groups, "a")
    assert b"".join(first.chunks()) == groups[0]["w"].tobytes()  # streamed: released
    assert slots.streams == {"a": 1, "b": 1}
    second.close()
    second.close()  # idempotent
    other.close()
    assert slots.streams == {}
    slots.payload(groups, "a").close()


def test_a_stream_without_weights_counts_against_nothing(slots: TransferSlots) -> None:
    for _ in range(5):
        payload = slots.payload([], "a")
        assert payload.slots is slots.slots and payload.on_close is None
        assert payload.chunk_bytes == 64 << 10  # server.chunk_bytes
    assert slots.streams == {}
