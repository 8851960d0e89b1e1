"""One contract suite for every Store (in-memory and SQLite), plus SQLite durability."""

from __future__ import annotations

import hashlib
import stat
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from fedepth.descriptor import Descriptor
from fedepth_coordinator.blobs import BlobReader, write_blob
from fedepth_coordinator.state import (
    Checkpoint,
    MemoryStore,
    RobotRecord,
    RoundRecord,
    RunRecord,
    SqliteStore,
    Store,
    UpdateRecord,
    blob_file,
)
from fedepth_coordinator.state.base import CorruptBlobError, StateError


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    s: Store = MemoryStore() if request.param == "memory" else SqliteStore(tmp_path / "state")
    yield s
    s.close()


def _robot(rid: str, with_descriptor: bool = True) -> RobotRecord:
    d = Descriptor(np.array([1.0, 2.0]), np.array([0.5, 0.25]), 8) if with_descriptor else None
    return RobotRecord(rid, 10, {"platform": "spot"}, d, {"basis": np.eye(2)})


def _checkpoint(done: int, blob: str = "ck") -> Checkpoint:
    return Checkpoint(done, ("a", "b"), 2, {"tau": np.float64(0.5), "M": [[1, 1]]}, blob)


def test_robots_are_stored_replaced_and_kept_in_registration_order(store: Store) -> None:
    store.put_robot(_robot("b"))
    store.put_robot(_robot("a", with_descriptor=False))
    store.put_robot(_robot("b", with_descriptor=False))
    robots = store.load().robots
    assert [r.robot_id for r in robots] == ["b", "a"]
    assert robots[0].descriptor is None and robots[1].labels == {"platform": "spot"}
    store.put_robot(_robot("a"))
    a = store.load().robots[1]
    assert a.descriptor is not None
    np.testing.assert_array_equal(a.descriptor.var, [0.5, 0.25])
    np.testing.assert_array_equal(a.summaries["basis"], np.eye(2))


def test_run_rounds_and_updates_follow_the_transitions(store: Store) -> None:
    assert store.load().run is None
    r0 = RoundRecord(0, ("a", "b"), 1.0, 5.0)
    store.start_run(RunRecord("initial", _checkpoint(0), r0))
    with pytest.raises(RuntimeError, match="already started"):
        store.start_run(RunRecord("initial", _checkpoint(0), r0))
    store.add_update(UpdateRecord(0, "a", 10, 3, {"loss": 0.5}, "upd-a"))
    with pytest.raises(Exception, match=r"already recorded|UNIQUE"):
        store.add_update(UpdateRecord(0, "a", 10, 3, {}, "upd-a"))
    snap = store.load()
    assert snap.run is not None and snap.run.open_round == r0 and not snap.run.finished
    assert snap.run.checkpoint.meta == {"tau": 0.5, "M": [[1, 1]]}  # stored as JSON
    assert [u.robot_id for u in snap.updates] == ["a"] and snap.updates[0].metrics == {"loss": 0.5}

    closed = RoundRecord(0, ("a", "b"), 1.0, 5.0, closed_at=6.0, reported=("a",), closed_by="q")
    r1 = RoundRecord(1, ("a", "b"), 6.0, 10.0)
    store.close_round(closed, _checkpoint(1, "ck1"), r1)
    snap = store.load()
    assert snap.updates == [] and snap.history == [closed]
    assert snap.run is not None and snap.run.open_round == r1
    assert snap.run.checkpoint.rounds_done == 1 and snap.run.checkpoint.blob == "ck1"

    store.save_checkpoint(Checkpoint(1, ("a", "b", "c"), 2, {}, "ck1b"))
    assert store.load().run.checkpoint.members == ("a", "b", "c")  # type: ignore[union-attr]
    store.close_round(
        RoundRecord(1, ("a", "b"), 6.0, 10.0, 11.0, ("a", "b"), "all"), _checkpoint(2), None
    )
    snap = store.load()
    assert snap.run is not None and snap.run.finished and snap.run.open_round is None
    assert [h.round for h in snap.history] == [0, 1]


