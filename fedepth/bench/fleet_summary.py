"""What the report and the figures need of one seed's fleet, kept in its state directory.

:class:`FleetSummary`: the clients, the test sequences and the client descriptors, so that a
run whose pairs all finished earlier needs neither the data nor the descriptors again, and
where the seed's runs started from: the initial checkpoint's SHA-256 and the machine
(:func:`machine`). The same seed gives the same checkpoint on one machine, but not on a CPU
with other kernels, so the checksum is what tells two runs of a seed apart.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

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
    #: SHA-256 of the initial checkpoint (None: recorded before checksums were kept)
    weights_sha256: str | None = None
    #: the machine the fleet was prepared on (:func:`machine`; empty: not recorded)
    machine: dict[str, Any] = field(default_factory=dict)
    #: the test sequences' platform and environment, in the order of ``test`` (empty: recorded
    #: before they were kept)
    test_labels: list[dict[str, str]] = field(default_factory=list)

    @classmethod
    def of(cls, fleet: Fleet, data_dir: Path, weights: Path, weights_sha256: str) -> FleetSummary:
        means, variances = stack_descriptors([i.descriptor for i in fleet.infos if i.descriptor])
        return cls(
            data_dir=str(data_dir),
            weights=str(weights),
            weights_sha256=weights_sha256,
            machine=machine(),
            clients=[
                {
                    "name": i.cid,
                    "platform": i.labels.get("platform", ""),
                    "environment": i.labels.get("environment", ""),
                }
                for i in fleet.infos
            ],
            test=[s.name for s, _, _ in fleet.test_queries],
            test_labels=[
                {"platform": s.meta.platform, "environment": s.meta.environment}
                for s, _, _ in fleet.test_queries
            ],
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
                "weights_sha256": self.weights_sha256,
                "machine": self.machine,
                "clients": self.clients,
                "test": self.test,
                "test_labels": self.test_labels,
            },
        )

    def provenance(self) -> dict[str, Any]:
        """Where the seed's runs started from: data, checkpoint, its checksum, the machine."""
        return {
            "data_dir": self.data_dir,
            "weights": self.weights,
            "weights_sha256": self.weights_sha256,
            "machine": self.machine,
        }

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
            weights_sha256=head.get("weights_sha256"),
            machine=dict(head.get("machine") or {}),
            test_labels=list(head.get("test_labels") or []),
        )


def file_sha256(path: Path) -> str:
    """The SHA-256 of a file, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def weights_sha256(path: Path) -> str:
    """The SHA-256 of a safetensors checkpoint's content: its metadata and every tensor's
    name, dtype, shape and bytes, in sorted order.

    Not the file's bytes: safetensors writes the metadata in an order that changes from one
    save to the next (measured: two pretrainings with identical tensors, files differing only
    in the order of the header's metadata keys), so the same weights saved twice would have
    two file hashes, and a seed pretrained again into an emptied cache would look like
    another starting point.
    """
    from safetensors import safe_open

    h = hashlib.sha256()
    with safe_open(str(path), framework="numpy") as f:
        h.update(json.dumps(f.metadata() or {}, sort_keys=True).encode())
        for name in sorted(f.keys()):
            array = np.ascontiguousarray(f.get_tensor(name))
            h.update(json.dumps([name, str(array.dtype), list(array.shape)]).encode())
            h.update(array.tobytes())
    return h.hexdigest()


def machine() -> dict[str, Any]:
    """What decides a run's floating-point results besides its settings: the CPU (its model
    and the instruction set torch's kernels use), the core count and the torch version."""
    import torch

    return {
        "cpu": _cpu_model() or platform.machine(),
        "cpu_capability": str(torch.backends.cpu.get_cpu_capability()),
        "cores": os.cpu_count() or 0,
        "torch": str(torch.__version__),
    }


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def describe_machine(m: dict[str, Any]) -> str:
    """One phrase for a :func:`machine` record ("" when none was recorded)."""
    if not m:
        return ""
    return (
        f"{m.get('cpu', '?')} ({m.get('cores', '?')} cores, torch {m.get('torch', '?')}, "
        f"kernels {m.get('cpu_capability', '?')})"
    )
