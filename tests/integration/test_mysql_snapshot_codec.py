"""Snapshot chunk rows through the compiled text-row codec vs the Python path.

* Chunks of the type matrix (NULLs, zero dates, latin1/utf8mb4/binary strings,
  decimals, BIT, ENUM/SET, JSON, temporal fractions, unsigned extremes), a
  composite text key, a latin1 key, and column filters give byte-identical
  keys, payloads and ``r`` events both ways.
* Damaged result rows (truncated, bit-flipped, with trailing bytes) raise
  ``CorruptEventError`` from the compiled reader, never crash it.
* Kept table definitions are forgotten on a DDL: chunks read after an ALTER
  carry the new column.
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import pytest

from databus.core import event as ev
from databus.core.envelope import decode_images
from databus.core.errors import CorruptEventError
from databus.sources.common import incremental as inc
from databus.sources.mysql import chunks, fastpath
from databus.sources.mysql.connection import SqlSession
from databus.sources.mysql.snapshots import SnapshotIO, encode_chunk
from databus.sources.mysql.source import NOTIFICATIONS, MysqlSource
from tests.support.mariadb import MariaDB
from tests.support.sources import mysql_source
from tests.support.typematrix import COLUMNS, EXTRA, ROWS

pytestmark = [
    pytest.mark.skipif(not fastpath.available(), reason="the C extension is not built"),
]

NAMES = [n for n, _ in COLUMNS]


def _row(**changes: Any) -> tuple[Any, ...]:
    base = dict(zip(NAMES, ROWS[1], strict=True))
    base.update(changes)
    return tuple(base[n] for n in NAMES)


MORE = [  # zero and impossible dates, extremes, odd floats, filtered-out text
    _row(id=4, dt="0000-00-00", dtt0="0000-00-00 00:00:00", dtt6="2020-00-05 00:00:00",
         ts0="0000-00-00 00:00:00", ts6=None, d1="0.000000000000000000000000000000",
         d2="-0.00", d3="0", f=-0.0, db=5e-324, b1=0, b9=0, b64=0, y=0, e="ç", st="",
         vl="\u20ac\u0081\u00ff", c="  a", j="[]", t0="-00:00:00.5"),
    _row(id=5, dt="2024-02-29", dtt2="2024-02-29 23:59:59.99", ts6="2038-01-19 03:14:07.000001",
         f=3.4028234663852886e38, db=1.7976931348623157e308, bi=-1, bu=18446744073709551615,
         d1="99999999999999999999999999999999999.999999999999999999999999999999",
         vb=b"\xff" * 20, bn=b"\x01", tx="tab\tquote\"back\\slash\x00nul", e="b",
         st="x,y,z", j='{"a": null, "b": "\\u00e9"}', t3="838:59:59.000"),
    *[_row(id=i, i=i * 1000, vc=f"row {i} é", d2=f"{i}.{i % 100:02d}") for i in range(6, 40)],
]


@pytest.fixture
def tables(server: MariaDB) -> MariaDB:
    cols = ", ".join(f"`{n}` {t}" for n, t in COLUMNS)
    extra = ", ".join(f"`{n}` {t}" for n, t in EXTRA)
    server.execute("CREATE DATABASE types",
                   f"CREATE TABLE types.t ({cols})",
                   f"CREATE TABLE types.x ({extra}, PRIMARY KEY (k1, k2))",
                   "CREATE TABLE types.lk (k VARCHAR(10) CHARACTER SET latin1 PRIMARY KEY,"
                   " v DECIMAL(30,10), secret TEXT)",
                   "CREATE TABLE types.ub (k BIGINT UNSIGNED PRIMARY KEY, v FLOAT)",
                   "CREATE TABLE types.bk (k VARBINARY(8) PRIMARY KEY, v INT)")
    with server.connect("types") as con, con.cursor() as cur:
        cur.execute("SET time_zone = '+00:00'")
        cur.execute("SET sql_mode = ''")  # allows zero dates
        marks = ", ".join(["%s"] * len(COLUMNS))
        cur.executemany(f"INSERT INTO t VALUES ({marks})", [*ROWS, *MORE])
        cur.execute("INSERT INTO x (k1, k2, dz, dtz, g, n) VALUES"
                    " (1, 'a\"b\\\\c\\n', '0000-00-00', '0000-00-00 00:00:00', NULL, 5),"
                    " (1, 'a', '2020-00-00', '2024-01-02 03:04:05.678',"
                    "  ST_GeomFromText('POINT(1 2)'), NULL),"
                    " (2, 'ü😀', '2020-00-00', '2024-01-02 03:04:05.678',"
                    "  ST_GeomFromText('POINT(1 2)'), NULL),"
                    " (-3, '', '1000-01-01', '9999-12-31 23:59:59.999',"
                    "  ST_GeomFromText('LINESTRING(0 0, 1 1, 2 5)'), -7)")
        cur.execute("INSERT INTO lk VALUES ('Ä€\x81z', -12345678901234567890.0123456789,"
                    " 's'), ('b', 0, NULL), ('', 1.5, 'x')")
        cur.execute("INSERT INTO ub VALUES (18446744073709551615, 1.5), (0, -2.25),"
                    " (9223372036854775808, NULL)")
        cur.execute("INSERT INTO bk VALUES (x'00ff', 1), ('a', 2)")
    return server


def _chunks(src: MysqlSource, table: str, key: list[str], size: int
            ) -> tuple[list[tuple[Any, Any, list[Any]]], Any]:
    """Every row of ``table`` by chunks of ``size``, as the coordinator reads them."""
    io = SnapshotIO(SqlSession(src.url), "databus.signals", lambda _n: True, src._shape_of)
    out: list[tuple[Any, Any, list[Any]]] = []
    last = None
    try:
        td, shape = io._table(table)
        sql, params = chunks.chunk_query(td, key or [td.names[i] for i in td.primary_key],
                                         None, None, 1, None)
        # the compiled reader runs wherever there is a codec (nothing falls back silently)
        compatible = fastpath.text_compatible(td, io.session.query_raw(sql, params).columns)
        assert compatible or shape.codec is None
        while True:
            rows, shape = io.read_chunk(table, key, last, None, size, None)
            out += rows
            if len(rows) < size:
                return out, shape
            last = rows[-1][2]
    finally:
        io.session.close()


@pytest.mark.parametrize("table,key,filters", [
    ("types.t", [], ()),
    ("types.t", [], (r"types\.t\.(vc|j|d1|ts6)",)),
    ("types.t", ["i"], ()),  # a surrogate chunk key
    ("types.x", [], (r"types\.x\.g",)),
    ("types.x", [], ()),
    ("types.lk", [], ()),
    ("types.ub", [], ()),
    ("types.bk", [], ()),  # a binary key: no compiled codec, the Python path both ways
])
def test_compiled_and_python_snapshot_rows_are_identical(
        tables: MariaDB, table: str, key: list[str], filters: tuple[str, ...]) -> None:
    kw: dict[str, Any] = {"snapshot_mode": "no_data", "exclude_columns": filters}
    fast = mysql_source(tables.url, [r"types\..*"], compiled=True, **kw)
    slow = mysql_source(tables.url, [r"types\..*"], compiled=False, **kw)
    try:
        fast_rows, fast_shape = _chunks(fast, table, key, 3)
        slow_rows, slow_shape = _chunks(slow, table, key, 3)
        assert slow_shape.codec is None
        if table != "types.bk":
            assert fast_shape.codec is not None  # the compiled reader is what ran
        assert len(fast_rows) == len(slow_rows) >= 2
        assert fast_rows == slow_rows  # keys, payloads, and each chunk's last key
        scn, ts = (7 << 32) | 1234, 1_700_000_000_123_456_789
        events = []
        for _src, rows, shape in ((fast, fast_rows, fast_shape), (slow, slow_rows, slow_shape)):
            chunk = inc.Chunk("o", "c", table, {k: p for k, p, _ in rows}, None, True, shape)
            data, n = encode_chunk(chunk, scn, ts)
            assert n == len(rows)
            events.append(data)
        assert events[0] == events[1]
        decoded = list(ev.iter_events(events[0]))
        assert all(e.op == ev.Op.READ and e.is_snapshot and e.scn == scn for e in decoded)
        reg = fast.registry()
        images = [decode_images(e, reg)[2] for e in decoded]
        if filters:
            assert not any(set(img or {}) & {"vc", "j", "d1", "ts6", "g"} for img in images)
    finally:
        fast.close()
        slow.close()


def test_matrix_nulls_and_zero_dates_decode_as_expected(tables: MariaDB) -> None:
    with mysql_source(tables.url, [r"types\..*"], snapshot_mode="no_data") as src:
        rows, shape = _chunks(src, "types.t", [], 100)
        reg = src.registry()
        chunk = inc.Chunk("o", "c", "types.t", {k: p for k, p, _ in rows}, None, True, shape)
        data, _ = encode_chunk(chunk, 1, 0)
        images = {e.key: decode_images(e, reg)[2] for e in ev.iter_events(data)}
    assert set(images) == {1, 2, 3, *range(4, 40)}
    assert all(v is None for k, v in images[3].items() if k != "id")  # type: ignore[union-attr]
    four = images[4]
    assert four is not None
    assert four["dt"] is None and four["dtt0"] is None and four["dtt6"] is None
    assert four["ts0"] is None and four["vl"] == "\u20ac\u0081\u00ff" and four["y"] == 0
    assert images[5]["bu"] == 18446744073709551615  # type: ignore[index]


def test_damaged_result_rows_raise_a_typed_error(tables: MariaDB) -> None:
    src = mysql_source(tables.url, [r"types\..*"], snapshot_mode="no_data")
    io = SnapshotIO(SqlSession(src.url), "databus.signals", lambda _n: True, src._shape_of)
    try:
        td, shape = io._table("types.t")
        result = io.session.query_raw("SELECT " + ", ".join(
            f"CAST(`{n}` AS DOUBLE)" if t == "FLOAT" else f"`{n}`" for n, t in COLUMNS)
            + " FROM types.t ORDER BY id")
        assert fastpath.text_compatible(td, result.columns)
        good = fastpath.encode_text(shape.codec, result.rows, "types.t")
        assert len(good) == len(ROWS) + len(MORE)
        rng = random.Random(11)
        failures = 0
        for raw in result.rows[:6]:
            cuts = sorted({*range(0, min(len(raw), 300)), *rng.sample(range(len(raw)), min(60, len(raw)))})
            for cut in cuts:  # every truncation is an error, not a crash or a short row
                with pytest.raises(CorruptEventError):
                    fastpath.encode_text(shape.codec, [raw[:cut]], "types.t")
                failures += 1
            with pytest.raises(CorruptEventError):
                fastpath.encode_text(shape.codec, [raw + b"\x00"], "types.t")
            for _ in range(300):  # bit flips: a value, or a typed error
                b = bytearray(raw)
                for _k in range(rng.randrange(1, 4)):
                    b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
                try:
                    fastpath.encode_text(shape.codec, [bytes(b)], "types.t")
                except CorruptEventError:
                    failures += 1
        assert failures > 300
        for junk in (b"", b"\xfb", b"\xff", b"\xfe" + b"\xff" * 8, b"\xfc\x01"):
            with pytest.raises(CorruptEventError):
                fastpath.encode_text(shape.codec, [junk], "types.t")
    finally:
        io.session.close()
        src.close()


@pytest.mark.parametrize("ddl,fits", [
    ("ALTER TABLE shop.t ADD COLUMN z INT NOT NULL DEFAULT 7",
     lambda img: img.get("z") == 7),
    ("ALTER TABLE shop.t DROP COLUMN v", lambda img: "v" not in img),
    ("ALTER TABLE shop.t MODIFY v VARCHAR(20)", lambda img: isinstance(img["v"], str)),
])
def test_a_ddl_makes_later_chunks_read_the_new_definition(server: MariaDB, ddl: str,
                                                          fits: Any) -> None:
    server.execute("CREATE DATABASE shop",
                   "CREATE TABLE shop.t (id INT PRIMARY KEY, v DECIMAL(10,2))",
                   "INSERT INTO shop.t SELECT seq, seq / 4 FROM shop.seq_1_to_400")
    src = mysql_source(server.url, [r"shop\..*"], snapshot_mode="initial", snapshot_chunk_size=10)
    stop = threading.Event()
    after, altered, notices = -1, False, []
    fitting = unfit = 0
    ddl_seen = False
    deadline = time.monotonic() + 120
    try:
        while "COMPLETED" not in notices and "ABORTED" not in notices:
            assert time.monotonic() < deadline, notices
            for w in src.read(after, stop, 0.5):
                after = w.scn
                for e in ev.iter_events(w.events):
                    schema, _b, img, _ = decode_images(e, src.registry())
                    if schema.name == NOTIFICATIONS:
                        notices.append(img["kind"])  # type: ignore[index]
                    elif schema.name == "databus.schema_changes":
                        ddl_seen = True
                    elif e.is_snapshot and ddl_seen:
                        assert img is not None
                        fitting += bool(fits(img))
                        unfit += not fits(img)
            if not altered and notices.count("CHUNK_DONE") >= 3:
                server.execute(ddl)
                altered = True
    finally:
        src.close()
    assert altered and ddl_seen and "ABORTED" not in notices
    assert fitting > 100, "chunks after the DDL must be read with the new definition"
    assert unfit == 0


def test_buffered_row_packets_split_exactly_and_safely() -> None:
    scan = fastpath.scan_rows()
    assert scan is not None
    rng = random.Random(3)
    rows = [bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300))) for _ in range(50)]
    rows = [b"\x01" + r for r in rows]  # a row never starts with 0xFE/0xFF
    wire = b"".join(len(r).to_bytes(3, "little") + bytes([(9 + i) & 0xFF]) + r
                    for i, r in enumerate(rows))
    eof = b"\x05\x00\x00" + bytes([(9 + len(rows)) & 0xFF]) + b"\xfe\x00\x00\x02\x00"
    got, used, seq = scan(wire + eof, 9)
    assert got == rows and used == len(wire) and seq == (9 + len(rows)) & 0xFF
    for cut in range(0, len(wire), 7):  # an incomplete packet is left for pymysql
        got, used, _ = scan(wire[:cut], 9)
        assert used == sum(len(g) + 4 for g in got) <= cut
        assert got == rows[:len(got)] and (cut - used < 4 or len(got) == len(rows)
                                           or cut - used < 4 + len(rows[len(got)]))
    assert scan(wire, 10) == ([], 0, 10)  # a wrong sequence number stops at once
    for _ in range(2000):  # random bytes: never more than was given, never a crash
        junk = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 64)))
        got, used, _ = scan(junk, rng.randrange(256))
        assert used <= len(junk) and sum(len(g) + 4 for g in got) == used
