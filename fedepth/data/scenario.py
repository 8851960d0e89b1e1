"""Load a generated (or hand-written) scenario: clients, unseen test sequences, pretraining split.

The manifest (``<root>/manifest.json``) lists sequences; each names its reader (``source``:
m3ed, nyu or kitti), its files relative to the root, its platform, environment, split and, for
training sequences, the client that owns it. Real datasets can be used the same way by writing
a manifest that points at them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedepth.data.errors import DataError
from fedepth.data.kitti import KittiSequence
from fedepth.data.m3ed import M3EDSequence
from fedepth.data.nyu import NYUv2Labeled
from fedepth.data.sequence import Sequence, SequenceMeta
from fedepth.depth_range import OUTDOOR

MANIFEST = "manifest.json"
SUPPORTED_VERSION = 1
_ENTRY_KEYS = ("name", "split", "platform", "environment", "source", "files", "num_samples")


@dataclass
class Client:
    """A federated client: one robot's data (usually one continuous sequence)."""

    name: str
    platform: str
    environment: str
    sequences: list[Sequence] = field(default_factory=list)

    @property
    def num_samples(self) -> int:
        return sum(len(s) for s in self.sequences)


@dataclass
class Scenario:
    """A loaded scenario. Sequences are opened lazily; :meth:`close` releases their files."""

    root: Path
    name: str
    profile: str
    seed: int
    clients: list[Client]
    test: list[Sequence]
    pretrain: list[Sequence]

    def sequences(self) -> list[Sequence]:
        """Every sequence: the clients', then test, then pretraining."""
        return [s for c in self.clients for s in c.sequences] + self.test + self.pretrain

    def client(self, name: str) -> Client:
        for c in self.clients:
            if c.name == name:
                return c
        raise KeyError(f"no client {name!r} in {self.root}")

    def close(self) -> None:
        for s in self.sequences():
            s.close()


def _require(path: Path, obj: dict[str, Any], key: str, where: str) -> Any:
    if key not in obj:
        raise DataError(path, f"{where} has no {key!r}", key=key)
    return obj[key]


def open_sequence(
    root: Path,
    entry: dict[str, Any],
    manifest: Path,
    nyu_cache: dict[Path, NYUv2Labeled] | None = None,
) -> Sequence:
    """Build the reader of one manifest entry."""
    where = f"sequence {entry.get('name', '?')!r}"
    for k in _ENTRY_KEYS:
        _require(manifest, entry, k, where)
    files = entry["files"]
    meta = SequenceMeta(
        platform=entry["platform"],
        environment=entry["environment"],
        source=entry["source"],
        split=entry["split"],
        min_depth=float(entry.get("min_depth", OUTDOOR.min_depth)),
        max_depth=float(entry.get("max_depth", OUTDOOR.max_depth)),
    )
    source = entry["source"]
    if source == "m3ed":
        depth = files.get("depth")
        return M3EDSequence(
            root / _require(manifest, files, "data", where),
            root / depth if depth else None,
            name=entry["name"],
            meta=meta,
        )
    if source == "nyu":
        mat = root / _require(manifest, files, "mat", where)
        splits = files.get("splits")
        cache = nyu_cache if nyu_cache is not None else {}
        if mat not in cache:
            cache[mat] = NYUv2Labeled(mat, root / splits if splits else None)
        indices = _require(manifest, entry, "indices", where)
        return cache[mat].sequence(indices, name=entry["name"], meta=meta)
    if source == "kitti":
        return KittiSequence(
            root / _require(manifest, files, "split_file", where),
            root / _require(manifest, files, "data_path", where),
            root / _require(manifest, files, "gt_path", where),
            lines=entry.get("lines"),
            name=entry["name"],
            meta=meta,
        )
    raise DataError(
        manifest, f"{where}: unknown source {source!r} (m3ed, nyu or kitti)", key="source"
    )


def read_manifest(root: str | Path) -> dict[str, Any]:
    """The parsed manifest of a scenario directory (checked for format and version)."""
    path = Path(root) / MANIFEST
    if not path.is_file():
        raise DataError(path, "no such file (not a scenario directory? run `fedepth data synth`)")
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise DataError(path, f"not valid JSON ({exc})", line=exc.lineno) from exc
    if not isinstance(manifest, dict):
        raise DataError(path, "expected a JSON object")
    version = _require(path, manifest, "version", "manifest")
    if version != SUPPORTED_VERSION:
        raise DataError(
            path,
            f"unsupported manifest version {version} (this reader knows {SUPPORTED_VERSION})",
            key="version",
        )
    seqs = _require(path, manifest, "sequences", "manifest")
    if not isinstance(seqs, list) or not seqs:
        raise DataError(path, "no sequences listed", key="sequences")
    return manifest


def load_scenario(root: str | Path) -> Scenario:
    """Read ``<root>/manifest.json`` and build the clients' and split sequences' readers."""
    root = Path(root)
    path = root / MANIFEST
    manifest = read_manifest(root)
    nyu_cache: dict[Path, NYUv2Labeled] = {}
    clients: dict[str, Client] = {}
    test: list[Sequence] = []
    pretrain: list[Sequence] = []
    for entry in manifest["sequences"]:
        seq = open_sequence(root, entry, path, nyu_cache)
        split = entry["split"]
        if split == "train":
            owner = entry.get("client") or entry["name"]
            c = clients.setdefault(owner, Client(owner, entry["platform"], entry["environment"]))
            c.sequences.append(seq)
        elif split == "test":
            test.append(seq)
        elif split == "pretrain":
            pretrain.append(seq)
        else:
            raise DataError(
                path, f"sequence {entry['name']!r}: unknown split {split!r}", key="split"
            )
    return Scenario(
        root,
        str(manifest.get("scenario", "")),
        str(manifest.get("profile", "")),
        int(manifest.get("seed", 0)),
        list(clients.values()),
        test,
        pretrain,
    )
