"""The coordinator's durable state behind one interface: records, transitions and weight blobs.

Everything the coordinator must not lose goes through :class:`Store`: robot registrations, the
run (strategy checkpoint + open round), the updates accepted in the open round, and the weight
blobs they point to. Each transition is one atomic call, so a crash leaves either the state
before it or the state after it. Blobs are written first (atomically, under a fresh key) and
referenced by the transaction that follows; unreferenced blobs are garbage.
"""

from __future__ import annotations

import hashlib
import json
import re
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import numpy as np

from fedepth.descriptor import Descriptor
from fedepth_coordinator.errors import shown

#: Robot ids: short, plain, safe as file names (use ``fullmatch``: no trailing newline).
ID_PATTERN = re.compile(r"[A-Za-z0-9_.-]{1,64}")
#: Blob keys: the same characters, long enough for a prefix plus a robot id.
KEY_PATTERN = re.compile(r"[A-Za-z0-9_.-]{1,128}")

#: Bytes hashed at a time when a blob is verified.
HASH_CHUNK_BYTES = 4 << 20


class StateError(RuntimeError):
    """The durable state cannot be used as it is (missing, corrupt, or not accounted for); the
    message names the files and how to recover. The coordinator refuses to start on it."""


class CorruptBlobError(ValueError):
    """A blob's bytes do not match the checksum recorded when it was written (or none was
    recorded): it must not be used."""


@dataclass(frozen=True)
class RobotRecord:
    """A registered robot: what it told the coordinator (never data)."""

    robot_id: str
    num_samples: int
    labels: Mapping[str, str] = field(default_factory=dict)
    descriptor: Descriptor | None = None
    summaries: Mapping[str, np.ndarray] = field(default_factory=dict)


@dataclass(frozen=True)
class RoundRecord:
    """One round: who was selected, its deadline and, once closed, who reported and how."""

    round: int
    selected: tuple[str, ...]
    opened_at: float
    deadline: float
    closed_at: float | None = None
    reported: tuple[str, ...] = ()
    closed_by: str = ""


@dataclass(frozen=True)
class UpdateRecord:
    """An update accepted in the open round; its tensors are in blob ``blob``."""

    round: int
    robot_id: str
    num_samples: int
    num_steps: int
    metrics: Mapping[str, float]
    blob: str


@dataclass(frozen=True)
class Checkpoint:
    """The strategy's state after ``rounds_done`` rounds.

    ``members`` are the strategy's clients in order: the first ``num_initial`` were passed to
    ``initialize``, the rest joined later through ``add_client``. ``meta`` is the JSON half of
    ``Strategy.state_dict()``; the named states are in blob ``blob``.
    """

    rounds_done: int
    members: tuple[str, ...]
    num_initial: int
    meta: Mapping[str, Any]
    blob: str


@dataclass(frozen=True)
class RunRecord:
    """A started run: the initial model's blob, the latest checkpoint, the open round."""

    initial_blob: str
    checkpoint: Checkpoint
    open_round: RoundRecord | None
    finished: bool = False


@dataclass(frozen=True)
class Snapshot:
    """Everything persisted, as loaded at start-up."""

    robots: list[RobotRecord]
    run: RunRecord | None
    updates: list[UpdateRecord]
    history: list[RoundRecord]


class BlobWriter(ABC):
    """Writes one blob; nothing is visible under its key until :meth:`commit`, which records
    the SHA-256 of the bytes written with the blob."""

    @abstractmethod
    def write(self, data: bytes | memoryview) -> None: ...

    @abstractmethod
    def commit(self) -> None:
        """Publish the blob atomically (durable once this returns)."""

    @abstractmethod
    def abort(self) -> None:
        """Drop what was written."""

    def __enter__(self) -> BlobWriter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not None:
            self.abort()


