"""``prefetched``: a bucket read's producer thread (order, errors, early stop; no Spark)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from databus.core.errors import RelayProtocolError
from databus.spark.reading import prefetched


def threads() -> set[str]:
    return {t.name for t in threading.enumerate() if t.name == "databus-spark-prefetch"}


@pytest.mark.parametrize("depth", [0, 1, 3, 100])
def test_items_come_in_order_and_the_thread_ends(depth: int) -> None:
    def make(stop: threading.Event) -> Iterator[int]:
        yield from range(1000)

    assert list(prefetched(make, depth)) == list(range(1000))
    assert not threads()


def test_an_error_is_raised_after_the_items_made_before_it() -> None:
    def make(stop: threading.Event) -> Iterator[int]:
        yield 1
        yield 2
        raise RelayProtocolError("relay lost windows")

    got: list[int] = []
    with pytest.raises(RelayProtocolError, match="lost windows"):
        for x in prefetched(make, 4):
            got.append(x)
    assert got == [1, 2] and not threads()


def test_closing_early_stops_the_producer_and_joins_its_thread() -> None:
    closed = threading.Event()
    made: list[int] = []

    def make(stop: threading.Event) -> Iterator[int]:
        try:
            for i in range(10**9):
                if stop.is_set():
                    return
                made.append(i)
                yield i
        finally:
            closed.set()  # the relay connection of a real read is closed here

    it = prefetched(make, 2)
    assert [next(it) for _ in range(5)] == [0, 1, 2, 3, 4]
    started = time.monotonic()
    it.close()  # what Spark does when a task ends early
    assert time.monotonic() - started < 5
    assert closed.is_set() and not threads()
    assert len(made) <= 5 + 2 + 1  # bounded: at most depth items ahead (+1 in hand)
