"""The binlog converter end to end: a SQLite source, a real relay over HTTP, the
converter (a client), and Debian's ``mariadb-binlog`` as the judge of the files."""

from __future__ import annotations

import datetime as dt
import decimal
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from databus.binlog import events as ev
from databus.binlog.convert import BinlogConverter
from databus.binlog.store import BinlogStore
from databus.client.config import ClientConfig
from databus.core.errors import ScnNotFoundError
from databus.relay.relay import Relay
from tests.support.binlog import MARIADB_BINLOG, mariadb_decode, replay
from tests.support.relays import make_relay
from tests.support.wait import wait_until

pytestmark = pytest.mark.skipif(not os.path.exists(MARIADB_BINLOG),
                                reason="mariadb-binlog is not installed")

DDL = ("CREATE TABLE t (id INTEGER PRIMARY KEY, name VARCHAR(40), r REAL, b BLOB,"
       " d DECIMAL(12,3), dt DATETIME, dd DATE, flag BOOLEAN, tx TEXT NOT NULL)")


def _text(rng: random.Random, n: int) -> str:
    alphabet = "abcXYZ 019'\"\t\n\u00e9\u00fc\u4e2d\u6587\U0001f600"
    return "".join(rng.choice(alphabet) for _ in range(n))


def _row(rng: random.Random, key: int) -> tuple[Any, ...]:
    def maybe(v: Any) -> Any:
        return None if rng.random() < 0.15 else v
    floats = [1.5, -0.1, 1e300, 5e-324, -2.5e-10, 0.0, rng.uniform(-1e6, 1e6)]
    return (key, maybe(_text(rng, rng.randint(0, 40))), maybe(rng.choice(floats)),
            maybe(rng.randbytes(rng.choice([0, 1, 16, 300, 70_000]))),
            maybe(round(rng.uniform(-99999, 99999), 3)),
            maybe(f"2024-0{rng.randint(1, 9)}-1{rng.randint(0, 9)} 0{rng.randint(0, 9)}:1"
                  f"{rng.randint(0, 9)}:2{rng.randint(0, 9)}.{rng.randint(0, 999999):06d}"),
            maybe(f"19{rng.randint(10, 99)}-1{rng.randint(0, 2)}-0{rng.randint(1, 9)}"),
            maybe(rng.randint(0, 1)), _text(rng, rng.choice([0, 5, 3000])))


def _norm_sqlite(row: tuple[Any, ...]) -> tuple[Any, ...]:
    i, name, r, b, d, dtv, dd, flag, tx = row
    return (i, name, r, b, None if d is None else decimal.Decimal(repr(d)).quantize(
        decimal.Decimal("0.001")), None if dtv is None else dt.datetime.fromisoformat(dtv),
        dd, flag, tx)


def _norm_binlog(vals: list[Any]) -> tuple[Any, ...]:
    i, name, r, b, d, dtv, dd, flag, tx = vals
    return (int(i), None if name is None else name.decode(), None if r is None else float(r),
            b, None if d is None else decimal.Decimal(d),
            None if dtv is None else dt.datetime.fromisoformat(dtv.decode()),
            None if dd is None else dd.decode().replace(":", "-"),
            None if flag is None else int(flag), tx.decode())


@pytest.fixture
def source(tmp_path: Path) -> Iterator[tuple[sqlite3.Connection, Relay]]:
    db = tmp_path / "src.db"
    con = sqlite3.connect(db)
    con.execute(DDL)
    con.commit()
    relay = make_relay(db, tmp_path, tables=["t"], capacity_bytes=64 * 1024 * 1024)
    with relay:
        yield con, relay
    con.close()


def _workload(con: sqlite3.Connection, rng: random.Random, txns: int, first_key: int = 1,
              ) -> int:
    """Random transactions of inserts, updates and deletes; returns the row changes made."""
    changes = 0
    key = first_key
    for _ in range(txns):
        for _ in range(rng.randint(1, 6)):
            live = [k for (k,) in con.execute("SELECT id FROM t")]
            roll = rng.random()
            if roll < 0.5 or not live:
                con.execute("INSERT INTO t VALUES (?,?,?,?,?,?,?,?,?)", _row(rng, key))
                key += 1
            elif roll < 0.8:
                k = rng.choice(live)
                con.execute("UPDATE t SET name=?, r=?, b=?, d=?, dt=?, dd=?, flag=?, tx=?"
                            " WHERE id=?", (*_row(rng, k)[1:], k))
            else:
                con.execute("DELETE FROM t WHERE id=?", (rng.choice(live),))
            changes += 1
        con.commit()
    return changes


def _map_scn(store_dir: Path) -> int:
    try:
        return int(json.loads((store_dir / "databus-bin.state").read_bytes())["end"]["scn"])
    except FileNotFoundError:
        return -1


