"""In-memory :class:`Store`: the same contract without durability (tests, dry runs)."""

from __future__ import annotations

import hashlib
import threading
from dataclasses import replace

from fedepth_coordinator.state.base import (
    BlobWriter,
    Checkpoint,
    RobotRecord,
    RoundRecord,
    RunRecord,
    Snapshot,
    Store,
    UpdateRecord,
    check_key,
    json_roundtrip,
)


class _MemoryBlobWriter(BlobWriter):
    def __init__(self, store: MemoryStore, key: str) -> None:
        self._store = store
        self._key = key
        self._parts: list[bytes] | None = []

    def write(self, data: bytes | memoryview) -> None:
        if self._parts is None:
            raise RuntimeError(f"blob {self._key!r} is already committed or aborted")
        self._parts.append(bytes(data))

    def commit(self) -> None:
        if self._parts is None:
            raise RuntimeError(f"blob {self._key!r} is already committed or aborted")
        blob = b"".join(self._parts)
        digest = hashlib.sha256(blob).hexdigest()
        with self._store._lock:
            self._store._blobs[self._key] = blob
            self._store._sums[self._key] = digest
        self._parts = None

    def abort(self) -> None:
        self._parts = None


class MemoryStore(Store):
    """Dicts behind a lock; blobs are bytes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._robots: dict[str, RobotRecord] = {}
        self._run: RunRecord | None = None
        self._updates: dict[tuple[int, str], UpdateRecord] = {}
        self._history: list[RoundRecord] = []
        self._blobs: dict[str, bytes] = {}
        self._sums: dict[str, str] = {}

    def load(self) -> Snapshot:
        with self._lock:
            return Snapshot(
                robots=list(self._robots.values()),
                run=self._run,
                updates=list(self._updates.values()),
                history=list(self._history),
            )

    def put_robot(self, robot: RobotRecord) -> None:
        with self._lock:
            self._robots[robot.robot_id] = robot

    def start_run(self, run: RunRecord) -> None:
        with self._lock:
            if self._run is not None:
                raise RuntimeError("the run has already started")
            self._run = replace(run, checkpoint=_as_stored(run.checkpoint))

    def save_checkpoint(self, checkpoint: Checkpoint) -> None:
        with self._lock:
            if self._run is None:
                raise RuntimeError("no run to checkpoint")
            self._run = replace(self._run, checkpoint=_as_stored(checkpoint))

    def add_update(self, update: UpdateRecord) -> None:
        with self._lock:
            key = (update.round, update.robot_id)
            if key in self._updates:
                raise RuntimeError(f"update {key} is already recorded")
            self._updates[key] = update

    def close_round(
        self, closed: RoundRecord, checkpoint: Checkpoint, next_round: RoundRecord | None
    ) -> None:
        with self._lock:
            if self._run is None:
                raise RuntimeError("no run in progress")
            self._history.append(closed)
            self._updates = {k: u for k, u in self._updates.items() if k[0] != closed.round}
            self._run = replace(
                self._run,
                checkpoint=_as_stored(checkpoint),
                open_round=next_round,
                finished=next_round is None,
            )

    def close(self) -> None:
        """Nothing to release."""

    def blob_writer(self, key: str, size: int | None = None) -> BlobWriter:
        return _MemoryBlobWriter(self, check_key(key))

    def read_blob(self, key: str, offset: int, size: int) -> bytearray:
        with self._lock:
            data = self._blobs[key]
        if offset + size > len(data):
            raise ValueError(f"blob {key!r}: read past its end ({offset}+{size} > {len(data)})")
        return bytearray(data[offset : offset + size])

    def delete_blob(self, key: str) -> None:
        with self._lock:
            self._blobs.pop(key, None)
            self._sums.pop(key, None)

    def blob_checksum(self, key: str) -> str | None:
        with self._lock:
            return self._sums.get(key)

    def blob_size(self, key: str) -> int:
        with self._lock:
            return len(self._blobs[key])

    def corrupt_blob(self, key: str, offset: int, data: bytes) -> None:
        """Overwrite bytes of a stored blob behind the store's back (tests of disk faults)."""
        with self._lock:
            blob = bytearray(self._blobs[key])
            blob[offset : offset + len(data)] = data
            self._blobs[key] = bytes(blob)

    def blob_keys(self) -> list[str]:
        with self._lock:
            return sorted(self._blobs)


def _as_stored(checkpoint: Checkpoint) -> Checkpoint:
    return replace(checkpoint, meta=json_roundtrip(checkpoint.meta))
