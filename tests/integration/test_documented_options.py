"""Documented source options that had no test: ``exclude_tables`` and
``include_columns`` (docs/mysql.md), on a real MariaDB."""

from __future__ import annotations

import threading
import uuid

from databus.core.envelope import decode_images
from databus.core.event import iter_events
from tests.support.mariadb import MariaDB
from tests.support.sources import mysql_source


def test_exclude_tables_and_include_columns(mariadb: MariaDB) -> None:
    db = f"opt_{uuid.uuid4().hex[:8]}"
    mariadb.execute(f"CREATE DATABASE {db}",
                    f"CREATE TABLE {db}.t (id INT PRIMARY KEY, a INT, secret VARCHAR(10))",
                    f"CREATE TABLE {db}.skip (id INT PRIMARY KEY)")
    src = mysql_source(mariadb.url, [rf"{db}\..*"], snapshot_mode="no_data",
                       exclude_tables=[rf"{db}\.skip"], include_columns=[rf"{db}\.t\.a"])
    stop = threading.Event()
    try:
        after = -1
        src.read(after, stop, 0.5)  # positioned at the end
        mariadb.execute(f"INSERT INTO {db}.skip VALUES (1)",
                        f"INSERT INTO {db}.t VALUES (1, 2, 'hidden')")
        seen: list[tuple[str, dict[str, object] | None]] = []
        for _ in range(20):
            for w in src.read(after, stop, 0.5):
                after = w.scn
                for e in iter_events(w.events):
                    if not e.is_control:
                        schema, _before, image, _meta = decode_images(e, src.registry())
                        seen.append((schema.name, image))
            if seen:
                break
        assert seen == [(f"{db}.t", {"id": 1, "a": 2})]  # key kept, secret left out
    finally:
        src.close()
        mariadb.execute(f"DROP DATABASE {db}")
