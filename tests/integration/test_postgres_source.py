"""The PostgreSQL source against a private PostgreSQL (wal_level=logical): the type matrix
(every value equal to the text SELECT returns), TOAST, schema versions, truncate,
restart after an SCN, the slot following acknowledgements only, and the start-up
checks, each a one-line ConfigError."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from databus.core import event as ev
from databus.core.errors import ConfigError, SourcePositionLostError
from databus.core.schema import MetadataCodec
from databus.core.window import Window
from databus.sources import open_source
from databus.sources.postgres import fastpath
from databus.sources.postgres.connection import SESSION_SETTINGS
from databus.sources.postgres.source import PostgresSource
from tests.support.postgres import PostgreSQL
from tests.support.sources import source_config

META = MetadataCodec()

MATRIX_COLUMNS = {
    "c_int2": "smallint", "c_int4": "integer", "c_int8": "bigint", "c_num": "numeric",
    "c_num_ps": "numeric(12,3)", "c_real": "real", "c_double": "double precision",
    "c_text": "text", "c_varchar": "varchar(20)", "c_char": "char(5)", "c_bytea": "bytea",
    "c_bool": "boolean", "c_date": "date", "c_time": "time", "c_timetz": "timetz",
    "c_ts": "timestamp", "c_tstz": "timestamptz", "c_interval": "interval", "c_uuid": "uuid",
    "c_json": "json", "c_jsonb": "jsonb", "c_intarr": "integer[]", "c_textarr": "text[]",
    "c_enum": "mood", "c_domain": "posint", "c_inet": "inet", "c_cidr": "cidr",
    "c_macaddr": "macaddr", "c_money": "money", "c_bit": "bit(4)", "c_varbit": "varbit",
    "c_tsvector": "tsvector", "c_big": "text",
}

MATRIX_ROWS: list[dict[str, str | None]] = [
    {"c_int2": "-32768", "c_int4": "2147483647", "c_int8": "-9223372036854775808",
     "c_num": "123456789012345678901234567890.123456789012345", "c_num_ps": "-123456789.125",
     "c_real": "NaN", "c_double": "Infinity", "c_text": "it's \"quoted\" \\ ünïcødé ✓",
     "c_varchar": "short", "c_char": "ab", "c_bytea": "\\x00ff10", "c_bool": "true",
     "c_date": "infinity", "c_time": "24:00:00", "c_timetz": "23:59:59.999999+14",
     "c_ts": "-infinity", "c_tstz": "infinity", "c_interval": "1 year 2 mons -3 days 04:05:06.789",
     "c_uuid": "a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11", "c_json": '{"a": [1, 2.50, "x"],  "b":null}',
     "c_jsonb": '{"b": [1, 2.50], "a": {"c": "ü"}}', "c_intarr": "{{1,2},{3,NULL}}",
     "c_textarr": '{"a",NULL,"b c","\\""}', "c_enum": "happy", "c_domain": "7",
     "c_inet": "::1", "c_cidr": "10.0.0.0/8", "c_macaddr": "08:00:2b:01:02:03",
     "c_money": "-12.34", "c_bit": "1010", "c_varbit": "101", "c_tsvector": "a fat:2 cat",
     "c_big": None},
    {k: None for k in MATRIX_COLUMNS},
    {"c_int2": "0", "c_int4": "-1", "c_int8": "9223372036854775807", "c_num": "NaN",
     "c_num_ps": "0.5", "c_real": "-Infinity", "c_double": "1e-300", "c_text": "",
     "c_varchar": "", "c_char": "abcde", "c_bytea": "\\x", "c_bool": "false",
     "c_date": "4713-01-01 BC", "c_time": "00:00:00.000001", "c_timetz": "12:00:00-08",
     "c_ts": "2024-02-29 12:34:56.789", "c_tstz": "1999-12-31 23:59:59.5+05",
     "c_interval": "-178000000 years", "c_uuid": "00000000-0000-0000-0000-000000000000",
     "c_json": "[]", "c_jsonb": "null", "c_intarr": "{}", "c_textarr": "{NULL}",
     "c_enum": "sad", "c_domain": "1", "c_inet": "192.168.1.5/24", "c_cidr": "::/0",
     "c_macaddr": "ff:ff:ff:ff:ff:ff", "c_money": "1000000.99", "c_bit": "0000",
     "c_varbit": "", "c_tsvector": "", "c_big": "x" * 200_000},
    {"c_int2": "1", "c_num": "-Infinity", "c_real": "3.4028235e+38", "c_double": "-0",
     "c_text": "line\nbreak\ttab", "c_date": "2000-01-01",
     "c_tstz": "-infinity", "c_interval": "00:00:00", "c_json": "1.000",
     "c_jsonb": "[1.000, 1e3]", "c_textarr": "{{a,b},{c,NULL}}", "c_bytea": "\\x" + "ab" * 5000},
]


def _session(conn: psycopg.Connection[Any]) -> None:
    for k, v in SESSION_SETTINGS.items():
        conn.execute(f"SET {k} = '{v}'")


@pytest.fixture()
def db(postgres: PostgreSQL) -> Iterator[str]:
    with postgres.fresh_database("pgsrc") as url:
        name = url.rsplit("/", 1)[1]
        yield name
        postgres.drop_slots(name)  # a database with a slot cannot be dropped


@pytest.fixture()
def conn(postgres: PostgreSQL, db: str) -> Iterator[psycopg.Connection[Any]]:
    c = connect(postgres, db)
    yield c
    c.close()


def connect(postgres: PostgreSQL, db: str) -> psycopg.Connection[Any]:
    conn = psycopg.connect(f"host=127.0.0.1 port={postgres.port} user=postgres dbname={db}",
                           autocommit=True)
    _session(conn)
    return conn


def make_source(postgres: PostgreSQL, db: str, tables: list[str] | None = None, *,
                user: str = "postgres", name: str = "t", open_it: bool = True,
                state_dir: Path | None = None, **fields: Any) -> PostgresSource:
    fields.setdefault("snapshot_mode", "no_data")
    fields.setdefault("create_publication", True)
    cfg = source_config(postgres.source_url(db, user), tables or [r"public\..*"], **fields)
    src = open_source(cfg, relay_name=name, state_dir=state_dir)
    assert isinstance(src, PostgresSource)
    if open_it:
        src.open()
    return src


def drain(src: PostgresSource, after: int, want: int, *, timeout: float = 30.0
          ) -> list[Window]:
    """Read until ``want`` windows with events came (empty progress windows dropped)."""

    stop = threading.Event()
    out: list[Window] = []
    deadline = time.monotonic() + timeout
    while sum(1 for w in out if w.count) < want:
        assert time.monotonic() < deadline, f"got {len(out)} windows of {want}"
        for w in src.read(after, stop, 0.5):
            assert w.scn > after
            after = w.scn
            out.append(w)
    return [w for w in out if w.count]


def rows_of(src: PostgresSource, w: Window) -> list[tuple[str, dict[str, Any] | None,
                                                        dict[str, Any] | None]]:
    """(op letter, row, before image) of each event of a window."""
    out = []
    for e in ev.iter_events(w.events):
        assert e.scn == w.scn
        s = src.registry().get(e.schema_id)
        row = s.decode(e.payload) if e.payload else None
        meta = META.decode(e.metadata) if e.metadata else {}
        before = s.decode(meta["before"]) if meta.get("before") else None
        out.append((e.op.letter, row, before))
    return out


def _as_text(v: Any) -> str | None:
    if v is None or isinstance(v, str):
        return v
    if isinstance(v, bool):
        return "t" if v else "f"
    if isinstance(v, bytes):
        return "\\x" + v.hex()
    return str(v)


def assert_same(row: dict[str, Any], texts: dict[str, str | None]) -> None:
    """Each captured value equals the server's text of it (floats compared as numbers)."""
    for col, want in texts.items():
        got = row[col]
        if isinstance(got, float) and want is not None:
            w = float(want)
            assert (math.isnan(got) and math.isnan(w)) or got == w, (col, got, want)
            continue
        assert _as_text(got) == want, (col, got, want)


