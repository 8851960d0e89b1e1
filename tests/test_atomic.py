"""fedepth.atomic: temp file beside the target, renamed on success, removed on failure."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from fedepth.atomic import atomic_path, atomic_write_bytes, atomic_write_text


def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


def test_writes_replace_the_file_and_leave_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "out.json"
    atomic_write_text(target, "first\n")
    assert target.read_text(encoding="utf-8") == "first\n"
    atomic_write_bytes(target, b"\x00second")
    assert target.read_bytes() == b"\x00second"
    with atomic_path(target, fsync=True) as tmp:
        assert tmp.parent == tmp_path and tmp.is_file() and tmp.stat().st_size == 0
        tmp.write_text("third", encoding="utf-8")
        assert target.read_bytes() == b"\x00second"  # not yet renamed
    assert target.read_text(encoding="utf-8") == "third"
    assert _leftovers(tmp_path) == []


def test_a_failed_write_leaves_the_old_file_and_no_temp(tmp_path: Path) -> None:
    target = tmp_path / "state.yaml"
    target.write_text("old", encoding="utf-8")
    with pytest.raises(RuntimeError, match="crash"), atomic_path(target) as tmp:
        tmp.write_text("half", encoding="utf-8")
        raise RuntimeError("crash while writing")
    assert target.read_text(encoding="utf-8") == "old"
    assert _leftovers(tmp_path) == []

    with pytest.raises(TypeError):  # fails after the temp file was created
        atomic_write_bytes(target, "not bytes")  # type: ignore[arg-type]
    assert target.read_text(encoding="utf-8") == "old"
    assert _leftovers(tmp_path) == []


def test_mode_applies_to_the_new_file(tmp_path: Path) -> None:
    secret = tmp_path / "credentials.yaml"
    atomic_write_text(secret, "token: x\n", mode=0o600, fsync=True)
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    with atomic_path(tmp_path / "blob", mode=0o600) as tmp:
        assert stat.S_IMODE(tmp.stat().st_mode) == 0o600
        tmp.write_bytes(b"x")
    assert stat.S_IMODE((tmp_path / "blob").stat().st_mode) == 0o600
    umask = os.umask(0)
    os.umask(umask)
    atomic_write_text(tmp_path / "plain", "x")  # as open() creates it
    assert stat.S_IMODE((tmp_path / "plain").stat().st_mode) == 0o666 & ~umask


def test_concurrent_writers_use_distinct_temps(tmp_path: Path) -> None:
    target = tmp_path / "port"
    with atomic_path(target) as a, atomic_path(target) as b:
        assert a != b and a.parent == b.parent == tmp_path
        assert f".{os.getpid()}." in a.name and a.name.startswith("port.")
        a.write_text("a", encoding="utf-8")
        b.write_text("b", encoding="utf-8")
    assert target.read_text(encoding="utf-8") == "a"  # the outer block renamed last

    payloads = [bytes([i]) * 4096 for i in range(8)]
    errors: list[BaseException] = []

    def write(data: bytes) -> None:
        try:
            for _ in range(50):
                atomic_write_bytes(target, data)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(p,)) for p in payloads]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert target.read_bytes() in payloads  # one writer's whole file, never a mix
    assert _leftovers(tmp_path) == []
