"""Upserting a batch of rows: the statement forms per dialect, beside what the replicate
sink uses (``databus.client.sinks.apply.TableWriter.upsert``), issue 32.

A table shaped like sysbench's (``id`` primary key, ``k`` integer, ``c`` 120 and ``pad``
60 characters) holding ``--rows`` rows; batches of ``--batch`` distinct keys, half of
them existing rows, upserted in one transaction each until ``--rows`` rows were
written. Per form: rows/s (wall) and the client's CPU per row, best of ``--rounds``.

* PostgreSQL (psycopg 3, a private server, ``fsync`` on, ``synchronous_commit`` off):
  SQLAlchemy ``insert().on_conflict_do_update()`` executemany (the sink before issue 32),
  the driver's ``executemany`` (pipeline mode), one multi-row ``VALUES`` statement,
  ``unnest`` of arrays, and ``COPY`` into a temporary table + ``INSERT .. SELECT .. ON
  CONFLICT`` (the sink from ``COPY_MIN`` rows);
* MariaDB (pymysql, a private server): SQLAlchemy's executemany, the driver's
  ``executemany`` (pymysql sends multi-row statements: the sink);
* SQLite: SQLAlchemy's executemany, the driver's ``executemany`` (the sink), one
  multi-row ``VALUES`` statement.

    flock /tmp/databus-bench.lock .venv/bin/python -m bench.replicate_statements
        [--rows 20000] [--batch 1000,5000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mysql, postgresql, sqlite
from tests.support.mariadb import MariaDB
from tests.support.postgres import PostgreSQL

from bench.replicate_sysbench import cpu_seconds, family
from databus.client.sinks.apply import TableWriter
from databus.core.schema import ColumnSpec, TableSchema, table_schema

Row = tuple[Any, ...]
SCHEMA = TableSchema(src_id=1, name="sb.t", version=1, avro=table_schema("sb", "t", [
    ColumnSpec("id", "long", nullable=False), ColumnSpec("k", "long", nullable=False),
    ColumnSpec("c", "string", nullable=False), ColumnSpec("pad", "string", nullable=False)]),
    key_columns=("id",))


def _table() -> sa.Table:
    return sa.Table("t", sa.MetaData(), sa.Column("id", sa.BigInteger, primary_key=True,
                                                  autoincrement=False),
                    sa.Column("k", sa.BigInteger, nullable=False),
                    sa.Column("c", sa.String(120), nullable=False),
                    sa.Column("pad", sa.String(60), nullable=False))


def _rows(n: int, seed: int) -> list[Row]:
    rng = random.Random(seed)
    return [(i, rng.randrange(10**6), f"{rng.randrange(10**11):011d}-" * 10,
             f"{rng.randrange(10**11):011d}-" * 5) for i in range(n)]


def forms(engine: sa.Engine, table: sa.Table) -> dict[str, Callable[[sa.Connection, list[Row]],
                                                                    None]]:
    name = engine.dialect.name
    cols = [c.name for c in table.columns]
    others = cols[1:]
    out: dict[str, Callable[[sa.Connection, list[Row]], None]] = {}
    if name == "postgresql":
        ins = postgresql.insert(table)
        stmt: Any = ins.on_conflict_do_update(index_elements=["id"],
                                              set_={c: ins.excluded[c] for c in others})
        conflict = " ON CONFLICT (id) DO UPDATE SET " + ", ".join(
            f"{c} = EXCLUDED.{c}" for c in others)
        one = "INSERT INTO t (id, k, c, pad) VALUES (%s, %s, %s, %s)" + conflict

        def values(conn: sa.Connection, rows: list[Row]) -> None:
            conn.exec_driver_sql(
                "INSERT INTO t (id, k, c, pad) VALUES " + ", ".join(
                    ["(%s, %s, %s, %s)"] * len(rows)) + conflict,
                tuple(v for r in rows for v in r))

        def unnest(conn: sa.Connection, rows: list[Row]) -> None:
            conn.exec_driver_sql(
                "INSERT INTO t (id, k, c, pad) SELECT * FROM unnest(%s::bigint[],"
                " %s::bigint[], %s::text[], %s::text[])" + conflict,
                tuple(list(c) for c in zip(*rows, strict=True)))

        out["values, one statement"] = values
        out["unnest"] = unnest
    elif name in ("mysql", "mariadb"):
        mins = mysql.insert(table)
        stmt = mins.on_duplicate_key_update({c: mins.inserted[c] for c in others})
        one = ("INSERT INTO t (id, k, c, pad) VALUES (%s, %s, %s, %s) ON DUPLICATE KEY"
               " UPDATE " + ", ".join(f"{c} = VALUES({c})" for c in others))
    else:
        sins = sqlite.insert(table)
        stmt = sins.on_conflict_do_update(index_elements=["id"],
                                          set_={c: sins.excluded[c] for c in others})
        one = ("INSERT INTO t (id, k, c, pad) VALUES (?, ?, ?, ?) ON CONFLICT (id) DO UPDATE"
               " SET " + ", ".join(f"{c} = excluded.{c}" for c in others))

        def sqlite_values(conn: sa.Connection, rows: list[Row]) -> None:
            for i in range(0, len(rows), 1000):  # SQLite binds at most 32,766 values
                chunk = rows[i:i + 1000]
                conn.exec_driver_sql(
                    "INSERT INTO t (id, k, c, pad) VALUES " + ", ".join(
                        ["(?, ?, ?, ?)"] * len(chunk)) + one[one.index(" ON CONFLICT"):],
                    tuple(v for r in chunk for v in r))

        out["values, one statement"] = sqlite_values

    def sa_many(conn: sa.Connection, rows: list[Row]) -> None:
        conn.execute(stmt, [dict(zip(cols, r, strict=True)) for r in rows])

    def driver_many(conn: sa.Connection, rows: list[Row]) -> None:
        conn.exec_driver_sql(one, rows)

    writer = TableWriter(table, SCHEMA, ("id",), [None] * 4, engine.dialect)

    def sink(conn: sa.Connection, rows: list[Row]) -> None:
        writer.upsert(conn, rows, set())

    if name == "postgresql":
        def sink_copy(conn: sa.Connection, rows: list[Row]) -> None:
            writer._copy_upsert(conn, rows, set())  # whatever the size: COPY_MIN's choice
        out["the sink's COPY at any size"] = sink_copy

    return {"SQLAlchemy executemany (before)": sa_many, "driver executemany": driver_many,
            **out, "the sink (TableWriter.upsert)": sink}


def measure(url: str, total: int, batches: list[int], rounds: int,
            server: Callable[[], float] | None = None) -> None:
    """Each form's best of ``rounds``; ``server``: the server's CPU seconds so far (its
    CPU per row is reported beside the client's)."""
    engine = sa.create_engine(url)
    table = _table()
    base = _rows(total, 1)
    try:
        for batch in batches:
            for name, fn in forms(engine, table).items():
                best_rate, best_cpu, best_server = 0.0, 0.0, 0.0
                for r in range(rounds):
                    with engine.begin() as conn:
                        table.drop(conn, checkfirst=True)
                        table.create(conn)
                        conn.execute(table.insert(), [dict(zip(("id", "k", "c", "pad"), x,
                                                               strict=True))
                                                      for x in base[: total // 2]])
                    new = _rows(total, 2 + r)
                    t0, c0 = time.monotonic(), time.process_time()
                    s0 = server() if server is not None else 0.0
                    for i in range(0, total, batch):
                        with engine.begin() as conn:
                            fn(conn, new[i:i + batch])
                    took, cpu = time.monotonic() - t0, time.process_time() - c0
                    srv = (server() - s0) if server is not None else 0.0
                    if total / took > best_rate:
                        best_rate, best_cpu = total / took, cpu / total * 1e6
                        best_server = srv / total * 1e6
                extra = f" | {best_server:5.1f} us/row server CPU" if server is not None else ""
                print(f"  batch {batch:>6,} | {name:<32} | {best_rate:>9,.0f} rows/s |"
                      f" {best_cpu:5.1f} us/row client CPU{extra}", flush=True)
    finally:
        engine.dispose()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=20_000)
    p.add_argument("--batch", default="1000,5000")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--dialects", default="postgresql,mariadb,sqlite")
    args = p.parse_args()
    batches = [int(b) for b in args.batch.split(",")]
    dialects = args.dialects.split(",")
    with tempfile.TemporaryDirectory(prefix="databus-stmts-") as tmp:
        if "postgresql" in dialects:
            print("PostgreSQL", flush=True)
            with PostgreSQL(settings={"fsync": "on", "synchronous_commit": "off"}) as pg, \
                    pg.fresh_database("stmts") as url:
                assert pg.proc is not None
                pid = pg.proc.pid
                measure(url, args.rows, batches, args.rounds,
                        lambda: cpu_seconds(family(pid)))
        if "mariadb" in dialects:
            print("MariaDB", flush=True)
            with MariaDB(Path(tmp) / "mariadb", settings={
                    "innodb-flush-log-at-trx-commit": "2"}) as m:
                m.execute("CREATE DATABASE stmts")
                assert m.proc is not None
                mpid = m.proc.pid
                measure(m.url_of("stmts"), args.rows, batches, args.rounds,
                        lambda: cpu_seconds([mpid]))
        if "sqlite" in dialects:
            print("SQLite", flush=True)
            measure(f"sqlite:///{Path(tmp) / 'stmts.db'}", args.rows, batches, args.rounds)


if __name__ == "__main__":
    main()
