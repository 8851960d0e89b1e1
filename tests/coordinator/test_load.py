"""Many concurrent robots through full rounds: no errors, coordinator memory bounded.

The light variant of benchmarks/coordinator_load.py (100 robots, 10 MB model)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fedepth_coordinator.config import CoordinatorConfig
from fedepth_coordinator.simulate import load_run, robot_ids

ROBOTS = 32
MODEL_MB = 8.0


@pytest.mark.slow
def test_concurrent_robots_full_rounds_with_bounded_memory(
    config_factory: Callable[..., CoordinatorConfig], creds: Any, tmp_path: Path
) -> None:
    robots = robot_ids(ROBOTS)
    for rid in robots[6:]:
        creds.add(rid)
    config = config_factory(
        server={
            "chunk_bytes": 1 << 20,
            "max_transfers": 8,
            "max_workers": 64,
            "max_wait_s": 10.0,
        },
        rounds={"num_rounds": 2, "min_robots": ROBOTS, "deadline_s": 120.0},
        strategy={"name": "fedavg", "params": {}},
        model={"synthetic": {"num_tensors": 8, "size_mb": MODEL_MB}},
    )
    result = load_run(
        config, creds.tokens, robots, operator="ops", timeout_s=120, log_path=tmp_path / "log"
    )
    assert result.errors == {}
    assert result.closed_by == ["all reported", "all reported"]
    growth = result.rss_peak_bytes - result.rss_start_bytes
    uploads_per_round = ROBOTS * result.model_bytes
    # holding a round's uploads in memory would take uploads_per_round; streaming them to disk
    # through 8 transfer slots and aggregating tensor by tensor keeps the coordinator at
    # O(slots x chunk + a few models), independent of the number of robots
    assert growth < uploads_per_round / 2, (
        f"coordinator grew by {growth / 1e6:.0f} MB for {uploads_per_round / 1e6:.0f} MB "
        "of uploads per round"
    )
