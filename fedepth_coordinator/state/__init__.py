"""Coordinator state: the :class:`Store` interface, an in-memory and a SQLite implementation."""

from __future__ import annotations

from pathlib import Path

from fedepth_coordinator.state.base import (
    BlobWriter,
    Checkpoint,
    RobotRecord,
    RoundRecord,
    RunRecord,
    Snapshot,
    Store,
    UpdateRecord,
)
from fedepth_coordinator.state.memory import MemoryStore
from fedepth_coordinator.state.sqlite import SqliteStore


def open_store(backend: str, directory: str | Path | None) -> Store:
    """The store named by ``state.backend``: ``sqlite`` (in ``directory``) or ``memory``."""
    if backend == "memory":
        return MemoryStore()
    if backend == "sqlite":
        if directory is None:
            raise ValueError("the sqlite state backend needs a state directory")
        return SqliteStore(directory)
    raise ValueError(f"unknown state backend {backend!r}; use 'sqlite' or 'memory'")


__all__ = [
    "BlobWriter",
    "Checkpoint",
    "MemoryStore",
    "RobotRecord",
    "RoundRecord",
    "RunRecord",
    "Snapshot",
    "SqliteStore",
    "Store",
    "UpdateRecord",
    "open_store",
]
