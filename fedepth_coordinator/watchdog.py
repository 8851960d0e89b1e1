"""Idle timeouts for streams: a call that makes no progress for ``idle_s`` is cancelled.

gRPC has no server-side idle timeout: a robot that stops reading a download (or stops sending
an upload) holds its thread and transfer slot until keepalive notices, which never happens while
the connection is alive. :class:`IdleWatch` runs one thread that cancels such calls.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")


class IdleWatch:
    """Cancels watched calls idle for longer than ``idle_s`` (one checking thread)."""

    def __init__(self, idle_s: float) -> None:
        if not idle_s > 0:
            raise ValueError(f"idle_s must be > 0, got {idle_s}")
        self.idle_s = idle_s
        self._lock = threading.Lock()
        self._entries: dict[int, tuple[Callable[[], None], str, list[float]]] = {}
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None

    def _ensure_thread(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="idle-watch", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        period = min(0.5, self.idle_s / 4)
        while True:
            time.sleep(period)
            now = time.monotonic()
            with self._lock:
                stale = [k for k, (_, _, t) in self._entries.items() if now - t[0] > self.idle_s]
                victims = [self._entries.pop(k) for k in stale]
            for cancel, what, _ in victims:
                log.warning("%s made no progress for %.0f s: cancelled", what, self.idle_s)
                try:
                    cancel()
                except Exception:  # a call that just ended
                    log.debug("cancelling %s failed", what, exc_info=True)

    def watch(self, items: Iterable[T], cancel: Callable[[], None], what: str) -> Iterator[T]:
        """``items``, with the call cancelled when the next one takes more than ``idle_s`` (the
        clock starts at the first item: waiting for a transfer slot before it is not idle)."""
        it = iter(items)
        try:
            first = next(it)
        except StopIteration:
            return
        stamp = [time.monotonic()]
        with self._lock:
            key = next(self._ids)
            self._entries[key] = (cancel, what, stamp)
            self._ensure_thread()
        try:
            yield first
            for item in it:
                stamp[0] = time.monotonic()
                yield item
        finally:
            with self._lock:
                self._entries.pop(key, None)
