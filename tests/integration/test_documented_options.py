"""Documented options that had no test: the MySQL source's ``exclude_tables`` and
``include_columns`` (docs/mysql.md), the relay's ``stream.default_size`` and
``stream.max_inflight_bytes`` (docs/relay.md), the bootstrap server's
``default_batch`` (docs/bootstrap.md), the relay's ``retry_initial`` and ``retry_max``."""

from __future__ import annotations

import json
import logging
import re
import sqlite3
import threading
import uuid
from pathlib import Path

import httpx
import pytest

from databus.bootstrap.config import parse_config as parse_bootstrap
from databus.bootstrap.service import BootstrapService
from databus.core import event as ev
from databus.core.envelope import decode_images
from databus.core.event import iter_events
from databus.relay.app import _Inflight
from databus.relay.config import parse_config
from databus.relay.relay import Relay
from tests.support.bootstrap import bootstrap_config, preload
from tests.support.mariadb import MariaDB
from tests.support.netcut import Cuttable
from tests.support.relays import make_relay
from tests.support.shop import TABLES, create_shop
from tests.support.sources import mysql_source
from tests.support.wait import wait_until


def test_exclude_tables_and_include_columns(mariadb: MariaDB) -> None:
    db = f"opt_{uuid.uuid4().hex[:8]}"
    mariadb.execute(f"CREATE DATABASE {db}",
                    f"CREATE TABLE {db}.t (id INT PRIMARY KEY, a INT, secret VARCHAR(10))",
                    f"CREATE TABLE {db}.skip (id INT PRIMARY KEY)")
    src = mysql_source(mariadb.url, [rf"{db}\..*"], snapshot_mode="no_data",
                       exclude_tables=[rf"{db}\.skip"], include_columns=[rf"{db}\.t\.a"])
    stop = threading.Event()
    try:
        after = -1
        src.read(after, stop, 0.5)  # positioned at the end
        mariadb.execute(f"INSERT INTO {db}.skip VALUES (1)",
                        f"INSERT INTO {db}.t VALUES (1, 2, 'hidden')")
        seen: list[tuple[str, dict[str, object] | None]] = []
        for _ in range(20):
            for w in src.read(after, stop, 0.5):
                after = w.scn
                for e in iter_events(w.events):
                    if not e.is_control:
                        schema, _before, image, _meta = decode_images(e, src.registry())
                        seen.append((schema.name, image))
            if seen:
                break
        assert seen == [(f"{db}.t", {"id": 1, "a": 2})]  # key kept, secret left out
    finally:
        src.close()
        mariadb.execute(f"DROP DATABASE {db}")


def test_stream_default_size_bounds_an_answer_without_size(tmp_path: Path) -> None:
    db = tmp_path / "shop.db"
    create_shop(db)
    cfg = parse_config({
        "source": {"url": f"sqlite:///{db}", "tables": TABLES, "poll_interval": 0.01,
                   "snapshot_mode": "no_data"},
        "http": {"port": 0}, "stream": {"default_size": 4096}})
    with Relay(cfg) as relay:
        def everything() -> bytes:
            return httpx.get(f"{relay.url}/stream", params={"timeout": "0",
                                                            "size": str(1 << 20)}).content

        for i in range(1, 11):  # ten windows of one 20 kB row each
            with sqlite3.connect(db) as con:
                con.execute("INSERT INTO orders (id, customer_id, payload, tx)"
                            " VALUES (?, 0, ?, 0)", (i, bytes(20_000)))
            # the relay joins commits it finds together: one at a time
            wait_until(lambda i=i: sum(not e.is_control for e in ev.iter_events(everything()))
                       == i, 30, f"row {i} in the relay")
        default = httpx.get(f"{relay.url}/stream", params={"timeout": "0"}).content
        sized = httpx.get(f"{relay.url}/stream", params={"timeout": "0", "size": "4096"}).content
        # without size, the answer is the one for size=4096: not all ten windows
        assert default == sized
        assert 1 <= sum(e.is_eop for e in ev.iter_events(default)) < 10
        assert sum(e.is_eop for e in ev.iter_events(everything())) == 10
        assert list(ev.iter_events(default))[-1].is_eop  # whole windows


def test_max_inflight_bytes_shrinks_answers_while_the_budget_is_held() -> None:
    inflight = _Inflight(4 << 20)
    assert inflight.size_for(1 << 20) == 1 << 20
    inflight.held = (4 << 20) - 100_000
    assert inflight.size_for(1 << 20) == 100_000
    inflight.held = 4 << 20
    assert inflight.size_for(1 << 20) == _Inflight.FLOOR  # every consumer still progresses


def test_bootstrap_default_batch_is_the_rows_per_answer(tmp_path: Path) -> None:
    db = tmp_path / "shop.db"
    create_shop(db)
    preload(db, 100)
    with make_relay(db, tmp_path) as relay:
        raw = {**bootstrap_config(db, tmp_path, relay), "default_batch": 7}
        with BootstrapService(parse_bootstrap(raw)) as bs:
            start = wait_until(lambda: (r := httpx.get(f"{bs.url}/startSCN", timeout=10))
                               .status_code == 200 and r.json(), 60, "the bootstrap store")
            r = httpx.get(f"{bs.url}/bootstrap", timeout=30,
                          params={"checkPoint": json.dumps(start["checkpoint"])})
            assert r.status_code == 200, r.text
            assert len([e for e in ev.iter_events(r.content) if not e.is_control]) == 7


def test_retry_initial_and_retry_max_shape_the_backoff_after_source_errors(
        mariadb: MariaDB, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    mariadb.execute("CREATE DATABASE IF NOT EXISTS retry",
                    "CREATE TABLE IF NOT EXISTS retry.t (id INT PRIMARY KEY)")
    with Cuttable(mariadb.port) as link:
        cfg = parse_config({
            "source": {"url": f"mysql://root@127.0.0.1:{link.port}/", "tables": [r"retry\..*"],
                       "snapshot_mode": "no_data"},
            "http": {"port": 0}, "state_dir": str(tmp_path / "state"),
            "retry_initial": 0.1, "retry_max": 0.4})
        caplog.set_level(logging.WARNING, logger="databus.relay")
        with Relay(cfg) as relay:
            # a new relay captures from the binlog's end: what commits before its dump
            # began is not its to see (the test raced that once)
            wait_until(mariadb.binlog_dumps, 30, "the relay's binlog dump")
            mariadb.execute("INSERT INTO retry.t VALUES (1)")
            wait_until(lambda: _rows_in(relay) == 1, 30, "the first row")
            link.cut()  # the database is unreachable now
            wait_until(lambda: relay.fetcher.status["retries"] >= 6, 30, "six retries")
            assert relay.fetcher.status["state"] == "retrying"
            link.restore()
            mariadb.execute("INSERT INTO retry.t VALUES (2)")
            wait_until(lambda: relay.fetcher.status["state"] == "running"
                       and _rows_in(relay) == 2, 30, "capture again after the cut")
    waits = [float(m.group(1)) for r in caplog.records
             if (m := re.search(r"retrying in ([0-9.]+)s", r.getMessage()))]
    # doubling from retry_initial, then held at retry_max
    assert waits[:6] == [0.1, 0.2, 0.4, 0.4, 0.4, 0.4], waits


def _rows_in(relay: Relay) -> int:
    body = httpx.get(f"{relay.url}/stream", params={"timeout": "0"}, timeout=10).content
    return sum(not e.is_control for e in ev.iter_events(body))
