"""Algorithm state travels both ways: the hook, its parameters and server state (SCAFFOLD's
control variate) down with the model, the client's extra state up with its update; an update
farther than the norm bound from the model it was trained from is rejected."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pytest

from fedepth.strategies import ClientUpdate, FedAvg, State, TrainTask
from fedepth.strategies.aggregate import weighted_mean
from fedepth_coordinator.client import CoordinatorCallError, CoordinatorClient
from fedepth_coordinator.config import CoordinatorConfig
from fedepth_coordinator.server import running
from fedepth_coordinator.simulate import robot_ids, robot_profile

ROBOTS = robot_ids(4)


class ControlVariates(FedAvg):
    """FedAvg plus a server control variate c = mean of the clients' "dc" (SCAFFOLD-shaped)."""

    name = "cv-test"
    client_hook = "scaffold"

    def setup(self, initial: State) -> None:
        super().setup(initial)
        self.c = {k: np.zeros_like(v) for k, v in initial.items()}
        self.seen_extra: list[str] = []

    def hook_params(self) -> dict[str, float]:
        return {"lr": 0.5}

    def hook_state(self, cid: str) -> dict[str, State]:
        return {"c": self.c}

    def aggregate_train(self, rnd: int, updates: Sequence[ClientUpdate]) -> None:
        super().aggregate_train(rnd, updates)
        self.seen_extra = sorted({k for u in updates for k in u.extra})
        self.c = weighted_mean([u.extra["dc"] for u in updates], [1.0] * len(updates))


def scaffold_train(rid: str) -> Callable[[int, TrainTask], ClientUpdate]:
    def train(rnd: int, task: TrainTask) -> ClientUpdate:
        assert task.hook == "scaffold" and task.hook_params == {"lr": 0.5}
        c: Mapping[str, np.ndarray] = task.hook_state["c"]
        assert set(c) == set(task.state)
        dc = {k: (v + 1.0).astype(v.dtype) for k, v in c.items()}
        return ClientUpdate(rid, dict(task.state), 10, extra={"dc": dc})

    return train


def _join_all(
    port: int, connect: Callable[..., CoordinatorClient]
) -> dict[str, CoordinatorClient]:
    clients = {r: connect(port, r) for r in ROBOTS}
    for rid, c in clients.items():
        p = robot_profile(rid)
        c.register(p.num_samples, p.labels)
        c.upload_descriptor(p.descriptor)
    return clients


def test_hook_state_goes_down_and_extra_state_comes_up(
    config_factory: Callable[..., CoordinatorConfig], connect: Callable[..., CoordinatorClient]
) -> None:
    strategies: list[ControlVariates] = []

    def factory() -> ControlVariates:
        strategies.append(ControlVariates())
        return strategies[-1]

    config = config_factory(rounds={"num_rounds": 2, "min_robots": 4})
    with running(config, strategy_factory=factory) as server:
        clients = _join_all(server.port, connect)
        for rnd in range(2):
            for rid, c in clients.items():
                task = c.download_model(rnd).task
                c.upload_update(rnd, scaffold_train(rid)(rnd, task))
        strategy = strategies[-1]
        assert strategy.seen_extra == ["dc"]
        for v in strategy.c.values():
            np.testing.assert_allclose(v, 2.0)  # c = 0 + 1 after round 0, then 1 + 1


def test_updates_beyond_the_norm_bound_are_rejected(
    config_factory: Callable[..., CoordinatorConfig], connect: Callable[..., CoordinatorClient]
) -> None:
    config = config_factory(
        rounds={"num_rounds": 1, "min_robots": 4}, validation={"max_update_norm": 1.0}
    )
    with running(config) as server:
        clients = _join_all(server.port, connect)
        rid, c = ROBOTS[0], clients[ROBOTS[0]]
        state = c.download_model(0).task.state
        name = next(iter(state))
        far: dict[str, Any] = {k: v.copy() for k, v in state.items()}
        far[name][:2] += 1.0  # distance sqrt(2) from the downloaded model
        with pytest.raises(CoordinatorCallError) as err:
            c.upload_update(0, ClientUpdate(rid, far, 10))
        assert (
            err.value.status == "INVALID_ARGUMENT" and "exceeds the bound 1" in err.value.details
        )
        near = {k: v.copy() for k, v in state.items()}
        near[name][0] += 0.5
        assert c.upload_update(0, ClientUpdate(rid, near, 10)).accepted == 1