class Store(ABC):
    """Abstract coordinator state; :class:`MemoryStore` and :class:`SqliteStore` implement it."""

    # -- records -----------------------------------------------------------------------------
    @abstractmethod
    def load(self) -> Snapshot:
        """Everything persisted so far."""

    @abstractmethod
    def put_robot(self, robot: RobotRecord) -> None:
        """Insert or replace a robot's registration."""

    @abstractmethod
    def start_run(self, run: RunRecord) -> None:
        """Record the start of the run: initial model, first checkpoint, first round."""

    @abstractmethod
    def save_checkpoint(self, checkpoint: Checkpoint) -> None:
        """Replace the checkpoint (a robot joined); rounds are unchanged."""

    @abstractmethod
    def add_update(self, update: UpdateRecord) -> None:
        """Record an accepted update of the open round (its blob is already committed)."""

    @abstractmethod
    def close_round(
        self, closed: RoundRecord, checkpoint: Checkpoint, next_round: RoundRecord | None
    ) -> None:
        """In one transaction: close a round, store the new checkpoint, forget the closed
        round's updates, and open ``next_round`` (None: the run is finished)."""

    # -- blobs -------------------------------------------------------------------------------
    @abstractmethod
    def blob_writer(self, key: str, size: int | None = None) -> BlobWriter:
        """A writer that publishes blob ``key`` on commit (replacing any blob of that key);
        ``size``, when known, is the blob's expected length (a store may preallocate it)."""

    @abstractmethod
    def read_blob(self, key: str, offset: int, size: int) -> bytearray:
        """``size`` bytes of blob ``key`` from ``offset``."""

    @abstractmethod
    def delete_blob(self, key: str) -> None:
        """Remove a blob (no error when it is absent)."""

    @abstractmethod
    def blob_keys(self) -> list[str]:
        """Keys of all committed blobs."""

    @abstractmethod
    def blob_checksum(self, key: str) -> str | None:
        """The SHA-256 (hex) recorded when blob ``key`` was committed; None: none recorded."""

    @abstractmethod
    def blob_size(self, key: str) -> int:
        """The length of blob ``key`` in bytes (FileNotFoundError / KeyError: no such blob)."""

    @abstractmethod
    def close(self) -> None:
        """Release files and connections."""

    def verify_blob(self, key: str) -> None:
        """Raise :class:`CorruptBlobError` unless blob ``key`` hashes to its recorded
        checksum (reads it once, a few MiB at a time)."""
        recorded = self.blob_checksum(key)
        if recorded is None:
            raise CorruptBlobError(f"blob {key!r} has no recorded checksum: it cannot be trusted")
        digest = hashlib.sha256()
        size = self.blob_size(key)
        for offset in range(0, size, HASH_CHUNK_BYTES):
            digest.update(self.read_blob(key, offset, min(HASH_CHUNK_BYTES, size - offset)))
        if digest.hexdigest() != recorded:
            raise CorruptBlobError(
                f"blob {key!r} is corrupt: its SHA-256 is {digest.hexdigest()[:16]}..., "
                f"{recorded[:16]}... was recorded when it was written"
            )

    def quarantine_blob(self, key: str) -> str | None:
        """Move a blob the state cannot account for (or a corrupt one) out of the store without
        deleting it; where it went (None: this backend keeps it in place, or it is absent)."""
        return None


def valid_id(text: str) -> bool:
    """Whether ``text`` is a robot / principal id (the whole string, no trailing newline)."""
    return ID_PATTERN.fullmatch(text) is not None


def check_key(key: str) -> str:
    if KEY_PATTERN.fullmatch(key) is None:
        raise ValueError(f"blob key {shown(key)} must match {KEY_PATTERN.pattern}")
    return key


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def to_json(value: Any) -> str:
    """JSON text of a record value; numpy scalars and arrays become plain numbers and lists."""
    return json.dumps(value, default=_json_default, sort_keys=True)


def json_roundtrip(value: Mapping[str, Any]) -> dict[str, Any]:
    """What a JSON store gives back for ``value`` (the in-memory store mimics it)."""
    return dict(json.loads(to_json(value)))
