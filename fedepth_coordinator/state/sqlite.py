"""Durable :class:`Store`: SQLite metadata plus one safetensors file per weight blob.

Layout of the state directory (0700; files 0600)::

    state.db                 robots, run, rounds, updates, blob checksums (WAL, synchronous=FULL)
    blobs/<key>.safetensors  weight blobs, written to a temp file, fsynced, renamed, dir fsynced
    quarantine/              blobs moved aside (corrupt, or not accounted for by state.db)

A transition is one SQLite transaction; blobs it references are committed before it runs. The
SHA-256 of every blob is recorded in ``state.db`` when it is committed and checked by
:meth:`~fedepth_coordinator.state.base.Store.verify_blob` before it is used.

Opening refuses (:class:`~fedepth_coordinator.state.base.StateError`) a directory whose
``state.db`` is missing while blobs are there, or whose database is unreadable or fails SQLite's
``quick_check``: a fresh database would forget the run the blobs belong to.

Blob files are written by :mod:`fedepth_coordinator.state.blob_file`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from fedepth.descriptor import Descriptor
from fedepth_coordinator.state.base import (
    BlobWriter,
    Checkpoint,
    CorruptBlobError,
    RobotRecord,
    RoundRecord,
    RunRecord,
    Snapshot,
    StateError,
    Store,
    UpdateRecord,
    check_key,
    to_json,
)
from fedepth_coordinator.state.blob_file import FILE_MODE, FileBlobWriter, private_dir

log = logging.getLogger(__name__)

#: 2: blob checksums (a version-1 state gets the checksums of its blobs as they are on opening).
SCHEMA_VERSION = 2
_SUFFIX = ".safetensors"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS robots (
    robot_id TEXT PRIMARY KEY,
    seq INTEGER NOT NULL,
    num_samples INTEGER NOT NULL,
    labels TEXT NOT NULL,
    desc_mean BLOB,
    desc_var BLOB,
    desc_frames INTEGER,
    summaries BLOB
);
CREATE TABLE IF NOT EXISTS rounds (
    round INTEGER PRIMARY KEY,
    selected TEXT NOT NULL,
    opened_at REAL NOT NULL,
    deadline REAL NOT NULL,
    closed_at REAL,
    reported TEXT NOT NULL DEFAULT '[]',
    closed_by TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS updates (
    round INTEGER NOT NULL,
    robot_id TEXT NOT NULL,
    num_samples INTEGER NOT NULL,
    num_steps INTEGER NOT NULL,
    metrics TEXT NOT NULL,
    blob TEXT NOT NULL,
    PRIMARY KEY (round, robot_id)
);
CREATE TABLE IF NOT EXISTS blobs (
    key TEXT PRIMARY KEY,
    sha256 TEXT NOT NULL,
    size INTEGER NOT NULL
);
"""

#: What a state directory that cannot be opened says about recovering it.
_RECOVER = (
    "restore the state directory (state.db with its -wal file, and blobs/) from a backup, or "
    "start a fresh run with another --state-dir; nothing in this one was changed or deleted"
)


#: What reading corrupt records raises (bad JSON, wrong types, absurd sizes, bad safetensors).
_UNREADABLE = (sqlite3.Error, ValueError, KeyError, TypeError, MemoryError, SafetensorError)


