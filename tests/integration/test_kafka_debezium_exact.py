"""Debezium-exact mode: our values equal the ones Debezium's MySQL connector wrote.

``tests/data/debezium_typematrix.json`` holds what Debezium 3.3's MySQL connector
(embedded, ``bench/peers/DebeziumHarness.java``, the connector's default value modes)
wrote for the type matrix (``tests.support.typematrix``) on MariaDB: the statements
that were run, and per change the ``before``/``after`` structs and the Connect schema of
each column (``bench/peers/typematrix.py`` writes it). Here the same statements run on a
private MariaDB, the MySQL source captures them, and ``databus.kafka``'s encoder in
``debezium`` mode (``MessageEncoder``, as ``databus publish --value-mode debezium``)
must give the same values and the same Connect field schemas.

The suite does not need the JVM: the harness runs again only when its jars are cached
(``test_the_harness_still_writes_the_checked_in_values``).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from databus.core import event as ev
from databus.core.envelope import decode_images
from databus.core.schema import SchemaRegistry, TableSchema
from databus.kafka.config import PublishConfig
from databus.kafka.envelope import MessageEncoder
from databus.sources.mysql.checks import parse_mysql_url
from databus.sources.mysql.connection import master_status
from tests.support.mariadb import BINLOG_SETTINGS, MariaDB
from tests.support.sources import mysql_source

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "debezium_typematrix.json"
EXPECTED: dict[str, Any] = json.loads(DATA.read_text())


def _scn(m: MariaDB) -> int:
    file, pos = master_status(parse_mysql_url(m.url))
    return (int(file.rsplit(".", 1)[1]) << 32) | pos


def _param(v: Any) -> Any:
    return bytes.fromhex(v["hex"]) if isinstance(v, dict) else v


def _replay(m: MariaDB) -> tuple[int, int]:
    """The recorded setup and statements on ``m``: the binlog range of the statements."""
    m.execute("SET GLOBAL time_zone = '+00:00'", *EXPECTED["setup"])
    start = _scn(m)
    with m.connect() as con, con.cursor() as cur:
        for s in EXPECTED["session"]:
            cur.execute(s)
        for s in EXPECTED["statements"]:
            params = s["params"]
            cur.execute(s["sql"], None if params is None else [_param(p) for p in params])
        con.commit()
    return start, _scn(m)


def _ours(m: MariaDB, start: int, end: int) -> tuple[list[dict[str, Any]],
                                                    dict[str, list[dict[str, Any]]]]:
    """(events as the expected data has them, Connect field schemas per table)."""
    cfg = PublishConfig(relay="http://unused", bootstrap_servers="unused:9092",
                        topic_prefix="peer", value_mode="debezium")
    enc = MessageEncoder(cfg)
    events: list[dict[str, Any]] = []
    fields: dict[str, list[dict[str, Any]]] = {}
    with mysql_source(m.url, [r"types\..*"]) as src:
        after_scn, stop = start, threading.Event()
        while after_scn < end:
            for w in src.read(after_scn, stop, 5.0):
                after_scn = w.scn
                reg = src.registry()
                for e in ev.iter_events(w.events):
                    if e.src_id < 0:
                        continue
                    schema, before, after, _meta = decode_images(e, reg)
                    codec = enc.codec(schema)
                    fields.setdefault(codec.table, [c.schema for c in codec.columns])
                    events.append({"table": codec.table, "op": e.op.letter,
                                   "before": codec.row(before), "after": codec.row(after)})
    return events, fields


@pytest.fixture(scope="module")
def replayed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[MariaDB, int, int]]:
    with MariaDB(tmp_path_factory.mktemp("dbz-exact") / "db",
                 settings=dict(BINLOG_SETTINGS)) as m:
        start, end = _replay(m)
        yield m, start, end


@pytest.fixture(scope="module")
def ours(replayed: tuple[MariaDB, int, int]) -> tuple[list[Any], dict[str, Any]]:
    return _ours(*replayed)


def _diffs(got: dict[str, Any] | None, want: dict[str, Any] | None) -> list[Any]:
    if got is None or want is None:
        return [] if got is want else [(got, want)]
    return [(k, got.get(k, "<missing>"), want.get(k, "<missing>"))
            for k in sorted(set(got) | set(want)) if got.get(k, "<missing>") != want.get(k)]


def test_values_equal_debeziums(ours: tuple[list[Any], dict[str, Any]]) -> None:
    events, _ = ours
    want = EXPECTED["events"]
    assert [(e["table"], e["op"]) for e in events] == [(e["table"], e["op"]) for e in want]
    for i, (g, w) in enumerate(zip(events, want, strict=True)):
        assert _diffs(g["before"], w["before"]) == [], f"event {i} ({w['table']} {w['op']})"
        assert _diffs(g["after"], w["after"]) == [], f"event {i} ({w['table']} {w['op']})"


def test_field_schemas_equal_debeziums(ours: tuple[list[Any], dict[str, Any]]) -> None:
    _, fields = ours
    assert set(fields) == set(EXPECTED["fields"])
    for table, want in EXPECTED["fields"].items():
        got = {f["field"]: f for f in fields[table]}
        assert list(got) == [f["field"] for f in want]
        diffs = [(f["field"], got[f["field"]], f) for f in want if got[f["field"]] != f]
        assert diffs == [], table


def _schema_ids(m: MariaDB, start: int, end: int, adopt: SchemaRegistry | None = None
                ) -> tuple[set[bytes], SchemaRegistry]:
    """The schema ids of the captured data events, and the source's registry."""
    ids: set[bytes] = set()
    with mysql_source(m.url, [r"types\..*"]) as src:
        if adopt is not None:
            src.adopt_schemas(adopt)
        after_scn, stop = start, threading.Event()
        while after_scn < end:
            for w in src.read(after_scn, stop, 5.0):
                after_scn = w.scn
                ids |= {e.schema_id for e in ev.iter_events(w.events) if e.src_id >= 0}
        return ids, src.registry()


