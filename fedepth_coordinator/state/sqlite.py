"""Durable :class:`Store`: SQLite metadata plus one safetensors file per weight blob.

Layout of the state directory::

    state.db                 robots, run, rounds, updates (WAL, synchronous=FULL)
    blobs/<key>.safetensors  weight blobs, written to a temp file, fsynced, renamed, dir fsynced

A transition is one SQLite transaction; blobs it references are committed before it runs.

Blob writes are shaped for streamed uploads: a blob of known size is preallocated, and on Linux
the kernel is asked to start writing each few MiB back to disk as soon as they are written
(``sync_file_range``, asynchronous), so the disk works while the rest of the stream arrives
and the fsync at commit, which alone makes the blob durable, has little left to wait for.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import sqlite3
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load as st_load
from safetensors.numpy import save as st_save

from fedepth.descriptor import Descriptor
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
    to_json,
)

SCHEMA_VERSION = 1
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
"""


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


#: Written bytes handed to the kernel for writeback at a time (see :func:`_writeback_starter`).
WRITEBACK_BYTES = 8 << 20
_SYNC_FILE_RANGE_WRITE = 2  # linux/fs.h: start writeback of dirty pages, do not wait


def _writeback_starter() -> Callable[[int, int, int], None] | None:
    """``start(fd, offset, nbytes)``: asynchronous writeback of a written range (Linux
    ``sync_file_range``), or None where the call is unavailable. A hint only: durability still
    comes from the fsync at commit."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    fn.restype = ctypes.c_int

    def start(fd: int, offset: int, nbytes: int) -> None:
        fn(fd, offset, nbytes, _SYNC_FILE_RANGE_WRITE)  # failure only loses the head start

    return start


_start_writeback = _writeback_starter()


class _FileBlobWriter(BlobWriter):
    def __init__(self, final: Path, size: int | None) -> None:
        self._final = final
        self._tmp = final.with_name(f".{final.name}.{uuid.uuid4().hex}.tmp")
        # unbuffered: chunks are large, and each goes to the kernel as it comes; closed by
        # commit or abort
        self._file: Any = open(self._tmp, "wb", buffering=0)  # noqa: SIM115
        self._size = size
        self._written = 0
        self._handed = 0  # bytes handed to the kernel for writeback
        if size and hasattr(os, "posix_fallocate"):
            # fewer block allocations while writing; trimmed at commit if fewer bytes came
            with contextlib.suppress(OSError):  # not supported here: allocate as it comes
                os.posix_fallocate(self._file.fileno(), 0, size)

    def write(self, data: bytes | memoryview) -> None:
        view = memoryview(data).cast("B")
        while view.nbytes:
            n = self._file.write(view)
            view = view[n:]
            self._written += n
        if _start_writeback is not None and self._written - self._handed >= WRITEBACK_BYTES:
            _start_writeback(self._file.fileno(), self._handed, self._written - self._handed)
            self._handed = self._written

    def commit(self) -> None:
        fd = self._file.fileno()
        if self._size is not None and self._written < self._size:
            os.ftruncate(fd, self._written)
        os.fsync(fd)
        self._file.close()
        os.replace(self._tmp, self._final)
        _fsync_dir(self._final.parent)

    def abort(self) -> None:
        if not self._file.closed:
            self._file.close()
        self._tmp.unlink(missing_ok=True)


class SqliteStore(Store):
    """State in ``directory`` (created if needed); reopening it restores everything."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.blob_dir = self.directory / "blobs"
        self.blob_dir.mkdir(parents=True, exist_ok=True)
        for tmp in self.blob_dir.glob(".*.tmp"):
            tmp.unlink()
        self._lock = threading.Lock()
        self._db = sqlite3.connect(
            self.directory / "state.db", check_same_thread=False, isolation_level=None
        )
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)
        with self._tx() as db:
            row = db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
            if row is None:
                db.execute("INSERT INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
            elif int(row[0]) != SCHEMA_VERSION:
                raise RuntimeError(
                    f"{self.directory}: state schema {row[0]}, this coordinator reads "
                    f"{SCHEMA_VERSION}; use a fresh --state-dir"
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
        return _FileBlobWriter(self._path(key), size)

    def read_blob(self, key: str, offset: int, size: int) -> bytearray:
        buf = bytearray(size)
        with open(self._path(key), "rb") as f:
            f.seek(offset)
            got = f.readinto(buf)
        if got != size:
            raise ValueError(f"blob {key!r}: read past its end ({offset}+{size})")
        return buf

    def delete_blob(self, key: str) -> None:
        self._path(key).unlink(missing_ok=True)

    def blob_keys(self) -> list[str]:
        return sorted(p.name[: -len(_SUFFIX)] for p in self.blob_dir.glob(f"[!.]*{_SUFFIX}"))

    def quarantine_blob(self, key: str) -> str | None:
        target = self.directory / "quarantine" / f"{check_key(key)}{_SUFFIX}"
        target.parent.mkdir(mode=0o700, exist_ok=True)
        if target.exists():  # an earlier quarantine of the same key: keep both
            target = target.with_name(f"{key}-{time.time_ns()}{_SUFFIX}")
        self._path(key).replace(target)
        return str(target)


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
