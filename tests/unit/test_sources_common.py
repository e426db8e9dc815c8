"""What the server sources share (databus.sources.common), on its own: the table filter,
server URLs, the schema history file, event keys and a snapshot's commit step."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from databus.core import event as ev
from databus.core.errors import ConfigError, SchemaError
from databus.core.schema import ColumnSpec, SchemaRegistry, TableSchema, table_schema
from databus.sources.common.history import HistoryFile
from databus.sources.common.incremental import (
    NOTIFICATIONS,
    NOTIFY_SCHEMA,
    ChunkReader,
    Snapshots,
    event_keys,
    idle_stats,
)
from databus.sources.common.names import source_id, split_name
from databus.sources.common.progress import ProgressRecords
from databus.sources.common.tables import TableFilter
from databus.sources.mysql.checks import parse_mysql_url
from databus.sources.postgres.connection import parse_pg_url


def test_the_signal_table_is_never_a_captured_table() -> None:
    f = TableFilter([r"shop\..*", r"databus\..*"], [r"shop\.tmp_.*"], "databus.signals")
    assert f("shop.orders") and f("databus.other")
    assert not f("databus.signals") and not f("shop.tmp_1") and not f("other.t")
    assert TableFilter([], [], None)("any.table")  # no tables: every table


def test_a_bad_table_regex_is_a_config_error_before_any_connection() -> None:
    with pytest.raises(ConfigError, match="bad table regex"):
        TableFilter([r"shop\.("], [])


def test_none_match_names_both_lists() -> None:
    f = TableFilter([r"shop\..*"], [r"shop\.x"])
    assert f.none_match() == ("no table matches tables ['shop\\\\..*'] less exclude_tables"
                              " ['shop\\\\.x'] (regexes matched whole on 'db.table', e.g."
                              " 'shop\\..*')")


def test_names() -> None:
    assert source_id("shop.orders") == source_id("shop.orders") < 2**31
    assert split_name("a.b.c") == ("a", "b.c")
    with pytest.raises(SchemaError, match=r"schema\.table"):
        split_name("nodot", "schema.table")


def test_server_urls_read_one_way() -> None:
    my = parse_mysql_url("mariadb://u%40x:p%2Fw@db.example:3307", password=None)
    assert (my.host, my.port, my.user, my.password) == ("db.example", 3307, "u@x", "p/w")
    assert parse_mysql_url("mysql://h").user == "root"
    assert parse_mysql_url("mysql://u:inurl@h", password="file").password == "file"
    pg = parse_pg_url("postgres://h/my%20db")
    assert (pg.port, pg.user, pg.database) == (5432, "postgres", "my db")
    for url, words in (("http://h", "not a mysql:// URL"), ("mysql://", "mysql URL needs a host"),
                       ("mysql://u:secret@h:x", "bad port in mysql URL")):
        with pytest.raises(ConfigError, match=words) as err:
            parse_mysql_url(url)
        assert "secret" not in str(err.value)
    for url, words in (("mysql://h/d", "not a postgresql:// URL"),
                       ("postgresql://h", "needs a database"),
                       ("postgresql://h:99999999/d", "bad port in postgresql URL")):
        with pytest.raises(ConfigError, match=words):
            parse_pg_url(url)


def _schema(version: int, cols: Sequence[str]) -> TableSchema:
    return TableSchema(source_id("shop.t"), "shop.t", version, table_schema(
        "shop", "t", [ColumnSpec(c, "long") for c in cols]), ("id",))


def test_the_history_file_round_trips_and_refuses_what_it_cannot_read(tmp_path: Path) -> None:
    assert HistoryFile(None).load() == [] and HistoryFile(tmp_path / "none.json").load() == []
    path = tmp_path / "r.mysql-schemas.json"
    reg = SchemaRegistry([_schema(1, ["id"]), _schema(2, ["id", "a"])])
    HistoryFile(path).write(reg)
    assert [s.id for s in HistoryFile(path).load()] == [_schema(1, ["id"]).id,
                                                        _schema(2, ["id", "a"]).id]
    path.write_text("{not json")
    with pytest.raises(SchemaError, match=str(path)):
        HistoryFile(path).load()


def _event(table: str, key: int | bytes) -> bytes:
    s = _schema(1, ["id"])
    return ev.encode(scn=5, src_id=source_id(table), key=key, payload=s.encode({"id": 1}),
                     schema_id=s.id, schema_version=1, op=ev.Op.INSERT, timestamp_ns=0)


def test_event_keys_of_one_table_among_events() -> None:
    parts = [_event("shop.t", 1) + _event("shop.u", 2), _event("shop.t", b'["k"]')]
    assert event_keys(parts, "shop.t") == [1, b'["k"]']
    assert event_keys(parts, "shop.none") == []


class _Reader(ChunkReader):
    """An in-memory database side: one table, watermark rows kept."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str]] = []

    def write_watermark(self, wid: str, kind: str, data: str) -> None:
        self.rows.append((wid, kind, data))

    def tables(self) -> list[str]:
        return ["shop.t"]

    def max_key(self, table: str, key: Sequence[str] | None, condition: str | None
                ) -> tuple[list[Any] | None, list[str]]:
        return None, ["id"]  # an empty table


def test_a_commit_with_a_signal_adds_its_notices_and_records_the_state(tmp_path: Path) -> None:
    reader = _Reader()
    path = tmp_path / "progress.json"
    snaps = Snapshots(reader, 10, lambda _t: True, ProgressRecords(path, keep=None),
                      lambda chunk, scn, ts: (b"", 0))
    assert snaps.quiet and snaps.stats() == idle_stats()
    parts = [_event("shop.t", 1)]
    added = snaps.commit([("s1", "execute-snapshot", json.dumps(
        {"data-collections": [r"shop\.t"]}))], parts, 100, 7, NOTIFY_SCHEMA)
    assert added == 1 and len(parts) == 2 and snaps.active
    (notice,) = ev.iter_events(parts[1])
    assert notice.src_id == source_id(NOTIFICATIONS)
    assert json.loads(path.read_text())["records"][-1][0] == 100
    snaps.step()  # the empty table is done at once: the notices need a marker row
    assert [k for _, k, _ in reader.rows] == ["snapshot-notify"] and not snaps.active
    assert [n["kind"] for n in snaps.notices] == ["TABLE_DONE", "COMPLETED"]
    assert snaps.stats()["snapshot_started_total"] == 1
