"""Durable blob files: written to a temp file, fsynced, renamed, the directory fsynced; 0600.

Blob writes are shaped for streamed uploads: a blob of known size is preallocated, and on Linux
the kernel is asked to start writing each few MiB back to disk as soon as they are written
(``sync_file_range``, asynchronous), so the disk works while the rest of the stream arrives
and the fsync at commit, which alone makes the blob durable, has little left to wait for.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fedepth.atomic import fsync_path
from fedepth_coordinator.state.base import BlobWriter

#: Modes of the state's directories and files: the state is the fleet's models.
DIR_MODE = 0o700
FILE_MODE = 0o600


def private_dir(path: Path) -> None:
    """Create ``path`` (and parents) and make it 0700: the state is the fleet's models."""
    path.mkdir(parents=True, exist_ok=True, mode=DIR_MODE)
    with contextlib.suppress(OSError):  # not ours to change (a mounted volume): keep going
        os.chmod(path, DIR_MODE)


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


class FileBlobWriter(BlobWriter):
    """A blob streamed into a temp file beside ``final``; :meth:`commit` makes it durable under
    its name and reports ``on_commit(sha256, size)``, :meth:`abort` removes it."""

    def __init__(
        self, final: Path, size: int | None, on_commit: Callable[[str, int], None]
    ) -> None:
        self._final = final
        self._tmp = final.with_name(f".{final.name}.{uuid.uuid4().hex}.tmp")
        # unbuffered: chunks are large, and each goes to the kernel as it comes; closed by
        # commit or abort; 0600 like every state file
        fd = os.open(self._tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
        self._file: Any = os.fdopen(fd, "wb", buffering=0)
        self._size = size
        self._written = 0
        self._hash = hashlib.sha256()
        self._on_commit = on_commit
        self._handed = 0  # bytes handed to the kernel for writeback
        if size and hasattr(os, "posix_fallocate"):
            # fewer block allocations while writing; trimmed at commit if fewer bytes came
            with contextlib.suppress(OSError):  # not supported here: allocate as it comes
                os.posix_fallocate(self._file.fileno(), 0, size)

    def write(self, data: bytes | memoryview) -> None:
        view = memoryview(data).cast("B")
        self._hash.update(view)
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
        fsync_path(self._final.parent)
        self._on_commit(self._hash.hexdigest(), self._written)

    def abort(self) -> None:
        if not self._file.closed:
            self._file.close()
        self._tmp.unlink(missing_ok=True)
