"""The client's compiled row decoder on the MySQL type matrix: events captured from a
private MariaDB (every column type, inserts, updates with before images, deletes)
decode to the same rows and columns on the compiled and the Python half, and to the
same rows, as Arrow takes them, in the Arrow sink (the Spark readers')."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from databus.client import wiredecode as wd
from databus.core import event as ev
from databus.sources.mysql.connection import master_status
from tests.support.mariadb import BINLOG_SETTINGS, MariaDB
from tests.support.sources import mysql_source
from tests.support.typematrix import COLUMNS, ROWS

pytestmark = pytest.mark.skipif(not wd.compiled(), reason="the C extension is not built")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[MariaDB]:
    with MariaDB(tmp_path / "db", settings=dict(BINLOG_SETTINGS)) as m:
        yield m


def _scn(m: MariaDB) -> int:
    from databus.sources.mysql.checks import parse_mysql_url

    file, pos = master_status(parse_mysql_url(m.url))
    return (int(file.rsplit(".", 1)[1]) << 32) | pos


def test_the_type_matrix_decodes_alike_on_both_halves(server: MariaDB) -> None:
    cols = ", ".join(f"`{n}` {t}" for n, t in COLUMNS)
    server.execute("SET GLOBAL time_zone = '+00:00'", "CREATE DATABASE types",
                   f"CREATE TABLE types.t ({cols})")
    start = _scn(server)
    with server.connect("types") as con, con.cursor() as cur:
        cur.execute("SET time_zone = '+00:00'")
        cur.executemany(f"INSERT INTO t VALUES ({', '.join(['%s'] * len(COLUMNS))})", ROWS)
        cur.execute("UPDATE t SET vc = 'changed', d2 = -5.5, tx = NULL WHERE id = 1")
        cur.execute("DELETE FROM t WHERE id = 2")
    end = _scn(server)
    with mysql_source(server.url, [r"types\..*"]) as src:
        bodies, after, stop = [], start, threading.Event()
        while after < end:
            for w in src.read(after, stop, 5.0):
                bodies.append(w.events + ev.encode_eop(w.scn))
                after = w.scn
        reg = src.registry()
    body = b"".join(bodies)
    events = wd.scan(body)
    assert events == wd.scan(body, native=False)
    data = [e for e in events if e.src_id >= 0 and reg.get(e.schema_id).name == "types.t"]
    assert len(data) == len(ROWS) + 2
    schema = reg.get(data[0].schema_id)
    native, python = wd.RowDecoder(schema), wd.RowDecoder(schema, native=False)
    assert native.native
    befores = [reg.metadata.decode(e.metadata)["before"] for e in data if e.metadata]
    payloads = [e.payload for e in data] + [b for b in befores if b is not None]
    assert len(payloads) > len(data)  # the update's before image is in the matrix too
    rows = python.rows(payloads)
    assert repr(native.rows(payloads)) == repr(rows)
    assert repr([native.row(p) for p in payloads]) == repr(rows)
    assert repr(native.columns(payloads)) == repr(python.columns(payloads))
    assert rows[0]["id"] == 1 and rows[2]["id"] == 3 and rows[2]["vc"] is None
    # the one decoder's other sink: Arrow envelope columns, compiled and Python
    sinks = pytest.importorskip("tests.unit.test_wiredecode_sinks")
    body = sinks.body_of(data)
    want = repr([sinks.expect(schema, e) for e in data])
    for native in (True, False):
        got = [sinks.picked(r) for r in sinks.arrow_sink(schema, body, native=native)]
        assert repr(got) == want