def select_texts(conn: psycopg.Connection[Any], table: str, columns: list[str]
                 ) -> dict[int, dict[str, str | None]]:
    """id -> column -> the text SELECT gives (the type's output function)."""
    sel = ", ".join(f"CASE WHEN {c} IS NULL THEN NULL ELSE concat({c}) END" for c in columns)
    rows = conn.execute(f"SELECT id, {sel} FROM {table} ORDER BY id").fetchall()
    return {r[0]: dict(zip(columns, r[1:], strict=True)) for r in rows}


def _create_matrix(conn: psycopg.Connection[Any], identity: str) -> None:
    conn.execute("CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy')")
    conn.execute("CREATE DOMAIN posint AS integer CHECK (VALUE > 0)")
    cols = ", ".join(f"{c} {t}" for c, t in MATRIX_COLUMNS.items())
    conn.execute(f"CREATE TABLE matrix (id integer PRIMARY KEY, {cols})")
    conn.execute("ALTER TABLE matrix ALTER c_big SET STORAGE EXTERNAL")
    conn.execute(f"ALTER TABLE matrix REPLICA IDENTITY {identity}")


def test_type_matrix_inserts_updates_deletes_equal_select_text(postgres: PostgreSQL, db: str,
        conn: psycopg.Connection[Any]) -> None:
    _create_matrix(conn, "FULL")
    src = make_source(postgres, db)
    stop = threading.Event()
    start = -1
    assert src.read(start, stop, 0.2) == []  # creates the slot: changes from here on
    cols = list(MATRIX_COLUMNS)
    with conn.transaction():
        for i, values in enumerate(MATRIX_ROWS, 1):
            given = {k: v for k, v in values.items() if k in MATRIX_COLUMNS}
            names = ", ".join(["id", *given])
            marks = ", ".join(["%s"] * (len(given) + 1))
            conn.execute(f"INSERT INTO matrix ({names}) VALUES ({marks})", [i, *given.values()])
    inserted = select_texts(conn, "matrix", cols)
    # every column changed but the TOASTed one: carried from the old row (FULL)
    conn.execute("UPDATE matrix SET c_int4 = coalesce(c_int4, 0) - 1, c_text = 'u' || id,"
                 " c_num = c_num * 2, c_tstz = '2030-01-01 00:00:00+00', c_intarr ="
                 " '{{9,NULL},{NULL,8}}'")
    updated = select_texts(conn, "matrix", cols)
    conn.execute("DELETE FROM matrix")

    windows = drain(src, start, 3)
    ins, upd, dele = (rows_of(src, w) for w in windows)
    assert [op for op, _, _ in ins] == ["c"] * 4
    assert [op for op, _, _ in upd] == ["u"] * 4
    assert [op for op, _, _ in dele] == ["d"] * 4
    for op_rows, images in ((ins, inserted), (upd, updated), (dele, updated)):
        for _, row, _ in op_rows:
            assert row is not None
            assert_same(row, images[row["id"]])
    for _, row, before in upd:  # REPLICA IDENTITY FULL: the whole old row
        assert before is not None and row is not None
        assert_same(before, inserted[row["id"]])
    (matrix,) = [s for s in src.sources() if s.name == "public.matrix"]
    schema = src.registry().latest(matrix.id)
    sql_types = {f["name"]: f.get("sql_type") for f in schema.avro["fields"]}
    assert sql_types["c_num_ps"] == "numeric(12,3)" and sql_types["c_enum"] == "mood"
    assert schema.key_columns == ("id",)
    src.close()


