"""PairSync (approximate time pairing), DropOldestQueue and FrameBuffer (bounds, stride, spill)."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fedepth.data.frames import FrameLike, RGBDFrame
from fedepth_ros.sync import (
    SPILL_PREFIX,
    DropOldestQueue,
    FrameBuffer,
    PairSync,
    load_frame,
)

MS = 1_000_000


def _pairs(sync: PairSync[str, str], events: list[tuple[str, int]]) -> list[tuple[int, int]]:
    out = []
    for stream, t in events:
        add = sync.add_image if stream == "i" else sync.add_depth
        out += [(p.image_stamp_ns, p.depth_stamp_ns) for p in add(t, f"{stream}{t}")]
    return out


def _check_invariant(sync: PairSync[Any, Any]) -> None:
    s = sync.stats()
    assert s.images_received == s.paired + s.images_dropped + s.images_queued
    assert s.depths_received == s.paired + s.depths_dropped + s.depths_queued


# ---------------------------------------------------------------- PairSync


def test_equal_stamps_pair_at_once() -> None:
    sync: PairSync[str, str] = PairSync(slop_ns=0)
    assert sync.add_image(5, "img") == []
    (pair,) = sync.add_depth(5, "dep")
    assert (pair.image, pair.depth, pair.image_stamp_ns, pair.depth_stamp_ns) == (
        "img",
        "dep",
        5,
        5,
    )
    assert sync.stats().paired == 1


def test_offset_within_slop_pairs_once_the_next_frame_settles_it() -> None:
    sync: PairSync[str, str] = PairSync(slop_ns=10 * MS)
    assert _pairs(sync, [("i", 0), ("d", 5 * MS)]) == []  # a later image might fit better
    assert _pairs(sync, [("i", 33 * MS)]) == [(0, 5 * MS)]
    assert _pairs(sync, [("d", 38 * MS), ("i", 66 * MS)]) == [(33 * MS, 38 * MS)]
    _check_invariant(sync)


def test_mutual_nearest_neighbours() -> None:
    sync: PairSync[str, str] = PairSync(slop_ns=20 * MS)
    events = [("i", 0), ("i", 30 * MS), ("i", 60 * MS), ("d", 14 * MS), ("d", 44 * MS)]
    assert _pairs(sync, events) == [(0, 14 * MS), (30 * MS, 44 * MS)]
    # a closer image arriving later wins over an earlier one
    sync = PairSync(slop_ns=20 * MS)
    assert _pairs(sync, [("i", 0), ("d", 9 * MS), ("i", 10 * MS), ("d", 30 * MS)]) == [
        (10 * MS, 9 * MS)
    ]
    assert sync.stats().images_dropped == 1
    _check_invariant(sync)


def test_beyond_slop_is_dropped_as_stale() -> None:
    sync: PairSync[str, str] = PairSync(slop_ns=5 * MS)
    assert _pairs(sync, [("d", 0), ("i", 20 * MS), ("d", 20 * MS)]) == [(20 * MS, 20 * MS)]
    s = sync.stats()
    assert (s.depths_dropped, s.images_dropped, s.paired) == (1, 0, 1)
    _check_invariant(sync)


def test_late_and_duplicate_items_are_dropped() -> None:
    sync: PairSync[str, str] = PairSync(slop_ns=0)
    assert _pairs(sync, [("i", 10), ("d", 10)]) == [(10, 10)]
    assert _pairs(sync, [("i", 5), ("i", 20), ("i", 20)]) == []  # 5 is late, second 20 dup
    s = sync.stats()
    assert (s.images_dropped, s.images_queued) == (2, 1)
    _check_invariant(sync)


def test_reset_accepts_earlier_stamps_again() -> None:
    sync: PairSync[str, str] = PairSync(slop_ns=0)
    assert _pairs(sync, [("i", 10), ("d", 10), ("i", 20)]) == [(10, 10)]
    sync.reset()  # a bag looped: stamps start over
    assert _pairs(sync, [("i", 10), ("d", 10)]) == [(10, 10)]
    s = sync.stats()
    assert (s.paired, s.images_dropped, s.images_queued) == (2, 1, 0)
    _check_invariant(sync)


def test_queues_are_bounded_drop_oldest() -> None:
    sync: PairSync[str, str] = PairSync(slop_ns=MS, queue_size=4)
    for k in range(10):
        sync.add_image(k * 100 * MS, "i")
    s = sync.stats()
    assert (s.images_queued, s.images_dropped) == (4, 6)
    # the newest images survived: a depth matching the 7th pairs with it
    assert _pairs(sync, [("d", 700 * MS), ("d", 800 * MS)])[0] == (700 * MS, 700 * MS)


def test_random_streams_pair_one_to_one_within_slop() -> None:
    rng = np.random.default_rng(3)
    slop = 8 * MS
    sync: PairSync[str, str] = PairSync(slop_ns=slop, queue_size=6)
    images = [k * 33 * MS + int(rng.integers(0, 3 * MS)) for k in range(300)]
    depths = [k * 33 * MS + int(rng.integers(-12 * MS, 12 * MS)) for k in range(300)]
    depths = sorted(set(depths))
    keep_i = rng.random(len(images)) > 0.1  # sensors drop frames
    keep_d = rng.random(len(depths)) > 0.1
    events = [("i", t) for t, k in zip(images, keep_i, strict=True) if k]
    events += [("d", t) for t, k in zip(depths, keep_d, strict=True) if k]
    events.sort(key=lambda e: e[1] + int(rng.integers(0, 5 * MS)))  # arrival jitter
    pairs = _pairs(sync, events)
    assert len(pairs) > 150
    assert all(abs(i - d) <= slop for i, d in pairs)
    assert len({i for i, _ in pairs}) == len(pairs) == len({d for _, d in pairs})
    assert [i for i, _ in pairs] == sorted(i for i, _ in pairs)
    _check_invariant(sync)


def test_concurrent_producers_keep_counts_consistent() -> None:
    sync: PairSync[int, int] = PairSync(slop_ns=MS, queue_size=8)
    n = 2000
    out: list[int] = []
    lock = threading.Lock()

    def feed(add_name: str) -> None:
        for k in range(n):
            got = getattr(sync, add_name)(k * 10 * MS, k)
            with lock:
                out.extend(p.image for p in got)

    threads = [threading.Thread(target=feed, args=(a,)) for a in ("add_image", "add_depth")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    s = sync.stats()
    assert s.images_received == s.depths_received == n
    assert s.paired == len(out) > 0
    _check_invariant(sync)


def test_sync_rejects_bad_settings() -> None:
    with pytest.raises(ValueError, match="slop"):
        PairSync(slop_ns=-1)
    with pytest.raises(ValueError, match="queue_size"):
        PairSync(slop_ns=0, queue_size=0)


# ---------------------------------------------------------------- DropOldestQueue


def test_drop_oldest_queue() -> None:
    q: DropOldestQueue[int] = DropOldestQueue(2)
    assert [q.put(i) for i in range(4)] == [False, False, True, True]
    assert (q.get(0), q.get(0), q.dropped, q.put_count) == (2, 3, 2, 4)
    with pytest.raises(queue.Empty):
        q.get(timeout=0.01)


def test_drop_oldest_queue_close_wakes_consumer() -> None:
    q: DropOldestQueue[int] = DropOldestQueue(1)
    woke = threading.Event()

    def consume() -> None:
        with pytest.raises(queue.Empty):
            q.get(timeout=30)
        woke.set()

    t = threading.Thread(target=consume)
    t.start()
    q.close()
    assert woke.wait(10)
    t.join(10)


# ---------------------------------------------------------------- FrameBuffer


def _frame(k: int, size: int = 4) -> RGBDFrame:
    return RGBDFrame(
        rgb=np.full((size, size, 3), k % 256, np.uint8),
        depth=np.full((size, size), 1.0 + k, np.float32),
        K=np.eye(3) * (k + 1),
        stamp_ns=1_000 + k,
    )


def _stamps(frames: Sequence[FrameLike]) -> list[int]:
    return [f.stamp_ns for f in frames]


def test_stride_keeps_every_nth_frame() -> None:
    buf = FrameBuffer(capacity=100, stride=3)
    kept = [buf.push(_frame(k)) for k in range(10)]
    assert kept == [k % 3 == 0 for k in range(10)]
    assert _stamps(buf.latest(10)) == [1000, 1003, 1006, 1009]
    s = buf.stats()
    assert (s.received, s.skipped, s.kept, s.in_memory) == (10, 6, 4, 4)


def test_memory_bound_drops_oldest() -> None:
    buf = FrameBuffer(capacity=3)
    for k in range(5):
        buf.push(_frame(k))
    assert len(buf) == 3
    assert _stamps(buf.latest(10)) == [1002, 1003, 1004]
    assert _stamps(buf.latest(2)) == [1003, 1004]
    s = buf.stats()
    assert (s.evicted, s.dropped, s.on_disk, s.fill) == (2, 2, 0, 1.0)
    assert _stamps(buf.sample(10, np.random.default_rng(0))) == [1002, 1003, 1004]


def test_spill_to_disk_is_bounded_and_loadable(tmp_path: Path) -> None:
    stale = tmp_path / f"{SPILL_PREFIX}000000042.npz"
    stale.write_bytes(b"old run")
    other = tmp_path / "notes.txt"
    other.write_text("kept")
    with FrameBuffer(capacity=2, spill_dir=tmp_path, spill_capacity=3) as buf:
        assert not stale.exists() and other.exists()
        for k in range(8):
            buf.push(_frame(k))
        assert buf.flush(timeout=10)
        s = buf.stats()
        assert (s.in_memory, s.on_disk, s.spilled, s.evicted, s.dropped) == (2, 3, 6, 6, 3)
        assert s.capacity == 5 and len(buf) == 5
        files = sorted(tmp_path.glob(f"{SPILL_PREFIX}*.npz"))
        assert len(files) == 3
        assert [load_frame(f).stamp_ns for f in files] == [1003, 1004, 1005]
        frames = buf.sample(10, np.random.default_rng(1))
        assert _stamps(frames) == [1003, 1004, 1005, 1006, 1007]
        for f in frames:
            ref = _frame(f.stamp_ns - 1000)
            np.testing.assert_array_equal(f.rgb, ref.rgb)
            np.testing.assert_array_equal(f.depth, ref.depth)
            np.testing.assert_array_equal(f.K, ref.K)
        assert len(buf.sample(2, np.random.default_rng(2))) == 2


def test_push_never_waits_for_the_spill_writer(tmp_path: Path) -> None:
    buf = FrameBuffer(capacity=1, spill_dir=tmp_path, spill_capacity=100, spill_queue=4)
    assert buf._spill is not None
    with buf._spill.disk_lock:  # a reader holds the disk: the writer thread is stuck
        t0 = time.monotonic()
        for k in range(50):
            buf.push(_frame(k, size=64))
        elapsed = time.monotonic() - t0
    assert elapsed < 2.0
    assert buf.flush(timeout=10)
    s = buf.stats()
    assert s.evicted == 49
    assert s.spilled + s.dropped == 49 and s.dropped >= 49 - 4 - 1  # queue overflowed
    buf.close()


def test_concurrent_producers_and_sampler(tmp_path: Path) -> None:
    buf = FrameBuffer(capacity=16, stride=2, spill_dir=tmp_path, spill_capacity=16)
    stop = threading.Event()
    errors: list[BaseException] = []
    sampled = [0]

    def produce(offset: int) -> None:
        for k in range(200):
            buf.push(_frame(offset + k))

    def sample() -> None:
        rng = np.random.default_rng(0)
        try:
            while not stop.is_set():
                frames = buf.sample(4, rng)
                assert len(frames) <= 4
                assert len(buf) <= buf.total_capacity
                sampled[0] += len(frames)
        except BaseException as exc:
            errors.append(exc)

    consumer = threading.Thread(target=sample)
    consumer.start()
    producers = [threading.Thread(target=produce, args=(1000 * i,)) for i in range(4)]
    for t in producers:
        t.start()
    for t in producers:
        t.join(timeout=60)
    assert buf.flush(timeout=10)
    stop.set()
    consumer.join(timeout=10)
    buf.close()
    assert not errors and sampled[0] > 0
    s = buf.stats()
    assert s.received == 800 and s.kept == 400 and s.skipped == 400
    assert s.in_memory == 16 and s.on_disk == 16
    assert s.kept == s.in_memory + s.on_disk + s.dropped


def test_wait_for_frames() -> None:
    buf = FrameBuffer(capacity=4)
    assert not buf.wait_for(1, timeout=0.01)
    t = threading.Thread(target=lambda: [buf.push(_frame(k)) for k in range(3)])
    t.start()
    assert buf.wait_for(3, timeout=10)
    t.join(10)


def test_buffer_rejects_bad_settings(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="capacity"):
        FrameBuffer(capacity=0)
    with pytest.raises(ValueError, match="stride"):
        FrameBuffer(capacity=1, stride=0)
    with pytest.raises(ValueError, match="spill_capacity"):
        FrameBuffer(capacity=1, spill_dir=tmp_path)
