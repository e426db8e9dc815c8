"""Bucket reads and planning against a real relay, without Spark."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from databus.client.relay import RelayConnection
from databus.core import event as ev
from databus.core.checkpoint import Checkpoint
from databus.core.errors import ConfigError, RelayProtocolError, RelayUnavailableError
from databus.relay.relay import Relay
from databus.spark import arrow, fastread
from databus.spark.fastread import ChunkDecoder
from databus.spark.limits import ReadAllAvailable, ReadMaxBytes
from databus.spark.options import parse_options
from databus.spark.reading import (
    offset_of,
    offset_scn,
    read_bucket,
    read_bucket_batches,
    relay_top,
    scan_limit,
)
from databus.spark.source import DatabusStreamReader, _Plan
from tests.support.procs import free_port
from tests.support.shop import TABLES, Writer, create_shop
from tests.support.sparkrelay import relay_events, start_relay, wait_relay


@pytest.fixture
def relay_db(tmp_path: Path) -> Iterator[Relay]:
    db = tmp_path / "shop.db"
    create_shop(db)
    relay = start_relay(db, tmp_path, TABLES)
    w = Writer(db, seed=5)
    for _ in range(40):
        w.transaction()
        time.sleep(0.002)
    w.close()
    wait_relay(relay, db)
    yield relay
    relay.stop()


def test_buckets_partition_the_events_and_reads_repeat_exactly(relay_db: Relay) -> None:
    opts = parse_options({"relay": relay_db.url, "sources": "customers", "partitions": "3"})
    with RelayConnection(relay_db.url) as conn:
        src = [i for i, n in conn.sources() if n.endswith(".customers")]
        top = relay_top(conn, src)
        mid = scan_limit(conn, src, Checkpoint.flexible(), top, max_rows=25, max_bytes=None,
                         fetch_bytes=1 << 20)
    start = offset_of(-1, -1, 3)["buckets"]["0"]
    everything = []
    for b in range(3):
        first = [(e.scn, e.key, i) for e, i in read_bucket(opts, src, b, start, mid.scn)]
        again = [(e.scn, e.key, i) for e, i in read_bucket(opts, src, b, start, mid.scn)]
        rest = [(e.scn, e.key, i) for e, i in read_bucket(
            opts, src, b, offset_of(mid.scn, mid.prev_scn, 3)["buckets"][str(b)], top)]
        assert first == again  # deterministic for an offset range
        assert all(isinstance(k, int) and abs(k) % 3 == b for _s, k, _i in first + rest)
        everything += first + rest
    assert mid.rows <= 25 or len({s for s, _k, _i in everything if s <= mid.scn}) == 1
    whole = [(e.scn, e.key) for e, _ in read_bucket(
        parse_options({"relay": relay_db.url, "sources": "customers"}), src, 0, start, top)]
    assert sorted(whole) == sorted((s, k) for s, k, _i in everything)


def test_a_batch_beyond_what_the_relay_holds_fails_instead_of_hanging(relay_db: Relay) -> None:
    opts = parse_options({"relay": relay_db.url, "sources": "customers",
                          "relayRetrySeconds": "1"})
    with RelayConnection(relay_db.url) as conn:
        src = [i for i, n in conn.sources() if n.endswith(".customers")]
        top = relay_top(conn, src)
    started = time.monotonic()
    with pytest.raises(RelayProtocolError, match="lost windows"):
        list(read_bucket(opts, src, 0, offset_of(-1, -1, 1)["buckets"]["0"], top + 1000))
    assert time.monotonic() - started < 10


def test_an_unreachable_relay_fails_the_read_after_the_retry_period() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    opts = parse_options({"relay": url, "sources": "x", "relayRetrySeconds": "1"})
    started = time.monotonic()
    with pytest.raises(RelayUnavailableError):
        list(read_bucket(opts, [1], 0, offset_of(-1, -1, 1)["buckets"]["0"], 10))
    assert time.monotonic() - started < 10


def test_offsets_from_another_partition_count_are_refused() -> None:
    with pytest.raises(ConfigError, match="partitions=4"):
        offset_scn(offset_of(10, 5, 4), 2)
    assert offset_scn(offset_of(10, 5, 4), 4) == 10


@pytest.mark.parametrize("fetch", ["4096", "8388608"])
def test_batches_hold_exactly_the_events_of_read_bucket(relay_db: Relay, fetch: str) -> None:
    """The batch reader (compiled decoder) and the event reader agree on every row and index,
    with small (many responses) and large fetches, across a batch boundary."""
    opts = parse_options({"relay": relay_db.url, "sources": "customers", "partitions": "3",
                          "fetchBytes": fetch, "rowsPerArrowBatch": "5"})
    plan = _Plan({"relay": relay_db.url, "sources": "customers"})
    with RelayConnection(relay_db.url) as conn:
        src = [i for i, n in conn.sources() if n.endswith(".customers")]
        top = relay_top(conn, src)
        registry = conn.register(src)
        mid = scan_limit(conn, src, Checkpoint.flexible(), top, max_rows=25, max_bytes=None,
                         fetch_bytes=1 << 20)
    for b in range(3):
        for start, end in ((offset_of(-1, -1, 3), mid.scn),
                           (offset_of(mid.scn, mid.prev_scn, 3), top)):
            cp = start["buckets"][str(b)]
            want = [(e.scn, arrow.key_text(e.key), i, e.op.letter)
                    for e, i in read_bucket(opts, src, b, cp, end)]
            decoder = ChunkDecoder(plan.arrow_schema, registry, lambda: registry)
            assert decoder.native == fastread.available()
            got = [(r["scn"], r["key"], r["sequence"]["index"], r["op"])
                   for batch in read_bucket_batches(opts, src, b, cp, end, decoder)
                   for r in batch.to_pylist()]
            assert got == want


# -- the documented options maxBytesPerBatch, prefetchBatches and httpTimeout ----------


def _window_bytes(url: str, source: str) -> list[tuple[int, int]]:
    """(scn, bytes) of each window as a reader of ``source`` receives it (with its EOP)."""
    out: list[tuple[int, int]] = []
    with RelayConnection(url) as conn:
        src = [i for i, n in conn.sources() if n.endswith("." + source)]
        data = conn.stream(Checkpoint.flexible(), src, size=64 << 20, timeout=0).data
    off = size = 0
    while off < len(data):
        length = ev.peek_length(data, off)
        size += length
        if ev.peek_src_id(data, off) == ev.SRC_EOP:
            out.append((ev.peek_scn(data, off), size))
            size = 0
        off += length
    return out


def test_max_bytes_per_batch_packs_whole_windows_up_to_the_byte_limit(relay_db: Relay) -> None:
    windows = _window_bytes(relay_db.url, "customers")
    limit = 3 * max(b for _, b in windows) // 2
    reader = DatabusStreamReader(_Plan({"relay": relay_db.url, "sources": "customers",
                                        "maxBytesPerBatch": str(limit)}))
    read_limit = reader.getDefaultReadLimit()
    assert isinstance(read_limit, ReadMaxBytes) and read_limit.max_bytes == limit
    ends: list[int] = []
    start = reader.initialOffset()
    while (end := reader.latestOffset(start, read_limit)) != start:
        ends.append(offset_scn(end, 1))
        start = end
    # expected: whole windows packed greedily up to the limit
    want: list[tuple[int, int]] = []  # (last scn, bytes) of each batch
    for scn, size in windows:
        if want and want[-1][1] + size <= limit:
            want[-1] = (scn, want[-1][1] + size)
        else:
            want.append((scn, size))
    assert ends == [scn for scn, _ in want] and len(want) > 2


@pytest.mark.parametrize("depth", [0, 2])
def test_prefetch_batches_reads_ahead_in_a_thread_or_not_at_all(relay_db: Relay,
                                                              depth: int) -> None:
    reader = DatabusStreamReader(_Plan({"relay": relay_db.url, "sources": "customers",
                                        "prefetchBatches": str(depth),
                                        "rowsPerArrowBatch": "5"}))
    top = reader.latestOffset(reader.initialOffset(), ReadAllAvailable())
    (part,) = reader.partitions(reader.initialOffset(), top)
    rows, threads_seen = 0, set()
    for batch in reader.read(part):
        rows += batch.num_rows
        threads_seen |= {t.name for t in threading.enumerate()
                         if t.name == "databus-spark-prefetch"}
    assert rows == len(relay_events(relay_db.url, "customers")) > 10
    assert threads_seen == ({"databus-spark-prefetch"} if depth else set())


def test_http_timeout_bounds_a_relay_that_accepts_and_never_answers() -> None:
    with socket.create_server(("127.0.0.1", 0)) as mute:  # the kernel accepts; nobody reads
        url = f"http://127.0.0.1:{mute.getsockname()[1]}"
        opts = parse_options({"relay": url, "sources": "x", "httpTimeout": "0.3",
                              "relayRetrySeconds": "0"})
        started = time.monotonic()
        with pytest.raises(RelayUnavailableError):
            list(read_bucket(opts, [1], 0, offset_of(-1, -1, 1)["buckets"]["0"], 10))
        took = time.monotonic() - started
    assert took < 3, f"httpTimeout=0.3 gave up after {took:.1f} s"


def test_every_option_of_the_model_is_accepted_by_its_spark_name() -> None:
    """Each field of the options model is reachable under its camelCase alias (an option
    added to the model but not to the accepted names would be refused as unknown), and
    no accepted name lacks a field."""
    from databus.spark.options import _ALIASES, StreamOptions
    fields = {f.alias or n for n, f in StreamOptions.model_fields.items()}
    assert fields == set(_ALIASES.values())