@pytest.mark.skipif(not fastpath.available(), reason="the C extension is not built")
def test_compiled_and_python_decoding_give_the_same_bytes(postgres: PostgreSQL, db: str,
        conn: psycopg.Connection[Any]) -> None:
    """The same WAL read twice from one slot, through the C codec and through the Python
    path: the same windows, byte for byte. Covers the type matrix (inserts, updates with
    before images and a carried TOAST value, deletes), JSON keys of every kind with
    characters JSON escapes, an integer key set to NULL-free values, a key change, a table
    keyed by row index, a fetched TOAST value (Python rows among C rows) and TRUNCATE."""
    _create_matrix(conn, "FULL")
    conn.execute("CREATE TABLE keyed (k1 text, k2 boolean, k3 float8, k4 bytea, k5 bigint,"
                 " v text, PRIMARY KEY (k1, k2, k3, k4, k5))")
    conn.execute("CREATE TABLE nokey (a int, b text)")
    conn.execute("ALTER TABLE nokey REPLICA IDENTITY FULL")
    conn.execute("CREATE TABLE docs (id int PRIMARY KEY, title text, body text)")
    conn.execute("ALTER TABLE docs ALTER body SET STORAGE EXTERNAL")
    cfg = source_config(postgres.source_url(db), [r"public\..*"], snapshot_mode="no_data",
                        create_publication=True)
    first = PostgresSource(cfg, name="twice", compiled=True)
    first.open()
    stop = threading.Event()
    assert first.read(-1, stop, 0.2) == []  # the slot: changes from here on
    in_c = []
    assert first._capture is not None
    rows = first._capture.decoder.rows
    c_change = rows.change
    rows.change = (  # type: ignore[method-assign]
        lambda payload, skip: in_c.append(c_change(payload, skip)) or in_c[-1])
    with conn.transaction():
        for i, values in enumerate(MATRIX_ROWS, 1):
            names = ", ".join(["id", *values])
            marks = ", ".join(["%s"] * (len(values) + 1))
            conn.execute(f"INSERT INTO matrix ({names}) VALUES ({marks})", [i, *values.values()])
        conn.execute("INSERT INTO docs VALUES (1, 'a', repeat('z', 100000))")
    conn.execute("UPDATE matrix SET c_int4 = coalesce(c_int4, 0) - 1, c_text = 'u' || id")
    odd = 'a"b\\c\n\x01\x1f\x7f ü ✓ \t/'
    with conn.transaction():
        conn.execute("INSERT INTO keyed VALUES (%s, true, 1.5, '\\xDEADbeef', -7, 'x'),"
                     " ('', false, 'NaN', '\\x', 9223372036854775807, NULL),"
                     " ('z', true, '-Infinity', '\\x00', 0, 'y'),"
                     " ('w', false, 1e300, '\\x01', -1, 'v'),"
                     " ('q', true, 0.1, '\\x02', 2, 'q')", [odd])
        conn.execute("UPDATE keyed SET v = 'changed' WHERE k1 = %s", [odd])
        conn.execute("UPDATE keyed SET k5 = 5 WHERE k1 = 'z'")  # a key change
        conn.execute("UPDATE docs SET title = 'b'")  # TOAST fetched: a Python row
        conn.execute("INSERT INTO nokey VALUES (1, 'a'), (1, 'a'), (NULL, NULL)")
        conn.execute("UPDATE nokey SET b = 'c' WHERE b = 'a'")
        conn.execute("DELETE FROM keyed WHERE k1 = ''")
    conn.execute("TRUNCATE nokey, keyed")
    conn.execute("DELETE FROM matrix")
    compiled = [(w.scn, w.count, w.events) for w in drain(first, -1, 5)]
    first.close()  # never acknowledged: the slot gives the same changes again
    # Python decoded the two updates with an unchanged TOAST value (carried, fetched)
    assert in_c.count(1) == 25 and in_c.count(-1) == 2
    second = PostgresSource(cfg, name="twice", compiled=False)
    second.open()
    python = [(w.scn, w.count, w.events) for w in drain(second, -1, 5)]
    second.close()
    assert [(scn, n) for scn, n, _ in compiled] == [(scn, n) for scn, n, _ in python]
    assert compiled == python
    assert sum(n for _, n, _ in compiled) == 4 + 1 + 4 + 5 + 1 + 2 + 1 + 3 + 2 + 1 + 2 + 4


