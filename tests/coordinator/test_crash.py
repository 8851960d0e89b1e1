"""SIGKILL the coordinator in the middle of a round, restart it on the same state directory:
the run finishes with exactly the weights of an uninterrupted run."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedepth.strategies import ClientUpdate, TrainTask
from fedepth_coordinator.client import CoordinatorClient, open_channel
from fedepth_coordinator.config import CoordinatorConfig
from fedepth_coordinator.robot import TrainFn
from fedepth_coordinator.server import load_initial_model, running
from fedepth_coordinator.simulate import (
    CoordinatorProcess,
    SimulatedFleet,
    deterministic_train,
    reference_run,
    robot_ids,
)

ROBOTS = robot_ids(6)
HELD = set(ROBOTS[3:])  # these robots are still training round 1 when the coordinator dies


def wait_until(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    pause = threading.Event()
    end = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        pause.wait(0.05)


def final_models(port: int, tokens: dict[str, str]) -> dict[str, dict[str, np.ndarray]]:
    out = {}
    for rid in ROBOTS:
        with CoordinatorClient(open_channel(f"127.0.0.1:{port}"), rid, tokens[rid]) as c:
            model = c.download_model(latest=True)
            assert model.round == 3
            out[rid] = model.task.state
    return out


@pytest.mark.slow
def test_sigkill_mid_round_then_restart_gives_the_uninterrupted_result(
    config_factory: Callable[..., CoordinatorConfig], creds: Any, tmp_path: Path
) -> None:
    rounds = {"num_rounds": 3, "min_robots": 6, "deadline_s": 120.0}
    crashed_cfg = config_factory(rounds=rounds, state={"dir": str(tmp_path / "crashed")})
    calm_cfg = config_factory(rounds=rounds, state={"dir": str(tmp_path / "calm")})

    # the uninterrupted run
    with running(calm_cfg) as calm:
        fleet = SimulatedFleet(f"127.0.0.1:{calm.port}", creds.tokens, poll_s=1.0)
        fleet.start_all(ROBOTS)
        assert fleet.join(timeout_s=60) and not fleet.errors
        expected = final_models(calm.port, creds.tokens)

    # the interrupted run: a child process we can SIGKILL
    release = threading.Event()

    def train_for(rid: str, n: int) -> TrainFn:
        train = deterministic_train(rid, n)

        def fn(rnd: int, task: TrainTask) -> ClientUpdate:
            if rnd == 1 and rid in HELD:
                assert release.wait(120), "never released"
            return train(rnd, task)

        return fn

    child = CoordinatorProcess(crashed_cfg, log_path=tmp_path / "coordinator.log")
    port = child.start()
    try:
        fleet = SimulatedFleet(
            f"127.0.0.1:{port}", creds.tokens, poll_s=1.0, retry_for_s=90, train_for=train_for
        )
        fleet.start_all(ROBOTS)

        def ops() -> CoordinatorClient:
            channel = open_channel(f"127.0.0.1:{port}")
            return CoordinatorClient(channel, "ops", creds.tokens["ops"], wait_for_ready=True)

        def reported_in_round_1() -> set[str]:
            with ops() as c:
                status = c.fleet_status()
            return (
                {r.robot_id for r in status.robots if r.reported} if status.round == 1 else set()
            )

        wait_until(lambda: len(reported_in_round_1()) == 3, 60, "half of round 1")
        child.kill()
        assert child.start(port=port) == port
        # the accepted uploads of the open round survived the crash
        assert reported_in_round_1() == set(ROBOTS) - HELD
        release.set()
        assert fleet.join(timeout_s=90), "robots did not finish after the restart"
        assert not fleet.errors
        assert all(fleet.reports[r].rounds == [0, 1, 2] for r in ROBOTS)
        with ops() as c:
            assert [h.accepted for h in c.fleet_status().history] == [6, 6, 6]
        got = final_models(port, creds.tokens)
    finally:
        release.set()
        child.stop()

    log = (tmp_path / "coordinator.log").read_text()
    assert "resumed run: 1 rounds done, 6 members, round 1 open with 3 accepted updates" in log
    reference = reference_run(
        "fedepth", {"overlap": 0.3}, load_initial_model(crashed_cfg.model), ROBOTS, 3
    )
    for rid in ROBOTS:
        for name, arr in expected[rid].items():
            np.testing.assert_array_equal(got[rid][name], arr)
            np.testing.assert_array_equal(reference[rid][name], arr)