class SqliteStore(Store):
    """State in ``directory`` (created if needed); reopening it restores everything."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.blob_dir = self.directory / "blobs"
        self.db_path = self.directory / "state.db"
        private_dir(self.directory)
        private_dir(self.blob_dir)
        if not self.db_path.exists() and self.blob_keys():
            raise StateError(
                f"{self.db_path} is missing but {self.blob_dir} holds "
                f"{_some(self.blob_keys())}: without it the coordinator cannot tell which run "
                f"they belong to. Recover: {_RECOVER}"
            )
        for tmp in self.blob_dir.glob(".*.tmp"):
            tmp.unlink()
        self._lock = threading.Lock()
        if not self.db_path.exists():  # 0600 from the start (SQLite gives its -wal the same)
            os.close(os.open(self.db_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE))
        for f in (self.db_path, *self.directory.glob("state.db-*")):
            with contextlib.suppress(OSError):
                os.chmod(f, FILE_MODE)
        try:
            self._db = sqlite3.connect(self.db_path, check_same_thread=False, isolation_level=None)
        except sqlite3.Error as exc:
            raise StateError(
                f"{self.db_path} cannot be opened ({exc}). Recover: {_RECOVER}"
            ) from None
        try:
            self._open()
        except (sqlite3.Error, ValueError) as exc:
            self._db.close()
            raise StateError(
                f"{self.db_path} is corrupt or not a coordinator state ({exc}). Recover: "
                f"{_RECOVER}"
            ) from None

    def _open(self) -> None:
        check = self._db.execute("PRAGMA quick_check").fetchall()
        if check != [("ok",)]:
            raise ValueError(f"SQLite quick_check: {'; '.join(str(r[0]) for r in check[:3])}")
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)
        with self._tx() as db:
            row = db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
            if row is None:
                db.execute("INSERT INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
            elif row[0] == "1":
                self._record_unverified(db)
                db.execute(
                    "UPDATE meta SET value = ? WHERE key = 'schema'", (str(SCHEMA_VERSION),)
                )
            elif row[0] != str(SCHEMA_VERSION):
                raise StateError(
                    f"{self.directory}: state schema {row[0]}, this coordinator reads "
                    f"{SCHEMA_VERSION}; use a fresh --state-dir"
                )

    def _record_unverified(self, db: sqlite3.Connection) -> None:
        """Schema 1 kept no checksums: record those of the blobs as they are now."""
        keys = self.blob_keys()
        for key in keys:
            with open(self._path(key), "rb") as f:
                digest = hashlib.file_digest(f, "sha256").hexdigest()
            db.execute(
                "INSERT OR REPLACE INTO blobs VALUES (?, ?, ?)",
                (key, digest, self._path(key).stat().st_size),
            )
        log.warning(
            "%s: state written before blob checksums; recorded the checksums of its %d blobs as "
            "they are now (corruption from before this start is not detected)",
            self.directory,
            len(keys),
        )

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    # -- records -----------------------------------------------------------------------------
    def load(self) -> Snapshot:
        try:
            return self._load()
        except _UNREADABLE as exc:
            raise StateError(
                f"{self.db_path} holds unreadable records ({type(exc).__name__}: "
                f"{str(exc)[:200]}). Recover: {_RECOVER}"
            ) from None

    def _load(self) -> Snapshot:
        with self._tx() as db:
            robots = [_robot_from_row(r) for r in db.execute("SELECT * FROM robots ORDER BY seq")]
            meta = dict(db.execute("SELECT key, value FROM meta").fetchall())
            rounds = [
                _round_from_row(r) for r in db.execute("SELECT * FROM rounds ORDER BY round")
            ]
            updates = [
                UpdateRecord(r[0], r[1], r[2], r[3], json.loads(r[4]), r[5])
                for r in db.execute("SELECT * FROM updates ORDER BY round, robot_id")
            ]
        run = None
        if "run" in meta:
            saved = json.loads(meta["run"])
            open_round = next((r for r in rounds if r.closed_at is None), None)
            run = RunRecord(
                initial_blob=saved["initial_blob"],
                checkpoint=_checkpoint_from_json(saved["checkpoint"]),
                open_round=open_round,
                finished=saved["finished"],
            )
        history = [r for r in rounds if r.closed_at is not None]
        return Snapshot(robots=robots, run=run, updates=updates, history=history)

    def put_robot(self, robot: RobotRecord) -> None:
        d = robot.descriptor
        with self._tx() as db:
            db.execute(
                "INSERT INTO robots VALUES (?, (SELECT COALESCE(MAX(seq), 0) + 1 FROM robots), "
                "?, ?, ?, ?, ?, ?) ON CONFLICT (robot_id) DO UPDATE SET "
                "num_samples = excluded.num_samples, labels = excluded.labels, "
                "desc_mean = excluded.desc_mean, desc_var = excluded.desc_var, "
                "desc_frames = excluded.desc_frames, summaries = excluded.summaries",
                (
                    robot.robot_id,
                    robot.num_samples,
                    json.dumps(dict(robot.labels), sort_keys=True),
                    None if d is None else d.mean.astype("<f8").tobytes(),
                    None if d is None else d.var.astype("<f8").tobytes(),
                    None if d is None else d.num_frames,
                    st_save(dict(robot.summaries)) if robot.summaries else None,
                ),
            )

    def start_run(self, run: RunRecord) -> None:
        if run.open_round is None:
            raise ValueError("a run starts with an open round")
        with self._tx() as db:
            if db.execute("SELECT 1 FROM meta WHERE key = 'run'").fetchone():
                raise RuntimeError("the run has already started")
            self._put_run(db, run.initial_blob, run.checkpoint, finished=False)
            _insert_round(db, run.open_round)

    def save_checkpoint(self, checkpoint: Checkpoint) -> None:
        with self._tx() as db:
            saved = self._get_run(db)
            self._put_run(db, saved["initial_blob"], checkpoint, finished=saved["finished"])

    def add_update(self, update: UpdateRecord) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO updates VALUES (?, ?, ?, ?, ?, ?)",
                (
                    update.round,
                    update.robot_id,
                    update.num_samples,
                    update.num_steps,
                    json.dumps(dict(update.metrics)),
                    update.blob,
                ),
            )

    def close_round(
        self, closed: RoundRecord, checkpoint: Checkpoint, next_round: RoundRecord | None
    ) -> None:
        with self._tx() as db:
            saved = self._get_run(db)
            db.execute(
                "UPDATE rounds SET closed_at = ?, reported = ?, closed_by = ? WHERE round = ?",
                (
                    closed.closed_at,
                    json.dumps(list(closed.reported)),
                    closed.closed_by,
                    closed.round,
                ),
            )
            db.execute("DELETE FROM updates WHERE round = ?", (closed.round,))
            if next_round is not None:
                _insert_round(db, next_round)
            self._put_run(db, saved["initial_blob"], checkpoint, finished=next_round is None)

    @staticmethod
    def _get_run(db: sqlite3.Connection) -> dict[str, Any]:
        row = db.execute("SELECT value FROM meta WHERE key = 'run'").fetchone()
        if row is None:
            raise RuntimeError("no run in progress")
        return dict(json.loads(row[0]))

    @staticmethod
    def _put_run(
        db: sqlite3.Connection, initial_blob: str, checkpoint: Checkpoint, *, finished: bool
    ) -> None:
        value = {
            "initial_blob": initial_blob,
            "checkpoint": _checkpoint_to_json(checkpoint),
            "finished": finished,
        }
        db.execute("INSERT OR REPLACE INTO meta VALUES ('run', ?)", (to_json(value),))

    # -- blobs -------------------------------------------------------------------------------
    def _path(self, key: str) -> Path:
        return self.blob_dir / f"{check_key(key)}{_SUFFIX}"

    def blob_writer(self, key: str, size: int | None = None) -> BlobWriter:
        def record(sha256: str, nbytes: int) -> None:
            with self._tx() as db:
                db.execute("INSERT OR REPLACE INTO blobs VALUES (?, ?, ?)", (key, sha256, nbytes))

        return FileBlobWriter(self._path(key), size, record)

    def read_blob(self, key: str, offset: int, size: int) -> bytearray:
        with open(self._path(key), "rb") as f:
            end = os.fstat(f.fileno()).st_size
            if offset < 0 or size < 0 or offset + size > end:
                # checked before allocating: a corrupt length never becomes a huge buffer
                raise ValueError(f"blob {key!r}: read past its end ({offset}+{size} > {end})")
            buf = bytearray(size)
            f.seek(offset)
            got = f.readinto(buf)
        if got != size:
            raise ValueError(f"blob {key!r}: read past its end ({offset}+{size})")
        return buf

    def verify_blob(self, key: str) -> None:
        recorded = self.blob_checksum(key)
        if recorded is None:
            raise CorruptBlobError(f"blob {key!r} has no recorded checksum: it cannot be trusted")
        with open(self._path(key), "rb") as f:  # one small reused buffer, not chunk copies
            actual = hashlib.file_digest(f, "sha256").hexdigest()
        if actual != recorded:
            raise CorruptBlobError(
                f"blob {key!r} is corrupt: its SHA-256 is {actual[:16]}..., "
                f"{recorded[:16]}... was recorded when it was written"
            )

    def blob_size(self, key: str) -> int:
        return self._path(key).stat().st_size

    def blob_checksum(self, key: str) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT sha256 FROM blobs WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def delete_blob(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)
        with self._tx() as db:
            db.execute("DELETE FROM blobs WHERE key = ?", (key,))

    def blob_keys(self) -> list[str]:
        return sorted(p.name[: -len(_SUFFIX)] for p in self.blob_dir.glob(f"[!.]*{_SUFFIX}"))

    def quarantine_blob(self, key: str) -> str | None:
        target = self.directory / "quarantine" / f"{check_key(key)}{_SUFFIX}"
        target.parent.mkdir(mode=0o700, exist_ok=True)
        if target.exists():  # an earlier quarantine of the same key: keep both
            target = target.with_name(f"{key}-{time.time_ns()}{_SUFFIX}")
        recorded = self.blob_checksum(key)
        if not self._path(key).exists():
            return None
        self._path(key).replace(target)
        if recorded is not None:  # what the bytes should hash to, for whoever inspects it
            side = target.with_name(f"{target.name}.sha256")
            fd = os.open(side, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
            with os.fdopen(fd, "w") as f:
                f.write(f"{recorded}  {key}{_SUFFIX}\n")
        with self._tx() as db:
            db.execute("DELETE FROM blobs WHERE key = ?", (key,))
        return str(target)


def _some(keys: list[str]) -> str:
    shown = ", ".join(f"{k}{_SUFFIX}" for k in keys[:5])
    return f"{len(keys)} blobs ({shown}{', ...' if len(keys) > 5 else ''})"


def _insert_round(db: sqlite3.Connection, r: RoundRecord) -> None:
    db.execute(
        "INSERT INTO rounds VALUES (?, ?, ?, ?, ?, ?, ?)",
        (
            r.round,
            json.dumps(list(r.selected)),
            r.opened_at,
            r.deadline,
            r.closed_at,
            json.dumps(list(r.reported)),
            r.closed_by,
        ),
    )


def _round_from_row(row: tuple[Any, ...]) -> RoundRecord:
    return RoundRecord(
        round=row[0],
        selected=tuple(json.loads(row[1])),
        opened_at=row[2],
        deadline=row[3],
        closed_at=row[4],
        reported=tuple(json.loads(row[5])),
        closed_by=row[6],
    )


def _robot_from_row(row: tuple[Any, ...]) -> RobotRecord:
    robot_id, _, num_samples, labels, mean, var, frames, summaries = row
    descriptor = None
    if mean is not None:
        descriptor = Descriptor(
            mean=np.frombuffer(mean, "<f8").copy(),
            var=np.frombuffer(var, "<f8").copy(),
            num_frames=int(frames),
        )
    return RobotRecord(
        robot_id=robot_id,
        num_samples=int(num_samples),
        labels=json.loads(labels),
        descriptor=descriptor,
        summaries=st_load(summaries) if summaries else {},
    )


def _checkpoint_to_json(c: Checkpoint) -> dict[str, Any]:
    return {
        "rounds_done": c.rounds_done,
        "members": list(c.members),
        "num_initial": c.num_initial,
        "meta": c.meta,
        "blob": c.blob,
    }


def _checkpoint_from_json(d: Mapping[str, Any]) -> Checkpoint:
    return Checkpoint(
        rounds_done=int(d["rounds_done"]),
        members=tuple(d["members"]),
        num_initial=int(d["num_initial"]),
        meta=d["meta"],
        blob=str(d["blob"]),
    )