def test_unchanged_toast_is_fetched_with_replica_identity_default(postgres: PostgreSQL, db: str,
        conn: psycopg.Connection[Any]) -> None:
    conn.execute("CREATE TABLE docs (id int PRIMARY KEY, title text, body text)")
    conn.execute("ALTER TABLE docs ALTER body SET STORAGE EXTERNAL")
    src = make_source(postgres, db)
    stop = threading.Event()
    assert src.read(-1, stop, 0.2) == []
    big = "y" * 100_000
    conn.execute("INSERT INTO docs VALUES (1, 'a', %s)", [big])
    windows = drain(src, -1, 1)
    conn.execute("UPDATE docs SET title = 'b' WHERE id = 1")
    windows += drain(src, windows[-1].scn, 1)
    (_, row, before), = rows_of(src, windows[-1])
    assert row == {"id": 1, "title": "b", "body": big} and before is None
    assert src.stats()["toast_fetched_total"] == 1
    src.close()


def test_new_column_is_a_new_version_and_truncate_an_event(postgres: PostgreSQL, db: str,
        conn: psycopg.Connection[Any]) -> None:
    conn.execute("CREATE TABLE a (id bigint PRIMARY KEY, v text)")
    conn.execute("CREATE TABLE b (k1 text, k2 int, PRIMARY KEY (k1, k2))")
    src = make_source(postgres, db)
    stop = threading.Event()
    assert src.read(-1, stop, 0.2) == []
    conn.execute("INSERT INTO a VALUES (1, 'x')")
    conn.execute("ALTER TABLE a ADD COLUMN w int DEFAULT 5")
    conn.execute("INSERT INTO a VALUES (2, 'y', 6)")
    conn.execute("ALTER TABLE a DROP COLUMN v")
    with conn.transaction():
        conn.execute("INSERT INTO b VALUES ('p', 1)")
        conn.execute("UPDATE b SET k2 = 2")  # a key change: delete then insert
        conn.execute("TRUNCATE a, b")
    w1, w2, w3 = drain(src, -1, 3)
    assert rows_of(src, w1) == [("c", {"id": 1, "v": "x"}, None)]
    assert rows_of(src, w2) == [("c", {"id": 2, "v": "y", "w": 6}, None)]
    got = rows_of(src, w3)
    assert [op for op, _, _ in got] == ["c", "d", "c", "t", "t"]
    assert got[2][1] == {"k1": "p", "k2": 2}
    a = next(s.id for s in src.sources() if s.name == "public.a")
    assert [s.version for s in src.registry().versions(a)] == [1, 2, 3]
    assert [e.key for e in ev.iter_events(w3.events)][:3] == [b'["p",1]', b'["p",1]',
                                                              b'["p",2]']
    src.close()