def _files(store_dir: Path) -> list[Path]:
    index = (store_dir / "databus-bin.index").read_text().split()
    return [store_dir / n.removeprefix("./") for n in index]


def _check_equal(con: sqlite3.Connection, store_dir: Path, changes: int) -> None:
    decoded = mariadb_decode(_files(store_dir))
    assert decoded.stderr == b""
    assert len(decoded.changes) == changes
    assert decoded.xids == sorted(set(decoded.xids))  # every window once, in order
    tables = replay(decoded)
    got = {int(k): _norm_binlog(v) for k, v in tables.get("main.t", {}).items()}
    want = {r[0]: _norm_sqlite(r) for r in con.execute("SELECT * FROM t")}
    assert got == want
    assert decoded.ddl and decoded.ddl[0].startswith("CREATE TABLE IF NOT EXISTS `main`.`t`")


def test_mariadb_binlog_decodes_every_change_equal_to_the_sqlite_source(
        source: tuple[sqlite3.Connection, Relay], tmp_path: Path) -> None:
    con, relay = source
    changes = _workload(con, random.Random(7), 120)
    wait_until(lambda: relay.buffer.max_scn >= 0, 10, "the relay to capture")
    store = BinlogStore(tmp_path / "bin", rotate_bytes=256 * 1024)
    conv = BinlogConverter(ClientConfig(relay=relay.url, poll_timeout=0.2), store,
                           checkpoint_every=7)
    stop = threading.Event()
    th = threading.Thread(target=conv.run, args=(stop,))
    th.start()
    try:
        wait_until(lambda: store.last_scn() >= relay.buffer.max_scn > 0, 60,
                   "the converter to reach the relay")
        assert len(store.files()) > 2  # rotated
        # every file but the last closed: no in-use flag; sizes as the store says
        for name, size in store.files():
            assert store.path(name).stat().st_size == size
        _check_equal(con, tmp_path / "bin", changes)
        assert store.gtid_executed() == f"{store.server_uuid}:1-{store.last_gno()}"
    finally:
        stop.set()
        th.join()
        store.close()


def test_a_converter_killed_mid_stream_leaves_every_transaction_exactly_once(
        source: tuple[sqlite3.Connection, Relay], tmp_path: Path) -> None:
    con, relay = source
    rng = random.Random(11)
    out = tmp_path / "bin"
    cmd = [sys.executable, "-m", "tests.support.binlog", relay.url, str(out), "20000", "1"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    changes = 0
    key = 1
    for round_ in range(6):
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        try:
            n = _workload(con, rng, 15, key)
            changes += n
            key += n
            time.sleep(rng.uniform(0.3, 1.5) if round_ < 5 else 0)
            if round_ == 5:  # the last run finishes the stream
                # read the map, not a store: opening one would recover a live directory
                wait_until(lambda: _map_scn(out) >= relay.buffer.max_scn, 60,
                           "the converter to reach the relay")
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    store = BinlogStore(out)  # recovers a torn tail, if any
    store.close()
    _check_equal(con, out, changes)
    names = [h.name for f in _files(out) for h in ev.iter_headers(f.read_bytes())]
    assert names.count("Gtid") == BinlogStore(out).last_gno()


def test_a_new_binlog_refuses_a_relay_without_its_sources_beginning_only_when_told(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    db = tmp_path / "src.db"
    con = sqlite3.connect(db)
    con.execute(DDL)
    con.execute("INSERT INTO t (id, tx) VALUES (1, 'before the relay')")
    con.commit()
    # a relay that starts with a snapshot cannot prove what came before it
    relay = make_relay(db, tmp_path, tables=["t"], snapshot_mode="initial")
    with relay:
        wait_until(lambda: relay.buffer.max_scn >= 0, 10, "the relay's snapshot")
        strict = BinlogConverter(ClientConfig(relay=relay.url, poll_timeout=0.2),
                                 BinlogStore(tmp_path / "strict"),
                                 require_complete_history=True)
        with pytest.raises(ScnNotFoundError, match="require_complete_history"):
            strict.run(threading.Event())
        assert strict.store.last_scn() == -1
        strict.store.close()
        # by default it starts at the relay's oldest window (the snapshot), and says so
        store = BinlogStore(tmp_path / "lenient")
        conv = BinlogConverter(ClientConfig(relay=relay.url, poll_timeout=0.2), store)
        stop = threading.Event()
        th = threading.Thread(target=conv.run, args=(stop,))
        with caplog.at_level("WARNING", logger="databus.binlog"):
            th.start()
            try:
                wait_until(lambda: store.last_scn() >= relay.buffer.max_scn, 30,
                           "the converter to write the snapshot")
            finally:
                stop.set()
                th.join()
        assert "cannot prove" in caplog.text
        decoded = mariadb_decode(_files(tmp_path / "lenient"))
        assert [c[3][0] for c in decoded.changes if c[1] == "INSERT"] == ["1"]
        store.close()
    con.close()
