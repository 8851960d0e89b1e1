"""The receive/consume pipeline of uploads: order, bounded look-ahead, errors of either side."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from fedepth_coordinator.pipeline import consume_in_worker


def test_items_are_consumed_in_order_in_another_thread() -> None:
    seen: list[int] = []
    threads: set[int] = set()

    def consume(item: int) -> None:
        seen.append(item)
        threads.add(threading.get_ident())

    consume_in_worker(range(100), consume, depth=3)
    assert seen == list(range(100))
    assert threads and threading.get_ident() not in threads
    consume_in_worker([], consume)  # nothing to do: returns


@pytest.mark.parametrize("depth", [1, 2, 4])
def test_intake_runs_ahead_by_at_most_depth_items_plus_the_one_it_holds(depth: int) -> None:
    n = 10
    taken = 0

    def items() -> Iterator[int]:
        nonlocal taken
        for i in range(n):
            taken += 1
            yield i

    ahead: list[int] = []

    def consume(item: int) -> None:
        # a slow consumer: wait until the intake went as far ahead as it may, then a bit more
        limit = min(depth + 1, n - item - 1)
        end = time.monotonic() + 5.0
        while taken - item - 1 < limit and time.monotonic() < end:
            time.sleep(0.001)
        time.sleep(0.005)
        ahead.append(taken - item - 1)

    consume_in_worker(items(), consume, depth=depth)
    assert ahead == [min(depth + 1, n - i - 1) for i in range(n)]


def test_a_consumer_error_stops_the_intake_and_is_raised_here() -> None:
    taken: list[int] = []

    def items() -> Iterator[int]:
        for i in range(1000):
            taken.append(i)
            yield i

    def consume(item: int) -> None:
        if item == 3:
            raise ValueError("bad item 3")

    with pytest.raises(ValueError, match="bad item 3"):
        consume_in_worker(items(), consume, depth=2)
    assert len(taken) < 1000  # stopped early, not read to the end


def test_an_intake_error_is_raised_after_the_worker_stopped() -> None:
    done: list[int] = []

    def items() -> Iterator[int]:
        yield 1
        yield 2
        raise ConnectionError("robot went away")

    with pytest.raises(ConnectionError, match="went away"):
        consume_in_worker(items(), done.append, depth=4, name="spill-test")
    assert done == [1, 2]  # what was received before the error was consumed
    assert not [t for t in threading.enumerate() if t.name == "spill-test"]


def test_depth_must_be_positive() -> None:
    with pytest.raises(ValueError, match="depth"):
        consume_in_worker([1], lambda _: None, depth=0)
