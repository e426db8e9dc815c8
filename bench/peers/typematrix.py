"""The type matrix through Debezium's MySQL connector: the data of the Debezium-exact test.

A private MariaDB (binlog ROW/FULL/FULL, time zone UTC) gets the tables of
``tests.support.typematrix`` (``types.t``: every column type; ``types.x``: zero dates,
GEOMETRY, generated columns, a composite key); the harness (``DebeziumHarness.java``,
``--mode values``, the connector's default value modes) streams the inserts, updates and
deletes that follow. Written to ``tests/data/debezium_typematrix.json``:

* ``statements``: the SQL that was run, in order, with its parameters (bytes as
  ``{"hex": ...}``), so a test replays exactly these rows;
* ``events``: per change, ``table``, ``op``, ``before``, ``after`` as Debezium wrote them;
* ``fields``: per table, the Connect schema of each column of the ``after`` struct;
* ``debezium``: the connector's version and the settings used.

    .venv/bin/python -m bench.peers.typematrix [--out tests/data/debezium_typematrix.json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from tests.support.mariadb import BINLOG_SETTINGS, MariaDB
from tests.support.typematrix import COLUMNS, EXTRA, ROWS

from bench.peers.harness import ROOT, Debezium, classpath, prepare

SETUP = [
    "CREATE DATABASE types",
    "CREATE TABLE types.t ({})".format(", ".join(f"`{n}` {t}" for n, t in COLUMNS)),
    "CREATE TABLE types.x ({}, PRIMARY KEY (k1, k2))".format(
        ", ".join(f"`{n}` {t}" for n, t in EXTRA)),
]

_MARKS = ", ".join(["%s"] * len(COLUMNS))
DML: list[tuple[str, list[Any] | None]] = [
    *[(f"INSERT INTO types.t VALUES ({_MARKS})", list(r)) for r in ROWS],
    ("INSERT INTO types.x (k1, k2, dz, dtz, g, n) VALUES"
     " (1, 'a\"b\\\\c\\n', '0000-00-00', '0000-00-00 00:00:00', NULL, 5),"
     " (2, 'ü😀', '2020-00-00', '2024-01-02 03:04:05.678', ST_GeomFromText('POINT(1 2)'), NULL),"
     " (-3, '', '1000-01-01', '9999-12-31 23:59:59.999',"
     "  ST_GeomFromText('LINESTRING(0 0, 1 1, 2 5)'), -7)", None),
    ("UPDATE types.t SET vc = 'changed', d2 = -5.5, tx = NULL WHERE id = 1", None),
    ("UPDATE types.x SET n = n + 1, dz = '2021-02-03' WHERE k1 <> 2", None),
    ("DELETE FROM types.t WHERE id = 2", None),
    ("DELETE FROM types.x WHERE k1 = 2", None),
]
SESSION = ["SET time_zone = '+00:00'", "SET sql_mode = ''"]  # sql_mode '': zero dates


def json_param(v: Any) -> Any:
    return {"hex": v.hex()} if isinstance(v, bytes) else v


def sql_param(v: Any) -> Any:
    return bytes.fromhex(v["hex"]) if isinstance(v, dict) else v


def run_statements(m: MariaDB, statements: list[dict[str, Any]]) -> None:
    """Run the recorded DML (``{"sql", "params"}``) on one session, autocommit."""
    with m.connect() as con, con.cursor() as cur:
        for s in SESSION:
            cur.execute(s)
        for s in statements:
            params = s.get("params")
            cur.execute(s["sql"], None if params is None else [sql_param(p) for p in params])
        con.commit()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, default=ROOT / "tests/data/debezium_typematrix.json")
    args = ap.parse_args()
    cp = classpath()
    tmp = Path(tempfile.mkdtemp(prefix="dbz-types-"))
    statements = [{"sql": sql, "params": None if p is None else [json_param(v) for v in p]}
                  for sql, p in DML]
    try:
        with MariaDB(tmp / "db", settings=dict(BINLOG_SETTINGS)) as m:
            m.execute("SET GLOBAL time_zone = '+00:00'", *SETUP)
            prepare(m)
            raw = tmp / "values.jsonl"
            h = Debezium(m, tmp / "harness", mode="values", tables="types.t,types.x", cp=cp,
                         out=raw)
            h.wait_streaming()
            run_statements(m, statements)
            h.stop()
            h.result()
        lines = raw.read_text().splitlines()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    events: list[dict[str, Any]] = []
    fields: dict[str, list[dict[str, Any]]] = {}
    for line in lines:
        msg = json.loads(line)
        payload, schema = msg["payload"], msg["schema"]
        table = payload["source"]["table"]
        after = next(f for f in schema["fields"] if f["field"] == "after")
        fields.setdefault(table, after["fields"])
        events.append({"table": table, "op": payload["op"], "before": payload["before"],
                       "after": payload["after"]})
        version = payload["source"]["version"]
    data = {"about": "Debezium's values for the type matrix: written by"
                     " bench/peers/typematrix.py; read by"
                     " tests/integration/test_kafka_debezium_exact.py",
            "debezium": {"version": version, "connector": "MySqlConnector",
                         "decimal.handling.mode": "precise",
                         "time.precision.mode": "adaptive_time_microseconds",
                         "bigint.unsigned.handling.mode": "long", "server": "MariaDB",
                         "time_zone": "+00:00"},
            "setup": SETUP, "session": SESSION, "statements": statements,
            "fields": fields, "events": events}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    print(f"{len(events)} events -> {args.out}")


if __name__ == "__main__":
    main()
