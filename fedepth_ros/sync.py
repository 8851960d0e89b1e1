"""Sensor intake without ROS: image/depth pairing by stamp, drop-oldest queue, frame buffer.

The node side is: subscription callbacks -> :class:`PairSync` (approximate time pairing of two
streams) -> :class:`FrameBuffer` (bounded, drop-oldest, frame stride, optional spill to disk)
<- worker thread (descriptor, training) sampling from it. :class:`DropOldestQueue` hands single
items from a spin thread to a worker (live inference). Nothing here blocks a producer on I/O or
on a consumer, and every structure is bounded and thread-safe.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import queue
import threading
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import numpy as np

from fedepth.atomic import atomic_path
from fedepth.data.frames import FrameLike, RGBDFrame

log = logging.getLogger(__name__)

A = TypeVar("A")
B = TypeVar("B")
T = TypeVar("T")

SPILL_PREFIX = "fedepth_frame_"


# ---------------------------------------------------------------- pairing


@dataclass(frozen=True, slots=True)
class Pair(Generic[A, B]):
    """An image and a depth item whose stamps lie within the slop of each other."""

    image_stamp_ns: int
    image: A
    depth_stamp_ns: int
    depth: B


@dataclass(frozen=True, slots=True)
class SyncStats:
    """Counters of a :class:`PairSync`; every received item ends up paired, dropped or queued."""

    images_received: int
    depths_received: int
    paired: int
    images_dropped: int
    depths_dropped: int
    images_queued: int
    depths_queued: int


class PairSync(Generic[A, B]):
    """Approximate-time pairing of two stamped streams (image, depth), one-to-one.

    Each item is paired with its nearest partner of the other stream when the two are mutual
    nearest neighbours and ``|t_image - t_depth| <= slop_ns``. A pair is emitted as soon as it
    is final: at once for equal stamps, otherwise when the next item of the earlier stream
    shows it cannot do better. Stamps are expected to increase within a stream; an item not
    newer than one already consumed from its stream is dropped as late. Each stream's queue
    holds at most ``queue_size`` items (the oldest is dropped). Thread-safe; ``add_*`` never
    blocks beyond a short lock.
    """

    def __init__(self, slop_ns: int, queue_size: int = 10) -> None:
        if slop_ns < 0:
            raise ValueError(f"slop must be >= 0 ns, got {slop_ns}")
        if queue_size < 1:
            raise ValueError(f"queue_size must be >= 1, got {queue_size}")
        self.slop_ns = int(slop_ns)
        self.queue_size = int(queue_size)
        self._lock = threading.Lock()
        self._queues: tuple[list[tuple[int, Any]], list[tuple[int, Any]]] = ([], [])
        self._watermark = [-1, -1]
        self._received = [0, 0]
        self._dropped = [0, 0]
        self._paired = 0

    def add_image(self, stamp_ns: int, item: A) -> list[Pair[A, B]]:
        """Offer an image; returns the pairs this completes (usually zero or one)."""
        return self._add(0, int(stamp_ns), item)

    def add_depth(self, stamp_ns: int, item: B) -> list[Pair[A, B]]:
        """Offer a depth image; returns the pairs this completes (usually zero or one)."""
        return self._add(1, int(stamp_ns), item)

    def reset(self) -> None:
        """Forget queued items and the late-item watermarks (time jumped back: a bag looped,
        a simulator restarted); the counters keep counting, queued items count as dropped."""
        with self._lock:
            for s in (0, 1):
                self._dropped[s] += len(self._queues[s])
                self._queues[s].clear()
                self._watermark[s] = -1

    def stats(self) -> SyncStats:
        with self._lock:
            return SyncStats(
                images_received=self._received[0],
                depths_received=self._received[1],
                paired=self._paired,
                images_dropped=self._dropped[0],
                depths_dropped=self._dropped[1],
                images_queued=len(self._queues[0]),
                depths_queued=len(self._queues[1]),
            )

    def _drop_head(self, s: int) -> None:
        stamp, _ = self._queues[s].pop(0)
        self._watermark[s] = max(self._watermark[s], stamp)
        self._dropped[s] += 1

    def _add(self, s: int, stamp: int, item: Any) -> list[Pair[A, B]]:
        with self._lock:
            self._received[s] += 1
            if stamp <= self._watermark[s]:
                self._dropped[s] += 1
                return []
            q = self._queues[s]
            if any(t == stamp for t, _ in q):
                self._dropped[s] += 1
                return []
            bisect.insort(q, (stamp, item), key=lambda e: e[0])
            if len(q) > self.queue_size:
                self._drop_head(s)
            return self._match()

    def _match(self) -> list[Pair[A, B]]:
        images, depths = self._queues
        out: list[Pair[A, B]] = []
        while images and depths:
            ti, td = images[0][0], depths[0][0]
            if ti < td - self.slop_ns:
                self._drop_head(0)
                continue
            if td < ti - self.slop_ns:
                self._drop_head(1)
                continue
            if ti != td:
                # x: the stream whose head is earlier; its next item may suit y better.
                x = 0 if ti < td else 1
                xs = self._queues[x]
                if len(xs) < 2:
                    break
                gap = abs(ti - td)
                ty = td if x == 0 else ti
                if abs(xs[1][0] - ty) < gap:
                    self._drop_head(x)
                    continue
            (ti, image), (td, depth) = images.pop(0), depths.pop(0)
            self._watermark[0] = max(self._watermark[0], ti)
            self._watermark[1] = max(self._watermark[1], td)
            self._paired += 1
            out.append(Pair(ti, image, td, depth))
        return out


# ---------------------------------------------------------------- hand-off queue


class DropOldestQueue(Generic[T]):
    """A bounded FIFO whose ``put`` never blocks: when full, the oldest item is dropped."""

    def __init__(self, maxsize: int) -> None:
        if maxsize < 1:
            raise ValueError(f"maxsize must be >= 1, got {maxsize}")
        self._items: deque[T] = deque()
        self._maxsize = maxsize
        self._cond = threading.Condition()
        self._closed = False
        self.put_count = 0
        self.dropped = 0

    def put(self, item: T) -> bool:
        """Enqueue ``item``; returns True if an older item was dropped to make room."""
        with self._cond:
            self.put_count += 1
            dropped = len(self._items) >= self._maxsize
            if dropped:
                self._items.popleft()
                self.dropped += 1
            self._items.append(item)
            self._cond.notify()
            return dropped

    def get(self, timeout: float | None = None) -> T:
        """Oldest item; raises ``queue.Empty`` after ``timeout`` s or once closed and empty."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._items or self._closed, timeout):
                raise queue.Empty
            if not self._items:
                raise queue.Empty
            return self._items.popleft()

    def close(self) -> None:
        """Wake every waiting ``get``; items already queued can still be taken."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def __len__(self) -> int:
        with self._cond:
            return len(self._items)


# ---------------------------------------------------------------- frame buffer


@dataclass(frozen=True, slots=True)
class BufferStats:
    """Counters of a :class:`FrameBuffer`.

    ``received`` frames were offered; ``skipped`` fell between strides; ``kept`` entered
    memory; ``evicted`` left memory (to the spill directory when enabled); ``spilled`` were
    written to disk; ``dropped`` are gone for good (evicted without spill, spill queue
    overflow, spill write error or the oldest spilled files past the disk bound).
    """

    received: int
    skipped: int
    kept: int
    evicted: int
    spilled: int
    dropped: int
    in_memory: int
    on_disk: int
    capacity: int

    @property
    def size(self) -> int:
        return self.in_memory + self.on_disk

    @property
    def fill(self) -> float:
        return self.size / self.capacity if self.capacity else 0.0


def save_frame(path: Path, frame: FrameLike) -> None:
    """Write one frame as an uncompressed .npz (atomically: temporary file, then rename)."""
    with atomic_path(path) as tmp, tmp.open("wb") as f:
        np.savez(
            f,
            rgb=frame.rgb,
            depth=frame.depth,
            K=frame.K,
            stamp_ns=np.int64(frame.stamp_ns),
        )


def load_frame(path: Path) -> RGBDFrame:
    """Read a frame written by :func:`save_frame`."""
    with np.load(path, allow_pickle=False) as z:
        return RGBDFrame(rgb=z["rgb"], depth=z["depth"], K=z["K"], stamp_ns=int(z["stamp_ns"]))


class _SpillStore:
    """Frames evicted from memory, written by a background thread as .npz files (bounded)."""

    def __init__(self, directory: Path, capacity: int, pending_size: int) -> None:
        self.directory = directory
        self.capacity = capacity
        directory.mkdir(parents=True, exist_ok=True)
        for stale in directory.glob(f"{SPILL_PREFIX}*.npz*"):
            stale.unlink(missing_ok=True)
        self.pending: DropOldestQueue[FrameLike] = DropOldestQueue(pending_size)
        self.disk_lock = threading.Condition()  # guards the files; notified after each write
        self.paths: deque[Path] = deque()
        self.written = 0
        self.dropped_on_disk = 0
        self.write_errors = 0
        self._seq = itertools.count()
        self._thread = threading.Thread(target=self._run, name="frame-spill", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                frame = self.pending.get()
            except queue.Empty:
                return  # closed and drained
            path = self.directory / f"{SPILL_PREFIX}{next(self._seq):09d}.npz"
            try:
                save_frame(path, frame)
            except OSError as exc:
                log.error("frame buffer: cannot spill frame to %s: %s", path, exc)
                with self.disk_lock:
                    self.write_errors += 1
                    self.disk_lock.notify_all()
                continue
            with self.disk_lock:
                self.paths.append(path)
                self.written += 1
                while len(self.paths) > self.capacity:
                    self.paths.popleft().unlink(missing_ok=True)
                    self.dropped_on_disk += 1
                self.disk_lock.notify_all()

    def close(self, timeout: float) -> None:
        self.pending.close()
        self._thread.join(timeout)


class FrameBuffer:
    """Bounded drop-oldest store of RGB-D frames: the robot's local training set.

    ``push`` keeps every ``stride``-th offered frame in memory (``capacity`` frames). When
    memory is full the oldest frame is evicted; with ``spill_dir`` set it is handed to a
    background writer that keeps the newest ``spill_capacity`` frames on disk as .npz files
    (stale ``fedepth_frame_*.npz`` files in that directory are removed at start). ``push``
    never waits on disk or on readers. Readers (a worker thread) use ``sample``, ``latest``
    and ``wait_for``.
    """

    def __init__(
        self,
        capacity: int,
        *,
        stride: int = 1,
        spill_dir: str | Path | None = None,
        spill_capacity: int = 0,
        spill_queue: int = 64,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"buffer capacity must be >= 1, got {capacity}")
        if stride < 1:
            raise ValueError(f"frame stride must be >= 1, got {stride}")
        if spill_dir is not None and spill_capacity < 1:
            raise ValueError(f"spill to {spill_dir} needs spill_capacity >= 1")
        self.capacity = capacity
        self.stride = stride
        self._mem: deque[FrameLike] = deque()
        self._cond = threading.Condition()
        self._received = 0
        self._skipped = 0
        self._kept = 0
        self._evicted = 0
        self._dropped_memory = 0
        self._spill = (
            _SpillStore(Path(spill_dir), spill_capacity, spill_queue)
            if spill_dir is not None
            else None
        )

    @property
    def total_capacity(self) -> int:
        return self.capacity + (self._spill.capacity if self._spill else 0)

    def push(self, frame: FrameLike) -> bool:
        """Offer a frame; returns True if it was kept (it falls on the stride)."""
        with self._cond:
            self._received += 1
            if (self._received - 1) % self.stride:
                self._skipped += 1
                return False
            evicted = None
            if len(self._mem) >= self.capacity:
                evicted = self._mem.popleft()
                self._evicted += 1
                if self._spill is None:
                    self._dropped_memory += 1
            self._mem.append(frame)
            self._kept += 1
            self._cond.notify_all()
        if evicted is not None and self._spill is not None:
            self._spill.pending.put(evicted)
        return True

    def __len__(self) -> int:
        with self._cond:
            n = len(self._mem)
        if self._spill is not None:
            with self._spill.disk_lock:
                n += len(self._spill.paths)
        return n

    def wait_for(self, n: int, timeout: float | None = None) -> bool:
        """Block until at least ``n`` frames were kept in total (or timeout); True if so."""
        with self._cond:
            return self._cond.wait_for(lambda: self._kept >= n, timeout)

    def latest(self, n: int) -> list[FrameLike]:
        """The newest ``min(n, in memory)`` frames, oldest first."""
        with self._cond:
            return list(self._mem)[-n:] if n > 0 else []

    def sample(self, n: int, rng: np.random.Generator | None = None) -> list[FrameLike]:
        """``min(n, len(self))`` distinct frames drawn uniformly from memory and disk."""
        rng = rng if rng is not None else np.random.default_rng()
        with self._cond:
            mem = list(self._mem)
        if self._spill is None:
            picks = _choose(rng, len(mem), n)
            return [mem[i] for i in picks]
        with self._spill.disk_lock:  # the spill writer waits while we read; producers do not
            paths = list(self._spill.paths)
            total = len(paths) + len(mem)
            picks = _choose(rng, total, n)
            out: list[FrameLike] = []
            for i in picks:
                out.append(load_frame(paths[i]) if i < len(paths) else mem[i - len(paths)])
            return out

    def stats(self) -> BufferStats:
        with self._cond:
            received, skipped, kept = self._received, self._skipped, self._kept
            evicted, dropped, in_memory = self._evicted, self._dropped_memory, len(self._mem)
        spilled = on_disk = 0
        if self._spill is not None:
            with self._spill.disk_lock:
                spilled, on_disk = self._spill.written, len(self._spill.paths)
                dropped += self._spill.dropped_on_disk + self._spill.write_errors
            dropped += self._spill.pending.dropped
        return BufferStats(
            received=received,
            skipped=skipped,
            kept=kept,
            evicted=evicted,
            spilled=spilled,
            dropped=dropped,
            in_memory=in_memory,
            on_disk=on_disk,
            capacity=self.total_capacity,
        )

    def flush(self, timeout: float | None = 10.0) -> bool:
        """Wait until every frame evicted so far is on disk (or dropped); True if so."""
        if self._spill is None:
            return True
        spill = self._spill
        with self._cond:
            evicted = self._evicted
        with spill.disk_lock:
            return spill.disk_lock.wait_for(
                lambda: spill.written + spill.write_errors + spill.pending.dropped >= evicted,
                timeout,
            )

    def close(self, timeout: float = 10.0) -> None:
        """Finish pending spill writes and stop the writer thread."""
        if self._spill is not None:
            self._spill.close(timeout)

    def __enter__(self) -> FrameBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _choose(rng: np.random.Generator, total: int, n: int) -> list[int]:
    """``min(n, total)`` distinct indices in [0, total), ascending."""
    k = max(0, min(n, total))
    return sorted(int(i) for i in rng.choice(total, size=k, replace=False)) if k else []
