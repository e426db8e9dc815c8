"""Checkpoint stores: file (atomic, corrupt files refused) and SQL (SQLite)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import sqlalchemy as sa

from databus.client import (
    CheckpointStoreError,
    FileCheckpointStore,
    MemoryCheckpointStore,
    SqlCheckpointStore,
)
from databus.core.checkpoint import Checkpoint
from databus.core.errors import ConfigError, InvalidCheckpointError
from tests.support.sql import sql_engine


def test_file_store_round_trip_and_atomic_replace(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "c.json"
    store = FileCheckpointStore(path)
    assert store.load() is None
    first = Checkpoint.after(10)
    store.save(first)
    assert store.load() == first
    inode = path.stat().st_ino
    second = first.window_done(20)
    store.save(second)
    assert store.load() == second and store.load().prev_scn == 10  # type: ignore[union-attr]
    assert path.stat().st_ino != inode  # replaced by rename, never rewritten in place
    assert sorted(p.name for p in path.parent.iterdir()) == ["c.json"]  # no temp files left


def test_file_store_failed_write_leaves_no_partial_file(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    path.mkdir()  # a directory where the file should be: refused, never replaced
    (path / "keep").write_text("x")
    with pytest.raises(ConfigError, match="not a regular file"):
        FileCheckpointStore(path).save(Checkpoint.after(20))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.json"]  # no temp file
    assert (path / "keep").read_text() == "x"
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)  # the temp file cannot be written: transient, nothing left behind
    try:
        if os.geteuid() != 0:  # root writes anywhere
            with pytest.raises(CheckpointStoreError, match="cannot write checkpoint file"):
                FileCheckpointStore(ro / "c.json").save(Checkpoint.after(20))
            assert list(ro.iterdir()) == []
    finally:
        ro.chmod(0o700)


@pytest.mark.parametrize("content", [b"", b"{not json", b'{"windowScn": "x"}', b"[1,2]",
                                     b'{"windowScn": -1, "windowOffset": 3}'])
def test_corrupt_file_is_an_error_naming_the_path(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "c.json"
    path.write_bytes(content)
    with pytest.raises(InvalidCheckpointError) as info:
        FileCheckpointStore(path).load()
    assert str(path) in str(info.value)


def test_sql_store_on_sqlite(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'cp.db'}"
    store = SqlCheckpointStore(url, "consumer-a")
    other = SqlCheckpointStore(url, "consumer-b")
    try:
        assert store.load() is None
        cp = Checkpoint.after(42)
        store.save(cp)
        store.save(cp.window_done(43))
        assert store.load() == cp.window_done(43).model_copy(
            update={"ts_nsecs": store.load().ts_nsecs})  # type: ignore[union-attr]
        assert other.load() is None
        # inside a caller's transaction: committed or rolled back with it
        with store.engine.connect() as conn:
            with conn.begin() as tx:
                store.save_in(conn, Checkpoint.after(99))
                assert store.load_in(conn).window_scn == 99  # type: ignore[union-attr]
                tx.rollback()
            assert store.load_in(conn).window_scn == 43  # type: ignore[union-attr]
            conn.commit()
            with conn.begin():
                store.save_in(conn, Checkpoint.after(100))
        assert store.load().window_scn == 100  # type: ignore[union-attr]
        # a corrupt row is an error naming the table and the row
        with store.engine.begin() as conn:
            conn.execute(sa.text("UPDATE databus_checkpoint SET checkpoint='{' "
                                 "WHERE name='consumer-a'"))
        with pytest.raises(InvalidCheckpointError, match=r"consumer-a.*databus_checkpoint"):
            store.load()
    finally:
        store.close()
        other.close()


def test_sql_store_with_a_callers_engine_and_table(tmp_path: Path) -> None:
    with sql_engine(f"sqlite:///{tmp_path / 'x.db'}") as engine:
        store = SqlCheckpointStore(engine, "n", table="my_positions")
        store.save(Checkpoint.after(1))
        store.close()  # does not dispose a caller's engine
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT count(*) FROM my_positions")).scalar() == 1


def test_memory_store() -> None:
    s = MemoryCheckpointStore()
    assert s.load() is None
    s.save(Checkpoint.after(3))
    assert s.load() == s.checkpoint and s.saves == 1