def test_restart_after_an_scn_and_the_slot_follows_acknowledgements(postgres: PostgreSQL, db: str,
        conn: psycopg.Connection[Any], tmp_path: Path) -> None:
    conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
    src = make_source(postgres, db, name="restart", state_dir=tmp_path)
    stop = threading.Event()
    assert src.read(-1, stop, 0.2) == []
    for i in range(6):
        conn.execute("INSERT INTO t VALUES (%s)", [i])
    windows = drain(src, -1, 6)
    assert [w.scn for w in windows] == sorted({w.scn for w in windows})

    def confirmed() -> int:
        return int(conn.execute("SELECT (confirmed_flush_lsn - '0/0')::bigint FROM"
                                " pg_replication_slots WHERE slot_name = 'databus_restart'"
                                ).fetchone()[0])  # type: ignore[index]

    before = confirmed()
    assert before < windows[0].scn  # nothing acknowledged: the slot did not move
    src.acknowledge(windows[2].scn)
    src.read(windows[-1].scn, stop, 0.3)  # the next read tells the server
    src.close()
    assert confirmed() == windows[2].scn
    # a new process resumes after window 3: windows 4..6, nothing else
    again = make_source(postgres, db, name="restart", state_dir=tmp_path)
    got = drain(again, windows[2].scn, 3)
    assert [w.events for w in got] == [w.events for w in windows[3:]]
    again.close()
    # a relay that resumes before what it acknowledged lost windows: said, never skipped
    third = make_source(postgres, db, name="restart", state_dir=tmp_path)
    with pytest.raises(SourcePositionLostError, match="the changes between are gone"):
        third.read(windows[1].scn, stop, 0.2)
    third.close()


def test_idle_table_progress_windows_move_the_position(postgres: PostgreSQL, db: str,
        conn: psycopg.Connection[Any]) -> None:
    conn.execute("CREATE TABLE quiet (id int PRIMARY KEY)")
    conn.execute("CREATE TABLE busy (id int PRIMARY KEY)")
    src = make_source(postgres, db, [r"public\.quiet"], progress_interval=0.5)
    stop = threading.Event()
    assert src.read(-1, stop, 0.2) == []
    for i in range(20):
        conn.execute("INSERT INTO busy VALUES (%s)", [i])
    lsn = int(conn.execute("SELECT (pg_current_wal_lsn() - '0/0')::bigint"
                           ).fetchone()[0])  # type: ignore[index]

    deadline = time.monotonic() + 60
    after = -1
    while after < lsn:
        assert time.monotonic() < deadline, "no progress window reached the busy table's WAL"
        for w in src.read(after, stop, 0.5):
            assert w.count == 0
            after = w.scn
    src.close()


# -- start-up checks: one line each ---------------------------------------------------


def _refused(src: PostgresSource, match: str) -> str:
    with pytest.raises(ConfigError, match=match) as info:
        src.open()
    text = str(info.value)
    assert "\n" not in text
    src.close()
    return text


def test_checks_table_without_key_nothing_identity_and_missing_publication(postgres: PostgreSQL, db: str,
        conn: psycopg.Connection[Any]) -> None:
    conn.execute("CREATE TABLE nokey (a int)")
    _refused(make_source(postgres, db, open_it=False),
             "no primary key and REPLICA IDENTITY DEFAULT.*REPLICA IDENTITY FULL")
    conn.execute("ALTER TABLE nokey REPLICA IDENTITY NOTHING")
    _refused(make_source(postgres, db, open_it=False), "REPLICA IDENTITY NOTHING")
    conn.execute("ALTER TABLE nokey REPLICA IDENTITY FULL")
    text = _refused(make_source(postgres, db, open_it=False, create_publication=False),
                    "publication databus_t does not exist")
    assert 'CREATE PUBLICATION "databus_t" FOR TABLE "public"."nokey"' in text
    make_source(postgres, db).close()  # create_publication: created
    conn.execute("CREATE TABLE later (id int PRIMARY KEY)")
    _refused(make_source(postgres, db, open_it=False, create_publication=False),
             'does not cover public.later: run ALTER PUBLICATION "databus_t" ADD TABLE')
    _refused(make_source(postgres, db, [r"nope\..*"], open_it=False), "no table matches")


def test_checks_role_without_replication_and_slot_in_use(postgres: PostgreSQL, db: str,
        conn: psycopg.Connection[Any]) -> None:
    conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
    conn.execute("DROP ROLE IF EXISTS norepl")
    conn.execute("CREATE ROLE norepl LOGIN")
    try:
        _refused(make_source(postgres, db, user="norepl", open_it=False),
                 'role norepl may not replicate: run ALTER ROLE "norepl" REPLICATION')
    finally:
        conn.execute("DROP ROLE norepl")
    first = make_source(postgres, db, name="inuse")
    first.read(-1, threading.Event(), 0.2)  # holds the slot
    try:
        second = make_source(postgres, db, name="inuse", open_it=False)
        second._slot.wait = 0.5
        _refused(second, "replication slot databus_inuse is in use by another process")
    finally:
        first.close()


