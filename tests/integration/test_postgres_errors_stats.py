"""The PostgreSQL source's login errors are configuration errors, and its slot gauges
say what ``pg_replication_slots`` says."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from databus.core.errors import ConfigError
from tests.integration.test_postgres_source import connect, drop_slots, make_source
from tests.support.postgres import PostgreSQL


@pytest.fixture()
def db(postgres: PostgreSQL) -> Iterator[str]:
    with postgres.fresh_database("pgerr") as url:
        name = url.rsplit("/", 1)[1]
        yield name
        drop_slots(postgres, name)


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
