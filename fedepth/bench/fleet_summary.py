"""What the report and the figures need of one seed's fleet, kept in its state directory.

:class:`FleetSummary`: the clients, the test sequences and the client descriptors, so that a
run whose pairs all finished earlier needs neither the data nor the descriptors again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedepth.descriptor import stack_descriptors
from fedepth.runstate import load_tree, save_tree, write_json_atomic
from fedepth.sim import Fleet


@dataclass
class FleetSummary:
    """What the report and the figures need of one seed's prepared fleet (kept on disk, so a
    run whose pairs all finished earlier needs neither data nor descriptors)."""

    data_dir: str
    weights: str
    clients: list[dict[str, str]]  # name, platform, environment
    test: list[str]  # test sequence names
    means: np.ndarray  # client descriptors (N, D)
    variances: np.ndarray

    @classmethod
    def of(cls, fleet: Fleet, data_dir: Path, weights: Path) -> FleetSummary:
        means, variances = stack_descriptors([i.descriptor for i in fleet.infos if i.descriptor])
        return cls(
            data_dir=str(data_dir),
            weights=str(weights),
            clients=[
                {
                    "name": i.cid,
                    "platform": i.labels.get("platform", ""),
                    "environment": i.labels.get("environment", ""),
                }
                for i in fleet.infos
            ],
            test=[s.name for s, _, _ in fleet.test_queries],
            means=means,
            variances=variances,
        )

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        save_tree(directory / "fleet.safetensors", {"means": self.means, "var": self.variances})
        write_json_atomic(
            directory / "fleet.json",
            {
                "data_dir": self.data_dir,
                "weights": self.weights,
                "clients": self.clients,
                "test": self.test,
            },
        )

    @classmethod
    def load(cls, directory: Path) -> FleetSummary | None:
        if not (directory / "fleet.json").is_file():
            return None
        head = json.loads((directory / "fleet.json").read_text(encoding="utf-8"))
        arrays = load_tree(directory / "fleet.safetensors")
        return cls(
            data_dir=head["data_dir"],
            weights=head["weights"],
            clients=head["clients"],
            test=head["test"],
            means=arrays["means"],
            variances=arrays["var"],
        )