def test_blobs_are_safetensors_published_only_on_commit(store: Store, tmp_path: Path) -> None:
    groups = {
        "cluster/0": {"w": np.arange(6, dtype=np.float32).reshape(2, 3)},
        "x": {"n": np.array(3)},
    }
    write_blob(store, "ck", groups, chunk_bytes=5)
    reader = BlobReader(store, "ck")
    out = reader.read_all()
    np.testing.assert_array_equal(out["cluster/0"]["w"], groups["cluster/0"]["w"])
    lazy = reader.lazy("cluster/0")
    assert list(lazy) == ["w"] and len(lazy) == 1 and "zz" not in lazy
    out["cluster/0"]["w"][0, 0] = 7  # arrays read back are writable copies
    assert reader.tensor("cluster/0", "w")[0, 0] == 0

    writer = store.blob_writer("half")
    writer.write(b"partial")
    writer.abort()
    with pytest.raises(RuntimeError), store.blob_writer("boom") as w:
        w.write(b"x")
        raise RuntimeError("crash while writing")
    assert store.blob_keys() == ["ck"]
    store.delete_blob("ck")
    assert store.blob_keys() == []
    if isinstance(store, SqliteStore):
        write_blob(store, "ck", groups)
        plain = load_file(str(store.blob_dir / "ck.safetensors"))
        np.testing.assert_array_equal(plain["cluster/0/w"], groups["cluster/0"]["w"])
        assert not list(store.blob_dir.glob(".*"))  # no temp files left


def test_sqlite_state_survives_reopening(tmp_path: Path) -> None:
    s = SqliteStore(tmp_path / "state")
    s.put_robot(_robot("a"))
    s.start_run(RunRecord("initial", _checkpoint(0), RoundRecord(0, ("a",), 1.0, 2.0)))
    s.add_update(UpdateRecord(0, "a", 10, 1, {}, "upd"))
    write_blob(s, "upd", {"state": {"w": np.ones(3)}})
    (s.blob_dir / ".upd.safetensors.dead.tmp").write_bytes(b"left by a crash")
    s.close()
    again = SqliteStore(tmp_path / "state")
    snap = again.load()
    assert [r.robot_id for r in snap.robots] == ["a"]
    assert snap.run is not None and snap.run.open_round is not None
    assert [u.blob for u in snap.updates] == ["upd"]
    np.testing.assert_array_equal(BlobReader(again, "upd").tensor("state", "w"), np.ones(3))
    assert not list(again.blob_dir.glob(".*.tmp"))
    again.close()


@pytest.mark.parametrize("writeback", [True, False])
def test_blob_size_hints_preallocate_without_changing_the_bytes(
    store: Store, monkeypatch: pytest.MonkeyPatch, writeback: bool
) -> None:
    """A size hint (exact, too large, too small) never changes what is stored; on SQLite the
    early writeback (every few bytes here) and its absence (other systems) give the same."""
    if isinstance(store, SqliteStore):
        monkeypatch.setattr(blob_file, "WRITEBACK_BYTES", 7)
        if not writeback:
            monkeypatch.setattr(blob_file, "_start_writeback", None)
    data = bytes(range(256)) * 9
    for key, hint in (("exact", len(data)), ("large", len(data) + 4096), ("small", 10)):
        with store.blob_writer(key, size=hint) as w:
            for i in range(0, len(data), 100):
                w.write(memoryview(data)[i : i + 100])
            w.commit()
        assert store.read_blob(key, 0, len(data)) == data
        with pytest.raises(ValueError, match="past its end"):
            store.read_blob(key, 0, len(data) + 1)
    with store.blob_writer("dropped", size=1 << 20) as w:
        w.write(data)
        w.abort()
    assert store.blob_keys() == ["exact", "large", "small"]
    if isinstance(store, SqliteStore):
        assert not list(store.blob_dir.glob(".*"))  # no temp files left


# -- integrity: a checksum per blob, recorded with it and verified on load (issue 14, item 10) --
def _corrupt(store: Store, key: str, offset: int, data: bytes) -> None:
    """Change bytes of a committed blob behind the store's back (a disk fault)."""
    if isinstance(store, MemoryStore):
        store.corrupt_blob(key, offset, data)
    else:
        assert isinstance(store, SqliteStore)
        with open(store.blob_dir / f"{key}.safetensors", "r+b") as f:
            f.seek(offset)
            f.write(data)