def test_checks_wal_level_replica(tmp_path: Any) -> None:
    settings = {"wal_level": "replica", "fsync": "off", "max_connections": "20"}
    with PostgreSQL(settings=settings) as server:
        server.execute("CREATE TABLE t (id int PRIMARY KEY)")
        src = make_source(server, "postgres", open_it=False)
        _refused(src, "wal_level is replica; logical decoding needs wal_level=logical")


# -- the initial snapshot ---------------------------------------------------------------


def test_initial_snapshot_meets_the_stream_at_the_slot_point(
        postgres: PostgreSQL, db: str, conn: psycopg.Connection[Any], tmp_path: Path) -> None:
    conn.execute("CREATE TABLE a (id int PRIMARY KEY, v text)")
    conn.execute("CREATE TABLE b (k text PRIMARY KEY, n numeric)")
    conn.execute("CREATE TABLE empty (id int PRIMARY KEY)")
    conn.execute("INSERT INTO a SELECT g, 'v' || g FROM generate_series(1, 25) g")
    conn.execute("INSERT INTO b VALUES ('x', 1.50), ('y', NULL)")
    src = make_source(postgres, db, name="snap", state_dir=tmp_path, snapshot_mode="initial",
                      snapshot_chunk_size=10)
    stop = threading.Event()
    first = src.read(-1, stop, 1.0)  # creates the slot, exports its snapshot: chunk 1
    assert len(first) == 1 and first[0].count == 10
    # committed after the slot's point: in the stream, not the snapshot
    conn.execute("UPDATE a SET v = 'new' WHERE id = 1")
    conn.execute("INSERT INTO b VALUES ('z', 3)")
    windows = first + drain(src, first[0].scn, 5)
    snap, stream = windows[:4], windows[4:]
    events = [e for w in snap for e in ev.iter_events(w.events)]
    assert all(e.op == ev.Op.READ and e.is_snapshot for e in events)
    rows = sorted((src.registry().get(e.schema_id).name, e.key) for e in events)
    assert rows == sorted([("public.a", i) for i in range(1, 26)]
                          + [("public.b", b'["x"]'), ("public.b", b'["y"]')])
    assert [w.scn for w in windows] == sorted({w.scn for w in windows})
    confirmed = conn.execute("SELECT (confirmed_flush_lsn - '0/0')::bigint FROM"
                             " pg_replication_slots WHERE slot_name = 'databus_snap'"
                             ).fetchone()
    assert confirmed is not None and snap[-1].scn == confirmed[0] < stream[0].scn
    assert [r[:2] for w in stream for r in rows_of(src, w)] == [
        ("u", {"id": 1, "v": "new"}), ("c", {"k": "z", "n": "3"})]
    src.close()
    # a relay that lost the end of its snapshot cannot resume it: said, never skipped
    again = make_source(postgres, db, name="snap", state_dir=tmp_path,
                        snapshot_mode="initial", snapshot_chunk_size=10)
    with pytest.raises(SourcePositionLostError, match="initial snapshot was interrupted"):
        again.read(snap[1].scn, stop, 0.5)
    again.close()


def test_initial_only_stops_after_the_snapshot(postgres: PostgreSQL, db: str,
                                               conn: psycopg.Connection[Any]) -> None:
    conn.execute("CREATE TABLE a (id int PRIMARY KEY)")
    conn.execute("INSERT INTO a VALUES (1), (2)")
    src = make_source(postgres, db, name="only", snapshot_mode="initial_only")
    stop = threading.Event()
    (w,) = src.read(-1, stop, 1.0)
    assert w.count == 2
    conn.execute("INSERT INTO a VALUES (3)")
    assert src.read(w.scn, stop, 0.3) == [] and src.read(w.scn, stop, 0.3) == []
    src.close()


def test_pgoutput_damaged_or_unknown_messages_stop_capture_loudly() -> None:
    from databus.core.errors import CorruptEventError, UnsupportedEventError
    from databus.sources.postgres import pgoutput as po

    insert = b"I" + (16384).to_bytes(4, "big") + b"N" + (2).to_bytes(2, "big") \
        + b"t" + (2).to_bytes(4, "big") + b"42" + b"n"
    assert po.decode(insert) == po.Insert(16384, [b"42", None])
    for cut in range(1, len(insert) - 1):
        with pytest.raises(CorruptEventError):
            po.decode(insert[:cut])
    with pytest.raises(CorruptEventError):
        po.decode(insert[:-1] + b"x")  # a column kind that does not exist
    with pytest.raises(UnsupportedEventError, match="nothing was skipped"):
        po.decode(b"P" + bytes(25))  # protocol 3's Prepare: never asked for
    assert po.decode(b"S" + (7).to_bytes(4, "big") + b"\x01") == po.StreamStart(7, True)
    assert po.decode(b"A" + (7).to_bytes(4, "big") + (9).to_bytes(4, "big")) \
        == po.StreamAbort(7, 9)


