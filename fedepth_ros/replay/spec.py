"""What one ``fedepth fleet replay`` runs (:class:`ReplaySpec`), its operator principal, and
the error it stops with."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

#: The principal the driver watches the coordinator as.
OPERATOR = "replay-operator"
#: Methods whose robots keep hook state between rounds (lost when a robot process restarts).
STATEFUL = frozenset({"scaffold", "feddyn"})


class ReplayError(RuntimeError):
    """The replay cannot go on; the message says why and where the logs are."""


@dataclass(frozen=True)
class ReplaySpec:
    """What ``fedepth fleet replay`` runs."""

    methods: tuple[str, ...]
    out: Path
    max_robots: int
    rounds: int | None = None
    scenario_dir: Path | None = None
    bag_dir: Path | None = None
    backbone: str = "newcrfs-lite"
    cache_dir: Path = Path(".cache/fedepth")
    weights: Path | None = None
    image_size: tuple[int, int] | None = None
    local_steps: int | None = None
    rate: float = 20.0
    lossless: bool = True
    round_deadline_s: float = 0.0
    quorum: float = 1.0
    robot_retries: int = 1
    coordinator_restarts: int = 1
    start_timeout_s: float = 600.0
    fork_nodes: bool = True
    progress: bool = True
