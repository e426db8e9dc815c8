"""The one SQLAlchemy classifier (databus.client.sql) on real SQLite, PostgreSQL and
MariaDB: what may pass is transient, the rest terminal with its context as fields."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import sqlalchemy as sa

from databus.client.sql import translate_db_errors
from databus.core.errors import (
    SinkUnavailableError,
    SqlStatementError,
    StorageFullError,
    StoreUnavailableError,
)


def _engine(url: str) -> sa.Engine:
    return sa.create_engine(url, connect_args={"timeout": 0.2} if url.startswith("sqlite") else {})


def test_a_constraint_violation_is_terminal_with_context(sql_url: str) -> None:
    engine = _engine(sql_url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("CREATE TABLE t (id INT PRIMARY KEY)"))
            conn.execute(sa.text("INSERT INTO t VALUES (1)"))
        with pytest.raises(SqlStatementError) as info, \
                translate_db_errors("inserting into t", engine, StoreUnavailableError), \
                engine.begin() as conn:
            conn.execute(sa.text("INSERT INTO t VALUES (1)"))
        err = info.value
        assert not err.retryable and err.what == "inserting into t"
        assert err.driver_code is not None or err.sqlstate is not None
        assert "inserting into t failed on" in str(err) and "IntegrityError" in str(err)
        assert ":" not in err.target.split("@")[0].split("//")[-1]  # no password in it
        with pytest.raises(SqlStatementError), translate_db_errors("reading", engine), \
                engine.begin() as conn:
            conn.execute(sa.text("SELECT * FROM no_such_table"))
    finally:
        engine.dispose()


def test_a_lock_that_times_out_is_transient(sql_url: str) -> None:
    engine = _engine(sql_url)
    kind = engine.dialect.name
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("CREATE TABLE t (id INT PRIMARY KEY, v INT)"))
            conn.execute(sa.text("INSERT INTO t VALUES (1, 0)"))
        holder = engine.connect()
        held = holder.begin()
        holder.execute(sa.text("UPDATE t SET v = 1 WHERE id = 1"))  # holds the row (SQLite: the db)
        try:
            with pytest.raises(SinkUnavailableError) as info, \
                    translate_db_errors("updating t", engine), engine.begin() as conn:
                if kind == "postgresql":
                    conn.execute(sa.text("SET LOCAL lock_timeout = '200ms'"))
                elif kind == "mysql":
                    conn.execute(sa.text("SET SESSION innodb_lock_wait_timeout = 1"))
                conn.execute(sa.text("UPDATE t SET v = 2 WHERE id = 1"))
            assert info.value.retryable and "updating t failed on" in str(info.value)
        finally:
            held.rollback()
            holder.close()
    finally:
        engine.dispose()


def test_sqlite_busy_from_another_writer_is_transient(tmp_path: Path) -> None:
    engine = _engine(f"sqlite:///{tmp_path / 'busy.db'}")
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("CREATE TABLE t (id INT)"))
        locked = threading.Event()
        release = threading.Event()

        def hold() -> None:
            with engine.connect() as c:
                c.exec_driver_sql("BEGIN EXCLUSIVE")
                locked.set()
                release.wait(10)
                c.exec_driver_sql("COMMIT")

        t = threading.Thread(target=hold)
        t.start()
        locked.wait(10)
        try:
            with pytest.raises(SinkUnavailableError), translate_db_errors("writing", engine), \
                    engine.begin() as conn:
                conn.execute(sa.text("INSERT INTO t VALUES (1)"))
        finally:
            release.set()
            t.join(10)
    finally:
        engine.dispose()


def test_a_full_disk_is_storage_full_and_the_write_succeeds_once_space_returns() -> None:
    """SQLite on a size-limited tmpfs filled up: the failing insert is StorageFull
    (transient: its transaction rolled back whole, nothing half-written), and the same
    insert succeeds once the space returns."""
    from tests.support.faults import filled, mount_unavailable, small_disk

    why = mount_unavailable()
    if why:
        pytest.skip(why)
    with small_disk(8 << 20) as disk:
        engine = sa.create_engine(f"sqlite:///{disk / 'store.db'}")
        try:
            with engine.begin() as conn:
                conn.execute(sa.text("CREATE TABLE t (id INT PRIMARY KEY, v BLOB)"))
            row = {"v": b"x" * (256 << 10)}
            with filled(disk):
                with pytest.raises(StorageFullError) as info, \
                        translate_db_errors("writing t", engine, StoreUnavailableError), \
                        engine.begin() as conn:
                    for i in range(64):  # more than the space left, in one transaction
                        conn.execute(sa.text("INSERT INTO t VALUES (:i, :v)"), {**row, "i": i})
                assert info.value.retryable and "the disk is full" in str(info.value)
                with engine.connect() as conn:  # nothing of it is there
                    assert conn.execute(sa.text("SELECT count(*) FROM t")).scalar() == 0
            with engine.begin() as conn:
                conn.execute(sa.text("INSERT INTO t VALUES (:i, :v)"), {**row, "i": 0})
        finally:
            engine.dispose()
