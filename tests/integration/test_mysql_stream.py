"""The replication connection against a private MariaDB: framing, CRCs, order."""

from __future__ import annotations

import pytest

from databus.core.errors import SourcePositionLostError
from databus.sources.mysql import events as be
from databus.sources.mysql import parse_mysql_url
from databus.sources.mysql.connection import BinlogStream, binary_logs
from tests.support.mariadb import MariaDB
from tests.support.wait import wait_until


def _events(m: MariaDB, file: str, pos: int, until_xids: int) -> list[tuple[be.EventHeader, memoryview]]:
    stream = BinlogStream(parse_mysql_url(m.url), server_id=99, file=file, pos=pos,
                          read_timeout=10)
    out = []
    xids = 0
    try:
        while xids < until_xids:
            raw = stream.read()
            assert raw is not None
            h, body = be.parse_header(raw, stream.checksum)
            out.append((h, body))
            xids += h.type == be.EventType.XID
    finally:
        stream.close()
    return out


def test_a_transaction_arrives_framed_and_in_order(server: MariaDB) -> None:
    file = binary_logs(parse_mysql_url(server.url))[0][0]
    server.execute("CREATE DATABASE shop", "CREATE TABLE shop.t (id INT PRIMARY KEY, v TEXT)")
    server.execute("BEGIN", "INSERT INTO shop.t VALUES (1, 'a'), (2, 'b')",
                   "UPDATE shop.t SET v = 'c' WHERE id = 1", "DELETE FROM shop.t WHERE id = 2",
                   "COMMIT")
    evs = _events(server, file, 4, until_xids=1)
    types = [h.type for h, _ in evs]
    assert types[0] == be.EventType.ROTATE and be.parse_rotate(evs[0][1]).file == file
    assert be.EventType.FORMAT_DESCRIPTION in types
    queries = [be.parse_query(b)[1] for h, b in evs if h.type == be.EventType.QUERY]
    assert any("CREATE TABLE" in q for q in queries)
    txn = types[max(i for i, t in enumerate(types) if t == be.EventType.MARIADB_GTID):]
    assert txn[-1] == be.EventType.XID
    rows = [t for t in txn if t in be.ROW_EVENTS]
    assert [be.EventType(t).name for t in rows] == ["WRITE_ROWS_V1", "UPDATE_ROWS_V1",
                                                     "DELETE_ROWS_V1"]
    maps = [be.parse_table_map(b) for h, b in evs if h.type == be.EventType.TABLE_MAP]
    assert {(tm.schema, tm.table) for tm in maps} == {("shop", "t")}
    assert maps[0].column_types == bytes([3, 252])  # LONG, BLOB (TEXT)
    positions = [h.next_pos for h, _ in evs if h.next_pos]
    assert positions == sorted(positions)


def test_next_event_gives_what_read_and_parse_header_give(server: MariaDB) -> None:
    """The C cutter (``BinlogStream.next_event``) on a real dump: the same headers and
    bodies as the Python path, an event larger than the stream's receive chunk (cut by
    the Python path) and many small ones (cut in C) among them."""
    file = binary_logs(parse_mysql_url(server.url))[0][0]
    server.execute("CREATE DATABASE n", "CREATE TABLE n.t (id INT PRIMARY KEY, v LONGTEXT)")
    server.execute("INSERT INTO n.t VALUES (1, REPEAT('x', 3000000))")
    for k in range(2, 40):
        server.execute("BEGIN", f"INSERT INTO n.t VALUES ({k}, 'v{k}')",
                       f"UPDATE n.t SET v = 'w{k}' WHERE id = {k}", "COMMIT")
    want = [(h, bytes(b)) for h, b in _events(server, file, 4, until_xids=39)]
    stream = BinlogStream(parse_mysql_url(server.url), server_id=96, file=file, pos=4,
                          read_timeout=10)
    real = stream._frames
    cuts: list[int] = []

    def counting(*args: object) -> object:
        out = real(*args)
        cuts.append(len(out[0]))
        return out

    stream._frames = counting if real is not None else None
    got = []
    try:
        while len(got) < len(want):
            nxt = stream.next_event()
            assert nxt is not None
            got.append((nxt[0], bytes(nxt[1])))
    finally:
        stream.close()
    assert got == want
    assert max(h.size for h, _ in got) > 3_000_000
    if real is not None:
        assert sum(cuts) > len(want) // 2, "the C cutter took few events"


def test_crc_damage_is_detected(server: MariaDB) -> None:
    file = binary_logs(parse_mysql_url(server.url))[0][0]
    server.execute("CREATE DATABASE d", "CREATE TABLE d.t (id INT PRIMARY KEY)",
                   "INSERT INTO d.t VALUES (1)")
    with BinlogStream(parse_mysql_url(server.url), server_id=98, file=file, pos=4) as stream:
        assert stream.checksum
        raws = [stream.read() for _ in range(6)]
    raw = bytearray(raws[-1] or b"")
    raw[20] ^= 0xFF
    with pytest.raises(Exception, match="CRC32"):
        be.parse_header(bytes(raw), True)


def test_purged_position_is_a_clear_error(server: MariaDB) -> None:
    url = parse_mysql_url(server.url)
    old = binary_logs(url)[0][0]
    server.execute("CREATE DATABASE p", "FLUSH BINARY LOGS", "FLUSH BINARY LOGS")
    def purged() -> bool:  # a file goes once its binlog checkpoint passed
        server.execute(f"PURGE BINARY LOGS TO '{binary_logs(url)[-1][0]}'")
        return binary_logs(url)[0][0] != old

    wait_until(purged, 30, "the server to purge the old binlog", interval=0.2)
    with BinlogStream(url, server_id=97, file=old, pos=4) as stream, \
            pytest.raises(SourcePositionLostError, match="gone"):
        for _ in range(5):
            stream.read()
