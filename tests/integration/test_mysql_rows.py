"""Row decoding compared with what SELECT returns from the same server."""

from __future__ import annotations

import datetime as dt
import struct
from typing import Any

from databus.sources.mysql import events as be
from databus.sources.mysql import parse_mysql_url
from databus.sources.mysql.connection import BinlogStream, binary_logs
from databus.sources.mysql.rows import T_FLOAT, TableDef, decode_rows, parse_table_def
from tests.support.mariadb import MariaDB
from tests.support.typematrix import COLUMNS, ROWS


def _select(m: MariaDB) -> dict[int, list[Any]]:
    with m.connect("types") as con, con.cursor() as cur:
        cur.execute("SET time_zone = '+00:00'")
        cur.execute("SELECT * FROM t ORDER BY id")
        return {r[0]: list(r) for r in cur.fetchall()}


def _bits_as_int(row: list[Any]) -> list[Any]:
    """pymysql gives BIT values as bytes (the decoder: integers) and FLOATs as the
    shortest decimal text (the server stores a 4-byte float: compare that)."""
    out = []
    for v, (_, t) in zip(row, COLUMNS, strict=True):
        if v is not None and t.startswith("BIT"):
            v = int.from_bytes(v, "big")
        elif v is not None and t == "FLOAT":
            v = struct.unpack("<f", struct.pack("<f", v))[0]
        out.append(v)
    return out


def _normalise(td: TableDef, row: list[Any]) -> list[Any]:
    out = []
    for i, v in enumerate(row):
        if v is None:
            out.append(None)
        elif td.real_types[i] == T_FLOAT:  # compare as the 4-byte float the server stores
            out.append(struct.unpack("<f", struct.pack("<f", v))[0])
        elif isinstance(v, dt.datetime) and v.tzinfo is not None:
            out.append(v.replace(tzinfo=None))
        elif isinstance(v, set):
            out.append(",".join(x for x in ("x", "y", "z") if x in v))
        else:
            out.append(v)
    return out


def test_decoded_images_equal_select(server: MariaDB) -> None:
    url = parse_mysql_url(server.url)
    file = binary_logs(url)[0][0]
    cols = ", ".join(f"`{n}` {t}" for n, t in COLUMNS)
    server.execute("SET GLOBAL time_zone = '+00:00'", "CREATE DATABASE types",
                   f"CREATE TABLE types.t ({cols})")
    with server.connect("types") as con:
        with con.cursor() as cur:
            cur.execute("SET time_zone = '+00:00'")
            marks = ", ".join(["%s"] * len(COLUMNS))
            cur.executemany(f"INSERT INTO t VALUES ({marks})", ROWS)
        inserted = {k: _bits_as_int(v) for k, v in _select(server).items()}
        with con.cursor() as cur:
            cur.execute("UPDATE t SET vc = 'changed', d2 = -5.5 WHERE id = 1")
            cur.execute("DELETE FROM t WHERE id = 2")
        current = {k: _bits_as_int(v) for k, v in _select(server).items()}

    with BinlogStream(url, server_id=77, file=file, pos=4) as stream:
        images: list[tuple[str, list[Any] | None, list[Any] | None]] = []
        td: TableDef | None = None
        while len(images) < 5:
            raw = stream.read()
            assert raw is not None
            h, body = be.parse_header(raw, stream.checksum)
            if h.type == be.EventType.TABLE_MAP:
                td = parse_table_def(body)
            elif h.type in be.ROW_EVENTS:
                assert td is not None and td.table == "t"
                kind = be.EventType(h.type).name.split("_")[0]
                for before, after in decode_rows(td, h.type, body):
                    images.append((kind, before, after))
    assert td is not None
    assert td.names == [n for n, _ in COLUMNS] and td.primary_key == [0]
    got = [(k, b and _normalise(td, b), a and _normalise(td, a)) for k, b, a in images]
    for k in (1, 2, 3):
        assert _diff(got[k - 1][2], inserted[k]) == []
    assert got[0] == ("WRITE", None, inserted[1])
    assert got[1] == ("WRITE", None, inserted[2])
    assert got[2] == ("WRITE", None, inserted[3])
    assert got[3] == ("UPDATE", inserted[1], current[1])
    assert got[4] == ("DELETE", inserted[2], None)


def _diff(a: list[Any] | None, b: list[Any] | None) -> list[tuple[str, Any, Any]]:
    assert a is not None and b is not None
    return [(COLUMNS[i][0], x, y) for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y]