def test_blob_checksum_is_recorded_on_commit_and_a_changed_byte_is_detected(
    store: Store,
) -> None:
    write_blob(store, "ck", {"state": {"w": np.ones(16, dtype=np.float32)}}, chunk_bytes=7)
    size = store.blob_size("ck")
    raw = bytes(store.read_blob("ck", 0, size))
    assert store.blob_checksum("ck") == hashlib.sha256(raw).hexdigest()
    store.verify_blob("ck")
    np.testing.assert_array_equal(BlobReader(store, "ck").tensor("state", "w"), np.ones(16))

    _corrupt(store, "ck", size - 4, np.float32(np.nan).tobytes())  # NaN bytes in the data
    with pytest.raises(CorruptBlobError, match="'ck' is corrupt"):
        store.verify_blob("ck")
    with pytest.raises(CorruptBlobError):
        BlobReader(store, "ck")  # never read back as tensors
    store.delete_blob("ck")
    assert store.blob_checksum("ck") is None and store.blob_keys() == []


def test_an_aborted_blob_records_no_checksum(store: Store) -> None:
    with store.blob_writer("gone") as w:
        w.write(b"abc")
        w.abort()
    assert store.blob_checksum("gone") is None


def test_sqlite_blob_with_no_recorded_checksum_is_not_trusted(tmp_path: Path) -> None:
    s = SqliteStore(tmp_path / "state")
    write_blob(s, "ck", {"state": {"w": np.ones(3)}})
    (s.blob_dir / "stray.safetensors").write_bytes((s.blob_dir / "ck.safetensors").read_bytes())
    with pytest.raises(CorruptBlobError, match="no recorded checksum"):
        BlobReader(s, "stray")
    s.close()


def test_sqlite_read_of_an_absurd_size_fails_before_allocating(tmp_path: Path) -> None:
    s = SqliteStore(tmp_path / "state")
    write_blob(s, "ck", {"state": {"w": np.ones(3)}})
    with pytest.raises(ValueError, match="past its end"):
        s.read_blob("ck", 8, 1 << 60)  # a corrupt header length: no MemoryError
    s.close()


def test_sqlite_state_files_are_private(tmp_path: Path) -> None:
    s = SqliteStore(tmp_path / "state")
    write_blob(s, "ck", {"state": {"w": np.ones(3)}})
    s.put_robot(_robot("a"))
    s.quarantine_blob("ck")
    for d in (s.directory, s.blob_dir, s.directory / "quarantine"):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
    files = [p for p in s.directory.rglob("*") if p.is_file()]
    assert any(p.name == "state.db" for p in files) and any(p.suffix == ".sha256" for p in files)
    for p in files:
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p
    s.close()


def test_sqlite_missing_database_beside_blobs_refuses_to_open(tmp_path: Path) -> None:
    s = SqliteStore(tmp_path / "state")
    write_blob(s, "initial", {"state": {"w": np.ones(3)}})
    s.close()
    for f in (tmp_path / "state").glob("state.db*"):
        f.unlink()
    with pytest.raises(StateError, match=r"state\.db is missing .*initial\.safetensors") as err:
        SqliteStore(tmp_path / "state")
    assert "backup" in str(err.value) and "--state-dir" in str(err.value)
    assert not (tmp_path / "state" / "state.db").exists()  # no fresh database was made
    assert (tmp_path / "state" / "blobs" / "initial.safetensors").exists()


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_sqlite_corrupt_database_refuses_to_open(tmp_path: Path, damage: str) -> None:
    s = SqliteStore(tmp_path / "state")
    for i in range(200):  # a few pages
        s.put_robot(_robot(f"r{i:03d}"))
    s.close()
    db = tmp_path / "state" / "state.db"
    data = db.read_bytes()
    db.write_bytes(b"\xde\xad" * 4096 if damage == "garbage" else data[: len(data) // 3])
    with pytest.raises(StateError, match=r"state\.db .*(corrupt|unreadable)") as err:
        SqliteStore(tmp_path / "state").load()
    assert "Recover:" in str(err.value) and "\n" not in str(err.value)


def test_sqlite_state_of_schema_1_gets_the_checksums_of_its_blobs(tmp_path: Path) -> None:
    s = SqliteStore(tmp_path / "state")
    write_blob(s, "ck", {"state": {"w": np.ones(3)}})
    s._db.execute("DELETE FROM blobs")
    s._db.execute("UPDATE meta SET value = '1' WHERE key = 'schema'")
    s.close()
    again = SqliteStore(tmp_path / "state")
    again.verify_blob("ck")
    again.close()
