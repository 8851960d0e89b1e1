"""Atomic file writes: a temporary file in the same directory, renamed over the target.

A reader sees the old file or the new one, never a half-written one. The temporary file is
named ``<name>.<pid>.<random>.tmp`` beside the target, so two processes (or threads) writing
the same file never share a temporary; it is created with ``mode`` (less the umask, as
``open`` does), renamed over the target on success and removed on failure. ``fsync=True``
makes the new bytes durable before the rename (the directory is not fsynced).
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path

#: the mode ``open`` creates files with (before the umask)
DEFAULT_MODE = 0o666


def temp_path(path: Path) -> Path:
    """A fresh temporary name beside ``path``: ``<name>.<pid>.<8 hex digits>.tmp``."""
    return path.with_name(f"{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")


def fsync_path(path: Path) -> None:
    """fsync a file or a directory by its path."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(
    path: str | os.PathLike[str], *, mode: int = DEFAULT_MODE, fsync: bool = False
) -> Iterator[Path]:
    """Yield a new, empty temporary file beside ``path`` to write (by name: a library that
    writes to a path); renamed over ``path`` when the block ends, removed if it raises."""
    final = Path(path)
    tmp = temp_path(final)
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode))
    try:
        yield tmp
        if fsync:
            fsync_path(tmp)
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_bytes(
    path: str | os.PathLike[str], data: bytes, *, mode: int = DEFAULT_MODE, fsync: bool = False
) -> None:
    """Write ``data`` to ``path`` atomically (see :func:`atomic_path`)."""
    final = Path(path)
    tmp = temp_path(final)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_text(
    path: str | os.PathLike[str],
    text: str,
    *,
    encoding: str = "utf-8",
    mode: int = DEFAULT_MODE,
    fsync: bool = False,
) -> None:
    """Write ``text`` to ``path`` atomically (see :func:`atomic_path`)."""
    atomic_write_bytes(path, text.encode(encoding), mode=mode, fsync=fsync)
