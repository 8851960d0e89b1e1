"""Two-stage pipeline for streams: one thread receives items while a worker consumes them.

An upload is received by a gRPC thread and checked and written to disk chunk by chunk. Done in
one thread, the next chunk is only asked for once the last one is on disk, and with HTTP/2 flow
control at its default window the robot waits meanwhile. :func:`consume_in_worker` lets the
receiving thread ask for the next chunk at once while a worker checks and writes the previous
ones, with at most ``depth`` chunks queued between them (memory stays bounded).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable
from typing import TypeVar

T = TypeVar("T")

_END = object()


def consume_in_worker(
    items: Iterable[T], consume: Callable[[T], None], *, depth: int = 2, name: str = "consume"
) -> None:
    """Call ``consume`` on every item, in order, in a worker thread while this thread takes the
    next items from ``items`` (at most ``depth`` waiting between the two).

    Returns once every item is consumed. The first error of either side is raised here after the
    worker has stopped: an error of ``consume`` stops the intake at the next item (items already
    queued are dropped, not consumed); an error of ``items`` stops the worker after the queued
    items.
    """
    if depth < 1:
        raise ValueError(f"depth must be >= 1, got {depth}")
    pending: queue.Queue[object] = queue.Queue(maxsize=depth)
    failed: list[BaseException] = []

    def work() -> None:
        while True:
            item = pending.get()
            if item is _END:
                return
            if failed:
                continue  # drain, so that the intake never blocks on a full queue
            try:
                consume(item)  # type: ignore[arg-type]  # anything but _END is a T
            except BaseException as exc:  # re-raised in the calling thread
                failed.append(exc)

    worker = threading.Thread(target=work, name=name, daemon=True)
    worker.start()
    try:
        for item in items:
            if failed:
                break
            pending.put(item)
    finally:
        pending.put(_END)
        worker.join()
    if failed:
        raise failed[0]