def test_a_version_recorded_without_declared_types_keeps_its_id(
        replayed: tuple[MariaDB, int, int]) -> None:
    """A schema history written before fields carried ``sql_type``: the source goes on
    with those versions and ids (no new version for the same table)."""
    m, start, end = replayed
    ids, reg = _schema_ids(m, start, end)
    current = [reg.get(i) for i in ids]
    assert all(any("sql_type" in f for f in s.avro["fields"]) for s in current)
    legacy = SchemaRegistry([
        TableSchema(s.src_id, s.name, s.version,
                    {**s.avro, "fields": [{k: v for k, v in f.items() if k != "sql_type"}
                                          for f in s.avro["fields"]]}, s.key_columns)
        for s in current])
    again, reg2 = _schema_ids(m, start, end, adopt=legacy)
    assert again == {v.id for s in current for v in legacy.versions(s.src_id)}
    assert again.isdisjoint(ids)
    assert all(len(reg2.versions(s.src_id)) == 1 for s in current)


@pytest.mark.skipif(shutil.which("java") is None or shutil.which("javac") is None,
                    reason="no JDK")
def test_the_harness_still_writes_the_checked_in_values(tmp_path: Path) -> None:
    """Only where the Debezium bundle is cached (nothing is downloaded at test time)."""
    from bench.peers import harness

    if not harness.cached():
        pytest.skip("the Debezium bundle is not cached (bash scripts/java/fetch.sh debezium)")
    out = tmp_path / "typematrix.json"
    done = subprocess.run([sys.executable, "-m", "bench.peers.typematrix",
                           "--out", str(out)], cwd=ROOT, timeout=600,
                          capture_output=True, text=True)
    assert done.returncode == 0, f"the harness failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
    fresh = json.loads(out.read_text())
    assert fresh["events"] == EXPECTED["events"]
    assert fresh["fields"] == EXPECTED["fields"]
