"""The replicate sink's batch pipeline (``databus.client.sinks.batches``) with a commit
function that records what it is given: batches sealed by size and by linger, in
order, one at a time; a failed batch stops everything after it, and its windows come
back one per batch, synchronously."""

from __future__ import annotations

import threading
import time

import pytest

from databus.client.config import BatchConfig
from databus.client.sinks.batches import Batch, BatchPipeline
from databus.core.errors import SinkUnavailableError, SqlStatementError


class Target:
    """Commits batches, or fails those whose windows ``fail`` names."""

    def __init__(self, delay: float = 0.0) -> None:
        self.batches: list[list[int]] = []
        self.fail: set[int] = set()
        self.delay = delay
        self.busy = threading.Event()

    def commit(self, batch: Batch) -> None:
        self.busy.set()
        time.sleep(self.delay)
        if self.fail & set(batch.scns):
            raise SqlStatementError(what="applying", target="t", driver_code=None,
                                    sqlstate=None, detail=f"{batch.describe()} failed")
        self.batches.append(list(batch.scns))


def _pipe(target: Target, **cfg: float) -> BatchPipeline:
    return BatchPipeline(target.commit, BatchConfig(**cfg))  # type: ignore[arg-type]


def test_batches_are_sealed_by_rows_and_committed_in_order() -> None:
    t = Target()
    pipe = _pipe(t, rows=3, linger=60)
    try:
        for scn in range(1, 8):
            pipe.add(scn, [None] * 1, 10)  # type: ignore[list-item]
        pipe.flush()
    finally:
        pipe.close()
    assert t.batches == [[1, 2, 3], [4, 5, 6], [7]]
    assert (pipe.committed, pipe.windows) == (3, 7)


def test_a_batch_is_committed_by_the_writer_after_its_linger() -> None:
    t = Target()
    pipe = _pipe(t, linger=0.1)
    try:
        pipe.add(1, [], 0)
        pipe.add(2, [], 0)
        deadline = time.monotonic() + 5
        while not t.batches and time.monotonic() < deadline:
            time.sleep(0.01)
        assert t.batches == [[1, 2]] and not pipe.pending
    finally:
        pipe.close()


def test_while_one_batch_is_written_the_next_is_gathered() -> None:
    t = Target(delay=1.0)
    pipe = _pipe(t, rows=2, linger=60)
    try:
        pipe.add(1, [None, None], 0)  # type: ignore[list-item]  # sealed
        assert t.busy.wait(5)
        t0 = time.monotonic()
        pipe.add(2, [None, None], 0)  # type: ignore[list-item]  # sealed, waits its turn
        pipe.add(3, [], 0)  # a third batch is gathered while the first is written
        assert time.monotonic() - t0 < 0.8 and not t.batches  # the first is still written
        pipe.flush()
    finally:
        pipe.close()
    assert t.batches == [[1], [2], [3]]


def test_a_failed_batch_stops_what_follows_and_comes_back_window_by_window() -> None:
    t = Target()
    t.fail = {3}
    pipe = _pipe(t, rows=100, linger=60)
    try:
        for scn in (1, 2, 3, 4):
            pipe.add(scn, [], 0)
        with pytest.raises(SqlStatementError, match=r"windows 1\.\.4 failed"):
            pipe.flush()
        with pytest.raises(SqlStatementError):  # raised again until the client rolls back
            pipe.add(5, [], 0)
        pipe.discard()
        pipe.add(1, [], 0)  # the replay: each window committed on its own, at once
        pipe.add(2, [], 0)
        assert t.batches == [[1], [2]]
        with pytest.raises(SqlStatementError, match="window 3 failed"):
            pipe.add(3, [], 0)  # in its own callback
        pipe.discard()
        t.fail = set()
        for scn in (3, 4, 5, 6):
            pipe.add(scn, [], 0)
        pipe.flush()
    finally:
        pipe.close()
    assert t.batches == [[1], [2], [3], [4], [5, 6]]


def test_a_writer_that_is_gone_is_a_transient_error() -> None:
    t = Target()
    pipe = _pipe(t, rows=1, linger=60)
    pipe.add(1, [], 0)
    pipe.close()
    pipe._thread = threading.Thread(target=lambda: None)  # started and ended: not alive
    pipe._thread.start()
    pipe._thread.join()
    pipe._sealed = Batch(0.0, [2])
    with pytest.raises(SinkUnavailableError, match="writer thread is not running"):
        pipe.flush()
