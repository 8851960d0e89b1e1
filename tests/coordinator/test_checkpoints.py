"""Checkpoints alone: building the strategy, writing and loading, restoring a stored run."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from fedepth.strategies.aggregate import robust_mean
from fedepth_coordinator.blobs import write_blob
from fedepth_coordinator.checkpoints import Checkpoints
from fedepth_coordinator.config import CoordinatorConfig
from fedepth_coordinator.coordstate import CoordinatorState
from fedepth_coordinator.rounds import RoundController
from fedepth_coordinator.state import MemoryStore
from fedepth_coordinator.state.base import StateError
from fedepth_coordinator.tensors import STATE

Formed = Callable[..., tuple[CoordinatorState, Checkpoints, RoundController]]


def test_the_robust_rule_goes_only_to_strategies_with_the_clusterwise_rule(
    config_factory: Callable[..., CoordinatorConfig],
) -> None:
    def strategy(name: str) -> object:
        config = config_factory(
            strategy={"name": name, "params": {}},
            validation={"robust_aggregation": "median"},
            state={"backend": "memory"},
        )
        return Checkpoints(CoordinatorState(config, MemoryStore())).new_strategy()

    rule = strategy("fedavg").cluster_rule  # type: ignore[attr-defined]
    assert rule.func is robust_mean and rule.keywords["method"] == "median"
    with pytest.raises(ValueError, match="aggregates by its own rule"):
        strategy("scaffold")


def test_a_coordinator_refuses_the_pooled_upper_bound(
    config_factory: Callable[..., CoordinatorConfig],
) -> None:
    # CL (strategy cl) is the benchmark's centralised upper bound; served to robots it would
    # have been FedAvg under another name, its own learning rate silently unused
    config = config_factory(strategy={"name": "cl", "params": {}}, state={"backend": "memory"})
    with pytest.raises(ValueError, match=r"'cl' trains one model on the pooled data.*use fedavg"):
        Checkpoints(CoordinatorState(config, MemoryStore())).new_strategy()


def test_a_checkpoint_loads_back_into_the_same_strategy(formed_state: Formed) -> None:
    state, checkpoints, _ = formed_state(3, strategy="fedepth")
    assert state.strategy is not None
    before = {rid: dict(state.strategy.model_for(rid)) for rid in state.members}
    state.rounds_done = 7
    ck = checkpoints.write()
    assert ck.blob.startswith("ckpt-r000007-") and ck.members == tuple(state.members)
    state.strategy, state.members = None, []
    checkpoints.load(ck)
    assert state.checkpoint == ck and state.rounds_done == 7 and len(state.members) == 3
    for rid, model in before.items():
        for name, arr in model.items():
            np.testing.assert_array_equal(state.strategy.model_for(rid)[name], arr)


def test_restore_resumes_the_stored_run_and_drops_its_garbage(formed_state: Formed) -> None:
    state, _, _ = formed_state(3)
    write_blob(state.store, "leftover", {STATE: {"w": np.zeros(2)}})  # recorded, unreferenced
    again = CoordinatorState(state.config, state.store)
    assert Checkpoints(again).restore()
    assert again.members == state.members and again.rounds_done == 0
    assert again.open_round is not None and again.open_round.record == state.open_round.record  # type: ignore[union-attr]
    assert again.initial is None and again.model_order == state.model_order
    assert "leftover" not in state.store.blob_keys()


def test_blobs_the_state_has_no_record_of_are_refused_or_quarantined(
    config_factory: Callable[..., CoordinatorConfig], caplog: pytest.LogCaptureFixture
) -> None:
    store = MemoryStore()
    store._blobs["stranger"] = b"x"  # a blob of another state.db: no checksum recorded
    refuse = config_factory(state={"backend": "memory", "unaccounted_blobs": "refuse"})
    with pytest.raises(StateError, match="records no run"):
        Checkpoints(CoordinatorState(refuse, store)).restore()
    quarantine = config_factory(state={"backend": "memory", "unaccounted_blobs": "quarantine"})
    with caplog.at_level("WARNING", logger="fedepth_coordinator.handlers"):
        assert not Checkpoints(CoordinatorState(quarantine, store)).restore()
    assert "has no record of 1 blobs (stranger)" in caplog.text
    assert store.blob_keys() == ["stranger"]  # moved aside where the backend can, never deleted
