"""Events of the MySQL source, checked against the server and across both codecs.

* The compiled codec (``_rowcodec``) and the Python decoder produce the very
  same bytes for the whole type matrix, composite and missing keys, latin1
  keys and column filters.
* The images a consumer decodes from those events equal what ``SELECT``
  returns for the same rows from the same server (inserted, updated, deleted).
* All of it also with MariaDB's compressed binlog events (``log_bin_compress=ON``):
  every test here runs on a plain and on a compressing server.
"""

from __future__ import annotations

import datetime as dt
import decimal
import struct
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from databus.core import event as ev
from databus.core.envelope import decode_images
from databus.core.window import Window
from databus.sources.mysql import compressed, fastpath
from databus.sources.mysql.checks import parse_mysql_url
from databus.sources.mysql.connection import master_status
from databus.sources.mysql.source import MysqlSource
from tests.support.mariadb import BINLOG_SETTINGS, MariaDB
from tests.support.sources import mysql_source
from tests.support.typematrix import COLUMNS, EXTRA, ROWS


@pytest.fixture(params=["plain", "log_bin_compress"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[MariaDB]:
    """A private MariaDB, writing plain or (min length 10) compressed binlog events."""
    settings = dict(BINLOG_SETTINGS)
    if request.param == "log_bin_compress":
        settings.update({"log-bin-compress": "ON", "log-bin-compress-min-len": "10"})
    with MariaDB(tmp_path / "db", settings=settings) as m:
        if request.param == "log_bin_compress":
            m.execute("CREATE DATABASE probe", "CREATE TABLE probe.t (v TEXT)",
                      "INSERT INTO probe.t VALUES (REPEAT('x', 100))", "DROP DATABASE probe")
            assert _compressed_events(m), "the server did not compress"
        yield m


def _compressed_events(m: MariaDB) -> int:
    with m.connect() as con, con.cursor() as cur:
        cur.execute("SHOW BINLOG EVENTS")
        return sum(1 for r in cur.fetchall() if "compressed" in str(r[2]).lower())


def _scn(url: Any) -> int:
    file, pos = master_status(url)
    return (int(file.rsplit(".", 1)[1]) << 32) | pos


def _capture(m: MariaDB, start: int, end: int, **kw: Any) -> tuple[MysqlSource, list[Window]]:
    with mysql_source(m.url, [r"types\..*"], **kw) as src:
        out: list[Window] = []
        after = start
        stop = threading.Event()
        while after < end:
            got = src.read(after, stop, 5.0)
            assert got or after < end, "no progress"
            for w in got:
                out.append(w)
                after = w.scn
    return src, out


def _select(m: MariaDB, table: str, key: str) -> dict[Any, dict[str, Any]]:
    with m.connect("types") as con, con.cursor() as cur:
        cur.execute("SET time_zone = '+00:00'")
        cur.execute(f"SELECT * FROM {table}")
        names = [d[0] for d in cur.description]
        rows = [dict(zip(names, r, strict=True)) for r in cur.fetchall()]
    return {tuple(r[k] for k in key.split(",")): r for r in rows}


def _as_select(name: str, sql_type: str, v: Any) -> Any:
    """An Avro-decoded value in the form pymysql gives for the column type."""
    if v is None:
        return None
    t = sql_type.split("(")[0].split()[0].upper()
    if t == "TIME":
        return dt.timedelta(microseconds=v)
    if t == "BIT":
        return int(v)
    if t == "FLOAT":
        return struct.unpack("<f", struct.pack("<f", v))[0]
    if t == "TIMESTAMP":
        return v.replace(tzinfo=None)
    if t == "BIGINT" and "UNSIGNED" in sql_type.upper():
        return int(v)
    return v


def _from_select(sql_type: str, v: Any) -> Any:
    if v is None:
        return None
    t = sql_type.split("(")[0].split()[0].upper()
    if t == "BIT":
        return int.from_bytes(v, "big")
    if t == "FLOAT":
        return struct.unpack("<f", struct.pack("<f", v))[0]
    if t == "SET":
        return ",".join(x for x in ("x", "y", "z") if x in v)
    if t in ("DATE", "DATETIME") and isinstance(v, str):
        return None  # zero dates and dates with a zero part: documented as null
    if isinstance(v, decimal.Decimal):
        return v
    return v


def _images(src: MysqlSource, windows: list[Window], table: str
            ) -> list[tuple[str, dict[str, Any] | None, dict[str, Any] | None]]:
    reg = src.registry()
    out = []
    for w in windows:
        for e in ev.iter_events(w.events):
            if e.src_id < 0 or reg.get(e.schema_id).name != f"types.{table}":
                continue
            _s, before, after, _meta = decode_images(e, reg)
            out.append((e.op.letter, before, after))
    return out


@pytest.fixture
def captured(server: MariaDB) -> dict[str, Any]:
    url = parse_mysql_url(server.url)
    cols = ", ".join(f"`{n}` {t}" for n, t in COLUMNS)
    extra = ", ".join(f"`{n}` {t}" for n, t in EXTRA)
    server.execute("SET GLOBAL time_zone = '+00:00'", "CREATE DATABASE types",
                   f"CREATE TABLE types.t ({cols})",
                   f"CREATE TABLE types.x ({extra}, PRIMARY KEY (k1, k2))",
                   "CREATE TABLE types.nokey (a INT, b VARCHAR(5) CHARACTER SET latin1)",
                   "CREATE TABLE types.lk (k VARCHAR(10) CHARACTER SET latin1 PRIMARY KEY,"
                   " v DECIMAL(30,10), secret TEXT)")
    start = _scn(url)
    with server.connect("types") as con:
        snaps: dict[str, Any] = {}
        with con.cursor() as cur:
            cur.execute("SET time_zone = '+00:00'")
            cur.execute("SET sql_mode = ''")  # allows zero dates
            marks = ", ".join(["%s"] * len(COLUMNS))
            cur.executemany(f"INSERT INTO t VALUES ({marks})", ROWS)
            cur.execute("INSERT INTO x (k1, k2, dz, dtz, g, n) VALUES"
                        " (1, 'a\"b\\\\c\\n', '0000-00-00', '0000-00-00 00:00:00', NULL, 5),"
                        " (2, 'ü😀', '2020-00-00', '2024-01-02 03:04:05.678',"
                        "  ST_GeomFromText('POINT(1 2)'), NULL),"
                        " (-3, '', '1000-01-01', '9999-12-31 23:59:59.999',"
                        "  ST_GeomFromText('LINESTRING(0 0, 1 1, 2 5)'), -7)")
            cur.execute("INSERT INTO nokey VALUES (1, 'é€'), (1, 'é€'), (NULL, NULL)")
            cur.execute("INSERT INTO lk VALUES ('Ä€\x81z', -12345678901234567890.0123456789, 's')")
            snaps["t.inserted"] = _select(server, "t", "id")
            snaps["x.inserted"] = _select(server, "x", "k1,k2")
            cur.execute("UPDATE t SET vc = 'changed', d2 = -5.5, tx = NULL WHERE id = 1")
            cur.execute("UPDATE x SET n = n + 1, dz = '2021-02-03' WHERE k1 <> 2")
            cur.execute("DELETE FROM t WHERE id = 2")
            cur.execute("DELETE FROM x WHERE k1 = 2")
            cur.execute("UPDATE nokey SET a = 2 WHERE a = 1")
            cur.execute("UPDATE lk SET v = 1.5")
            snaps["t.current"] = _select(server, "t", "id")
            snaps["x.current"] = _select(server, "x", "k1,k2")
    end = _scn(url)
    return {"server": server, "start": start, "end": end, **snaps}


@pytest.mark.skipif(not fastpath.available(), reason="the C extension is not built")
def test_compiled_and_python_codecs_give_the_same_bytes(captured: dict[str, Any]) -> None:
    m, start, end = captured["server"], captured["start"], captured["end"]
    _, fast = _capture(m, start, end)
    _, slow = _capture(m, start, end, compiled=False)
    assert [w.scn for w in fast] == [w.scn for w in slow]
    for a, b in zip(fast, slow, strict=True):
        assert a.count == b.count
        assert a.events == b.events
    filtered = {"exclude_columns": [r"types\.lk\.secret", r"types\.t\.(lt|bl)", r"types\.lk\.k"]}
    _, fast_f = _capture(m, start, end, **filtered)
    _, slow_f = _capture(m, start, end, compiled=False, **filtered)
    assert [w.events for w in fast_f] == [w.events for w in slow_f]
    assert sum(len(w.events) for w in fast_f) < sum(len(w.events) for w in fast)


def test_event_images_equal_select(captured: dict[str, Any]) -> None:
    m = captured["server"]
    src, windows = _capture(m, captured["start"], captured["end"])
    types = dict(COLUMNS)
    got = [(op, b and {k: _as_select(k, types[k], v) for k, v in b.items()},
            a and {k: _as_select(k, types[k], v) for k, v in a.items()})
           for op, b, a in _images(src, windows, "t")]

    def want(row: dict[str, Any]) -> dict[str, Any]:
        return {k: _from_select(types[k], v) for k, v in row.items()}

    ins, cur = captured["t.inserted"], captured["t.current"]
    assert got[:3] == [("c", None, want(ins[(k,)])) for k in (1, 2, 3)]
    assert got[3] == ("u", want(ins[(1,)]), want(cur[(1,)]))
    assert got[4] == ("d", want(ins[(2,)]), None)
    assert len(got) == 5


def test_zero_dates_geometry_generated_columns_composite_keys(captured: dict[str, Any]) -> None:
    m = captured["server"]
    src, windows = _capture(m, captured["start"], captured["end"])
    types = dict(EXTRA)
    images = _images(src, windows, "x")
    ins, cur = captured["x.inserted"], captured["x.current"]

    def want(row: dict[str, Any]) -> dict[str, Any]:
        return {k: _from_select(types[k], v) for k, v in row.items()}

    def norm(img: dict[str, Any] | None) -> dict[str, Any] | None:
        return img and {k: v.replace(tzinfo=None) if isinstance(v, dt.datetime) else v
                        for k, v in img.items()}

    inserts = [norm(a) for op, _b, a in images if op == "c"]
    assert sorted(inserts, key=lambda r: (r or {})["k1"]) == [
        want(ins[k]) for k in sorted(ins, key=lambda k: k[0])]
    updates = [(norm(b), norm(a)) for op, b, a in images if op == "u"]
    assert sorted(updates, key=lambda u: (u[1] or {})["k1"]) == [
        (want(ins[k]), want(cur[k])) for k in sorted(cur, key=lambda k: k[0])]
    deletes = [norm(b) for op, b, _a in images if op == "d"]
    assert deletes == [want(r) for k, r in ins.items() if k[0] == 2]
    # composite keys are a JSON array of the key values
    keys = {e.key for w in windows for e in ev.iter_events(w.events)
            if e.src_id >= 0 and src.registry().get(e.schema_id).name == "types.x"}
    assert b'[1,"a\\"b\\\\c\\n"]' in keys and '[2,"ü😀"]'.encode() in keys


def test_column_filters_and_keyless_tables(captured: dict[str, Any]) -> None:
    m = captured["server"]
    src, windows = _capture(m, captured["start"], captured["end"],
                            exclude_columns=[r"types\.lk\.(secret|k)"])
    lk = src.registry().latest(next(s.id for s in src.sources() if s.name == "types.lk"))
    assert lk.column_names == ["k", "v"]  # key columns always stay
    rows = _images(src, windows, "lk")
    assert rows[0] == ("c", None, {"k": "Ä€\x81z", "v": decimal.Decimal(
        "-12345678901234567890.0123456789")})
    nokey = [(op, b, a) for op, b, a in _images(src, windows, "nokey")]
    assert [a for op, _b, a in nokey if op == "c"] == [
        {"a": 1, "b": "é€"}, {"a": 1, "b": "é€"}, {"a": None, "b": None}]
    assert [(b, a) for op, b, a in nokey if op == "u"] == [
        ({"a": 1, "b": "é€"}, {"a": 2, "b": "é€"})] * 2
    # keyless rows are keyed by their index in the transaction
    keys = [e.key for w in windows for e in ev.iter_events(w.events) if e.src_id >= 0
            and src.registry().get(e.schema_id).name == "types.nokey"]
    assert keys == [0, 1, 2, 0, 1]


@pytest.mark.skipif(not fastpath.available(), reason="the C extension is not built")
def test_compiled_codec_rejects_damaged_rows_events_cleanly(captured: dict[str, Any]) -> None:
    """Truncated or bit-flipped rows events raise ValueError (-> CorruptEventError in
    the source); the codec never reads out of bounds or crashes the process, and
    the Python decoder raises CorruptEventError."""
    import contextlib
    import random

    from databus.core.errors import CorruptEventError
    from databus.core.schema import MetadataCodec
    from databus.sources.mysql import events as be
    from databus.sources.mysql.connection import BinlogStream
    from databus.sources.mysql.rows import decode_rows, parse_table_def

    m = captured["server"]
    url = parse_mysql_url(m.url)
    start = captured["start"]
    stream = BinlogStream(url, server_id=91, file=f"binlog.{start >> 32:06d}",
                          pos=start & 0xFFFFFFFF)
    samples = []
    maps: dict[int, Any] = {}
    try:
        end_pos = captured["end"] & 0xFFFFFFFF
        while True:
            raw = stream.read()
            assert raw is not None
            h, body = be.parse_header(raw, stream.checksum)
            if h.next_pos >= end_pos:
                break
            etype = h.type
            if etype in compressed.COMPRESSED:
                etype, body = compressed.expand(etype, body)
            if etype == be.EventType.TABLE_MAP:
                td = parse_table_def(body)
                maps[td.table_id] = td
            elif etype in be.ROW_EVENTS:
                samples.append((maps[int.from_bytes(body[0:6], "little")], etype, bytes(body)))
    finally:
        stream.close()
    assert len(samples) >= 8
    rng = random.Random(7)
    outcomes = {"ok": 0, "error": 0}
    for td, etype, body in samples:
        codec = fastpath.compile_codec(td, src_id=1, schema_id=b"x" * 16, schema_version=1,
                                       meta_id=MetadataCodec.ID, keep=[True] * len(td.types))
        assert codec is not None
        data, n = codec.encode(body, etype, 1, 0, b"", 0, "t")
        assert n >= 1 and sum(1 for _ in ev.iter_events(data)) == n  # both CRCs checked
        for _ in range(300):
            damaged = bytearray(body)
            if rng.random() < 0.5:
                del damaged[rng.randrange(9, len(damaged)):]
            else:
                for _ in range(rng.randint(1, 4)):
                    damaged[rng.randrange(8, len(damaged))] = rng.randrange(256)
            try:
                codec.encode(bytes(damaged), etype, 1, 0, b"", 0, "t")
                outcomes["ok"] += 1
            except ValueError:
                outcomes["error"] += 1
            # the Python decoder: a typed error, never a hang or another exception
            with contextlib.suppress(CorruptEventError):
                decode_rows(td, etype, memoryview(bytes(damaged)))
    assert outcomes["error"] > 100 and outcomes["ok"] > 0


@pytest.mark.parametrize("compiled", [True, False])
def test_a_key_change_is_a_delete_and_an_insert(server: MariaDB, compiled: bool) -> None:
    if compiled and not fastpath.available():
        pytest.skip("the C extension is not built")
    url = parse_mysql_url(server.url)
    server.execute("CREATE DATABASE types",
                   "CREATE TABLE types.i (id INT PRIMARY KEY, v INT)",
                   "CREATE TABLE types.c (a INT, b VARCHAR(5), v INT, PRIMARY KEY (a, b))",
                   "INSERT INTO types.i VALUES (1, 1), (2, 2)",
                   "INSERT INTO types.c VALUES (1, 'x', 1)")
    start = _scn(url)
    server.execute("BEGIN", "UPDATE types.i SET v = 5 WHERE id = 1",
                   "UPDATE types.i SET id = 20 WHERE id = 2",
                   "UPDATE types.c SET b = 'y', v = 2", "COMMIT")
    src, windows = _capture(server, start, _scn(url), compiled=compiled)
    reg = src.registry()
    got = []
    for w in windows:
        for e in ev.iter_events(w.events):
            _s, before, after, meta = decode_images(e, reg)
            got.append((e.op.letter, e.key, before, after, meta["row"]))
    assert got == [
        ("u", 1, {"id": 1, "v": 1}, {"id": 1, "v": 5}, 0),
        ("d", 2, {"id": 2, "v": 2}, None, 1),
        ("c", 20, None, {"id": 20, "v": 2}, 2),
        ("d", b'[1,"x"]', {"a": 1, "b": "x", "v": 1}, None, 3),
        ("c", b'[1,"y"]', None, {"a": 1, "b": "y", "v": 2}, 4),
    ]
    assert len(windows) == 1 and windows[0].count == 5
