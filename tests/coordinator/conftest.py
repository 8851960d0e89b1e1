"""Fixtures of the coordinator tests: credentials, configs and a real server on port 0."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from fedepth_coordinator.auth import add_principal
from fedepth_coordinator.blobs import write_blob
from fedepth_coordinator.checkpoints import Checkpoints
from fedepth_coordinator.client import CoordinatorClient, open_channel
from fedepth_coordinator.config import CoordinatorConfig, config_from_dict
from fedepth_coordinator.coordstate import INITIAL_BLOB, CoordinatorState, OpenRound, client_info
from fedepth_coordinator.rounds import RoundController
from fedepth_coordinator.server import CoordinatorServer, running, synthetic_model
from fedepth_coordinator.simulate import robot_ids, robot_profile
from fedepth_coordinator.state import MemoryStore
from fedepth_coordinator.state.base import RobotRecord, RunRecord
from fedepth_coordinator.tensors import STATE
from fedepth_coordinator.transfers import TransferSlots


@dataclass
class Credentials:
    """A credentials file and the tokens it was made with."""

    path: Path
    tokens: dict[str, str] = field(default_factory=dict)

    def add(self, principal: str, role: str = "robot") -> str:
        self.tokens[principal] = add_principal(self.path, principal, role)
        return self.tokens[principal]


@pytest.fixture
def creds(tmp_path: Path) -> Credentials:
    c = Credentials(tmp_path / "credentials.yaml")
    for rid in robot_ids(6):
        c.add(rid)
    c.add("ops", role="operator")
    return c


def make_config(
    tmp_path: Path, creds: Credentials, **sections: dict[str, Any]
) -> CoordinatorConfig:
    """A small local config: loopback, port 0, small chunks, fast rounds; sections override."""
    data: dict[str, Any] = {
        "server": {
            "host": "127.0.0.1",
            "port": 0,
            "chunk_bytes": 64 << 10,
            "max_wait_s": 2.0,
            "grace_s": 0.5,
            "max_workers": 32,
        },
        "auth": {"credentials_file": str(creds.path)},
        "rounds": {"num_rounds": 2, "min_robots": 4, "deadline_s": 120.0, "quorum": 0.5},
        "strategy": {"name": "fedepth", "params": {"overlap": 0.3}},
        "model": {
            "name": None,
            "pretrain": "none",
            "synthetic": {"num_tensors": 3, "size_mb": 0.2},
        },
        "state": {"dir": str(tmp_path / "state"), "backend": "sqlite"},
    }
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    return config_from_dict(data)


@pytest.fixture
def config_factory(tmp_path: Path, creds: Credentials) -> Callable[..., CoordinatorConfig]:
    def factory(**sections: dict[str, Any]) -> CoordinatorConfig:
        return make_config(tmp_path, creds, **sections)

    return factory


@pytest.fixture
def server(config_factory: Callable[..., CoordinatorConfig]) -> Iterator[CoordinatorServer]:
    with running(config_factory()) as srv:
        yield srv


@pytest.fixture
def connect(creds: Credentials) -> Iterator[Callable[..., CoordinatorClient]]:
    """connect(port, principal) -> a client with that principal's token (closed afterwards)."""
    clients: list[CoordinatorClient] = []

    def factory(port: int, principal: str, token: str | None = None) -> CoordinatorClient:
        client = CoordinatorClient(
            open_channel(f"127.0.0.1:{port}"),
            principal,
            creds.tokens[principal] if token is None else token,
            timeout_s=20.0,
        )
        clients.append(client)
        return client

    yield factory
    for c in clients:
        c.close()


class Clock:
    """A settable clock for the coordinator's deadlines."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def formed_state(
    config_factory: Callable[..., CoordinatorConfig],
) -> Callable[..., tuple[CoordinatorState, Checkpoints, RoundController]]:
    """formed_state(n, strategy=..., **rounds) -> a coordinator state with a formed fleet of n
    robots and round 0 open (memory store, a Clock), built by hand as formation records it, with
    its checkpoints and round controller: for testing the parts that work on a running fleet."""

    def factory(
        n: int = 4, strategy: str = "fedavg", **rounds: Any
    ) -> tuple[CoordinatorState, Checkpoints, RoundController]:
        config = config_factory(
            rounds={"num_rounds": 2, "min_robots": n, "quorum": 0.5, **rounds},
            strategy={"name": strategy, "params": {}},
            state={"backend": "memory"},
        )
        initial = synthetic_model(2, 0.001)
        state = CoordinatorState(
            config, MemoryStore(), Clock(), initial=dict(initial), model_order=list(initial)
        )
        checkpoints = Checkpoints(state)
        controller = RoundController(state, checkpoints, TransferSlots(state))
        ids = robot_ids(n)
        for rid in ids:
            p = robot_profile(rid)
            state.robots[rid] = RobotRecord(rid, p.num_samples, p.labels, p.descriptor)
            state.store.put_robot(state.robots[rid])
        s = checkpoints.new_strategy()
        s.initialize([client_info(state.robots[r]) for r in ids], initial)
        write_blob(state.store, INITIAL_BLOB, {STATE: initial})
        state.strategy, state.members, state.member_set = s, list(ids), set(ids)
        state.num_initial, state.initial = n, None
        state.checkpoint = checkpoints.write()
        first = controller.new_round(0)
        state.store.start_run(RunRecord(INITIAL_BLOB, state.checkpoint, first))
        state.open_round = OpenRound(first)
        return state, checkpoints, controller

    return factory
