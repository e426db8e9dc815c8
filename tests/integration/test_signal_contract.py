"""Sending a signal is one contract for every server source
(:mod:`databus.sources.common.signals`), checked here on MariaDB and PostgreSQL alike:
the same refusals with the same words, the database's errors translated the same way,
and the signal table never captured as data.

Where the two sources' copies of ``signal()`` differed, the kept behaviour is: a
database that refuses the insert is the caller's to fix (InvalidRequestError, 400); a
database that cannot be reached is transient (SourceUnavailableError, 503), where the
PostgreSQL copy answered 400. And the MySQL source's table filter now leaves the
signal table out as the PostgreSQL one did, so its watermark rows are never data events.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from databus.core import event as ev
from databus.core.errors import InvalidRequestError, SourceUnavailableError
from databus.sources.base import Source
from databus.sources.common.incremental import NOTIFICATIONS
from databus.sources.common.names import source_id
from databus.sources.mysql.source import MysqlSource
from databus.sources.postgres.source import PostgresSource
from tests.support.mariadb import MariaDB
from tests.support.postgres import PostgreSQL
from tests.support.procs import free_port
from tests.support.sources import mysql_source, source_config


@dataclass
class Opened:
    """An opened source of one kind, its signal table, and SQL on its database."""

    source: MysqlSource | PostgresSource
    signal_table: str
    execute: Callable[[str], None]
    count: Callable[[str], int]  # rows of a query's first column


@pytest.fixture(params=["mariadb", "postgresql"])
def opened(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opened]:
    tag = uuid.uuid4().hex[:10]
    if request.param == "mariadb":
        m: MariaDB = request.getfixturevalue("mariadb")
        db, sigdb = f"sigc_{tag}", f"sigs_{tag}"
        m.execute(f"CREATE DATABASE {db}", f"CREATE TABLE {db}.t (id INT PRIMARY KEY)")

        def my_count(sql: str) -> int:
            with m.connect() as con, con.cursor() as cur:
                cur.execute(sql)
                return int(cur.fetchone()[0])

        # the tables regexes match the signal table too: it is still never captured
        src = mysql_source(m.url, [rf"{db}\..*", rf"{sigdb}\..*"], name=f"sig{tag}",
                           signal_table=f"{sigdb}.signals", snapshot_mode="no_data",
                           state_dir=tmp_path)
        try:
            src._snap_io.ensure_signal_table()  # no_data: made here, as a snapshot mode would
            yield Opened(src, f"{sigdb}.signals", lambda sql: m.execute(sql), my_count)
        finally:
            src.close()
            m.execute(f"DROP DATABASE IF EXISTS {db}", f"DROP DATABASE IF EXISTS {sigdb}")
        return
    pg: PostgreSQL = request.getfixturevalue("postgres")
    with pg.fresh_database("sigc") as url:
        name = url.rsplit("/", 1)[1]
        pg.execute("CREATE TABLE t (id int PRIMARY KEY)", db=name)

        def pg_count(sql: str) -> int:
            with psycopg.connect(f"host=127.0.0.1 port={pg.port} user=postgres dbname={name}",
                                 autocommit=True) as con:
                row = con.execute(sql).fetchone()
                assert row is not None
                return int(row[0])

        cfg = source_config(pg.source_url(name), [r"public\..*", r"databus\..*"],
                            snapshot_mode="no_data", create_publication=True)
        psrc = PostgresSource(cfg, name=f"sig{tag}", state_dir=tmp_path)  # type: ignore[arg-type]
        psrc.open()
        try:
            yield Opened(psrc, "databus.signals", lambda sql: pg.execute(sql, db=name),
                         pg_count)
        finally:
            psrc.close()
            pg.execute("SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots"
                       f" WHERE database = '{name}' AND active_pid IS NOT NULL")
            time.sleep(0.2)
            pg.execute("SELECT pg_drop_replication_slot(slot_name) FROM"
                       f" pg_replication_slots WHERE database = '{name}'")


def _rows(o: Opened) -> int:
    return o.count(f"SELECT count(*) FROM {o.signal_table}")


def test_an_unknown_signal_is_refused_in_the_same_words(opened: Opened) -> None:
    with pytest.raises(InvalidRequestError) as err:
        opened.source.signal("nonsense", None)
    assert str(err.value) == ("unknown signal 'nonsense'; one of execute-snapshot,"
                              " stop-snapshot, pause-snapshot, resume-snapshot")
    assert _rows(opened) == 0


def test_a_snapshot_of_no_captured_table_writes_nothing(opened: Opened) -> None:
    for data in ({"data-collections": [r"nosuch\.table"]}, {"data-collections": []}, None):
        with pytest.raises(InvalidRequestError):
            opened.source.signal("execute-snapshot", data)
    assert _rows(opened) == 0
    opened.source.signal("stop-snapshot", None)  # names no table: written
    assert _rows(opened) == 1


def test_a_signal_table_the_database_refuses_is_a_bad_request(opened: Opened) -> None:
    opened.execute(f"DROP TABLE {opened.signal_table}")
    with pytest.raises(InvalidRequestError) as err:
        opened.source.signal("stop-snapshot", None)
    assert str(err.value).startswith(f"cannot write to {opened.signal_table}: ")


def test_an_unreachable_database_is_transient_not_a_bad_request(opened: Opened) -> None:
    src = opened.source
    src.url = dataclasses.replace(src.url, port=free_port())  # type: ignore[type-var]
    with pytest.raises(SourceUnavailableError) as err:
        src.signal("stop-snapshot", None)
    assert err.value.retryable and err.value.http_status == 503


def test_the_signal_table_is_never_captured(opened: Opened) -> None:
    src: Source = opened.source
    stop = threading.Event()
    windows = src.read(-1, stop, 0.5)
    after = windows[-1].scn if windows else -1
    sid = src.signal("stop-snapshot", None)  # no snapshot runs: an ERROR notice
    events: list[ev.Event] = []
    deadline = time.monotonic() + 30
    while not events and time.monotonic() < deadline:
        for w in src.read(after, stop, 1.0):
            after = w.scn
            events += list(ev.iter_events(w.events))
    assert events, "the signal's notice never came"
    assert {e.src_id for e in events} == {source_id(NOTIFICATIONS)}
    assert source_id(opened.signal_table) not in {s.id for s in src.sources()}
    assert sid