@pytest.mark.skipif(not fastpath.available(), reason="the C extension is not built")
def test_compiled_decoder_hands_damaged_changes_back_to_python() -> None:
    """Every cut or damaged change message: C declines (-1) and adds no row, so the Python
    decoder raises its precise error; a relation it was not told of is declined too."""
    from databus.sources.postgres.types import TableVersion, version_schema

    schema = version_schema("public", "t", ["id", "v"], [23, 25], ["integer", "text"],
                            ["id"], 1)
    version = TableVersion(schema, [23, 25], [0])
    rows = fastpath.CRows()
    rows.relate(16384, version)
    insert = b"I" + (16384).to_bytes(4, "big") + b"N" + (2).to_bytes(2, "big") \
        + b"t" + (2).to_bytes(4, "big") + b"42" + b"n"
    for cut in range(0, len(insert) - 1):
        assert rows.change(insert[:cut] or b"I", 0) == -1
    assert rows.change(insert[:-1] + b"x", 0) == -1
    assert rows.change(insert.replace(b"42", b"4x"), 0) == -1  # not an integer
    assert rows.change(b"I" + (16385).to_bytes(4, "big") + insert[5:], 0) == -1
    assert rows.pending == 0
    assert rows.change(insert, 0) == 1
    py = fastpath.PyRows()
    after, payload = version.typed([b"42", None])
    py.add(version, ev.Op.INSERT, version.key(after, 0), payload, None)
    assert rows.commit(99, 5, b"7", None) == py.commit(99, 5, b"7", None)


@pytest.mark.skipif(not fastpath.available(), reason="the C extension is not built")
def test_compiled_and_python_rows_agree_on_random_messages() -> None:
    """Random Insert/Update/Delete messages (every column kind, every key mode, NULLs,
    text JSON must escape, float and integer extremes, key changes, old tuples of both
    kinds) through the C decoder and the Python path: the same window bytes."""
    import random

    from databus.sources.postgres import pgoutput as po
    from databus.sources.postgres.connection import SqlSession, parse_pg_url
    from databus.sources.postgres.decoder import DECODER_STATS, Decoder, Rel, Txn
    from databus.sources.postgres.streams import Budget
    from databus.sources.postgres.types import TableVersion, version_schema

    rng = random.Random(20)
    oids = {"int4": 23, "int8": 20, "text": 25, "bool": 16, "float8": 701, "bytea": 17,
            "numeric": 1700, "int2": 21}
    tables = {  # name: (columns, key columns)
        "ikey": (["int4", "text", "float8", "bytea", "bool", "numeric"], [0]),
        "ckey": (["text", "bool", "float8", "bytea", "int8", "int2", "text"], [0, 1, 2, 3, 4]),
        "nokey": (["text", "int4", "float8"], []),
    }
    texts = ["", "a", 'q"uo\\te', "ü ✓ 山田", "line\nbreak\ttab\r\b\f", "\x01\x1f\x7f", "/"]
    floats = ["NaN", "Infinity", "-Infinity", "0", "-0", "0.1", "1e-300",
              "1.7976931348623157e+308", "3.14159"]

    def value(kind: str) -> bytes | None:
        if rng.random() < 0.15:
            return None
        if kind in ("int4", "int8", "int2"):
            lim = {"int2": 2**15, "int4": 2**31, "int8": 2**63}[kind]
            return str(rng.choice([-lim, lim - 1, 0, -1, rng.randrange(-lim, lim)])).encode()
        if kind in ("text", "numeric"):
            return rng.choice(texts).encode() if kind == "text" else b"-12.50"
        if kind == "bool":
            return rng.choice([b"t", b"f"])
        if kind == "float8":
            return rng.choice(floats).encode()
        return b"\\x" + bytes(rng.randrange(256) for _ in range(rng.randrange(4))).hex().encode()

    def tuple_data(vals: list[bytes | None]) -> bytes:
        out = len(vals).to_bytes(2, "big")
        for v in vals:
            out += b"n" if v is None else b"t" + len(v).to_bytes(4, "big") + v
        return out

    def make(compiled: bool) -> Decoder:
        versions: dict[int, TableVersion] = {}
        src = Decoder(compiled=compiled, version_of=lambda rel: versions[rel.oid],
                      wanted=lambda _name: True, signal_table="databus.signals",
                      sql=SqlSession(parse_pg_url("postgresql://u@h/d")), snaps=None,
                      stats=dict.fromkeys(DECODER_STATS, 0.0), budget=Budget(1 << 20),
                      spill_dir=None)
        for rel, (name, (kinds, keys)) in enumerate(tables.items(), 100):
            names = [f"c{i}" for i in range(len(kinds))]
            type_oids = [oids[k] for k in kinds]
            schema = version_schema("public", name, names, type_oids, kinds,
                                    [names[i] for i in keys], 1)
            version = TableVersion(schema, type_oids, keys)
            cols = tuple(po.Column(1 if i in keys else 0, n, t, -1)
                         for i, (n, t) in enumerate(zip(names, type_oids, strict=True)))
            msg = po.Relation(rel, "public", name, "d" if keys else "f", cols)
            versions[rel] = version
            src.relation(msg)
            assert src.rels[rel] == Rel(msg, version)
        return src

    messages: list[bytes] = []
    for _ in range(3000):
        rel = rng.randrange(100, 103)
        kinds, keys = list(tables.values())[rel - 100]
        new = [value(k) for k in kinds]
        for k in keys:  # key columns are never NULL
            while new[k] is None:
                new[k] = value(kinds[k])
        head = rel.to_bytes(4, "big")
        op = rng.choice("IUUD")
        if op == "I":
            messages.append(b"I" + head + b"N" + tuple_data(new))
        elif op == "D":
            kind = b"O" if not keys or rng.random() < 0.5 else b"K"
            old = new if kind == b"O" else [v if i in keys else None for i, v in enumerate(new)]
            messages.append(b"D" + head + kind + tuple_data(old))
        else:
            old = [value(k) for k in kinds]
            for k in keys:
                old[k] = new[k] if rng.random() < 0.5 else (old[k] or new[k])
            shape = rng.choice([b"", b"K", b"O"]) if keys else rng.choice([b"", b"O"])
            if shape == b"K":
                old = [v if i in keys else None for i, v in enumerate(old)]
            messages.append(b"U" + head + (shape + tuple_data(old) if shape else b"")
                            + b"N" + tuple_data(new))
    windows = []
    in_c = 0
    for compiled in (True, False):
        src = make(compiled)
        got = []
        for t in range(0, len(messages), 100):
            src.txn = Txn(1000 + t, 5)
            for m in messages[t:t + 100]:
                if compiled and src.rows.change(m, 0) >= 0:
                    in_c += 1
                else:
                    src.message(po.decode(m))
            w = src.commit(po.Commit(0, 0, 10_000 + t, 5))
            assert w is not None
            got.append((w.scn, w.count, w.events))
        windows.append(got)
    assert in_c == len(messages)  # no unchanged TOAST here: C decodes every one
    assert windows[0] == windows[1]


# -- login errors and the slot's gauges ---------------------------------------------------


def test_an_unknown_role_or_database_is_a_config_error(postgres: PostgreSQL, db: str) -> None:
    with pytest.raises(ConfigError, match='role "nobody_here" does not exist'):
        make_source(postgres, db, user="nobody_here")
    with pytest.raises(ConfigError, match='database "no_such_db" does not exist'):
        make_source(postgres, "no_such_db")


def test_slot_gauges_follow_pg_replication_slots(postgres: PostgreSQL, db: str) -> None:
    conn: psycopg.Connection[Any] = connect(postgres, db)
    try:
        conn.execute("CREATE TABLE t (id int PRIMARY KEY, pad text)")
        src = make_source(postgres, db, [r"public\.t"], name="gauges")
        stop = threading.Event()
        src.read(-1, stop, 0.2)
        for i in range(200):  # ~2 MB of WAL (random: not compressed) never acknowledged
            conn.execute("INSERT INTO t SELECT %s, string_agg(md5(random()::text), '')"
                         " FROM generate_series(1, 300)", [i])

        def server_lag() -> int:
            row = conn.execute(
                "SELECT (pg_current_wal_lsn() - confirmed_flush_lsn)::bigint FROM"
                " pg_replication_slots WHERE slot_name = 'databus_gauges'").fetchone()
            assert row is not None
            return int(row[0])

        deadline, after = time.monotonic() + 60, -1
        while True:
            for w in src.read(after, stop, 0.5):
                after = w.scn
            stats, lag = src.stats(), server_lag()
            if stats["slot_lag_bytes"] >= 1_000_000 and lag >= 1_000_000:
                break
            assert time.monotonic() < deadline, (stats, lag)
        # the gauge is the server's own figure, read a few seconds ago at most
        assert stats["slot_lag_bytes"] <= lag
        assert stats["slot_confirmed_lsn"] > 0
        assert stats["slot_retained_bytes"] >= stats["slot_lag_bytes"]
        src.close()
    finally:
        conn.close()
