"""A signal a relay cannot act on is refused when it is sent (issue 30, item 6).

``databus signal execute-snapshot --tables 'shop\\.nosuch'`` against a relay whose
source captures no such table gets a 400 from ``POST /signal`` naming the regex, and
the command exits 2 with that message; nothing is written to the signal table. The
same for the MySQL and the PostgreSQL source (the SQLite source takes no signals).
"""

from __future__ import annotations

import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.mariadb import MariaDB
from tests.support.postgres import PostgreSQL
from tests.support.procs import DATABUS, ROOT, free_port, running, wait_http


def _signal(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PYTHONPATH": f"{ROOT / 'src'}:{ROOT}", "PATH": "/usr/bin:/bin"}
    return subprocess.run([*DATABUS, "signal", *args, "--relay", url], capture_output=True,
                          text=True, timeout=60, env=env, cwd=ROOT)


def _checks(url: str, good: str) -> None:
    """What every source that takes snapshots answers."""
    bad = _signal(url, "execute-snapshot", "--tables", r"shop\.nosuch,shop\..*")
    assert bad.returncode == 2, bad
    assert bad.stdout == ""  # no id: nothing was sent
    line, = bad.stderr.strip().splitlines()
    assert "InvalidRequest" in line
    assert "no captured table matches 'shop\\\\.nosuch' (regexes" in line  # as JSON text
    ok = _signal(url, "execute-snapshot", "--tables", good)
    assert ok.returncode == 0, ok
    assert re.fullmatch(r"[0-9a-f]{32}\n", ok.stdout)
    for body, words in (
            ({"type": "execute-snapshot"}, "needs data-collections"),
            ({"type": "execute-snapshot", "data": {"data-collections": []}},
             "needs data-collections"),
            ({"type": "execute-snapshot", "data": {"data-collections": ["shop\\.("]}},
             "bad regex")):
        r = httpx.post(f"{url}/signal", json=body, timeout=30)
        assert r.status_code == 400, r.text
        assert r.json()["error"] == "InvalidRequest" and words in r.json()["message"]
    stop = httpx.post(f"{url}/signal", json={"type": "stop-snapshot"}, timeout=30)
    assert stop.status_code == 202, stop.text  # other signals name no table


@pytest.fixture
def mysql_relay(tmp_path: Path) -> Iterator[tuple[MariaDB, str]]:
    with MariaDB(tmp_path / "db") as m:
        m.execute("CREATE DATABASE shop", "CREATE TABLE shop.orders (id INT PRIMARY KEY)",
                  "CREATE TABLE shop.other (id INT PRIMARY KEY)")
        port = free_port()
        args = [*DATABUS, "relay", "--source", m.url, "--tables", r"shop\.orders",
                "--port", str(port)]
        with running(args, tmp_path / "relay.log") as relay:
            url = f"http://127.0.0.1:{port}"
            wait_http(f"{url}/admin", relay)
            yield m, url


def _signal_rows(m: MariaDB) -> list[str]:
    with m.connect() as con, con.cursor() as cur:
        cur.execute("SELECT data FROM databus.signals WHERE type = 'execute-snapshot'")
        return [str(r[0]) for r in cur.fetchall()]


def test_mysql_relay_refuses_a_snapshot_of_no_captured_table(
        mysql_relay: tuple[MariaDB, str]) -> None:
    m, url = mysql_relay
    _checks(url, r"shop\.orders")
    # an existing table the relay does not capture is no captured table either
    other = _signal(url, "execute-snapshot", "--tables", r"shop\.other")
    assert other.returncode == 2 and "no captured table matches" in other.stderr
    assert _signal_rows(m) == ['{"data-collections": ["shop\\\\.orders"]}']  # the good one


@pytest.fixture
def pg_relay(postgres: PostgreSQL, tmp_path: Path) -> Iterator[str]:
    with postgres.fresh_database("sigval") as db_url:
        db = db_url.rsplit("/", 1)[1]
        postgres.execute("CREATE SCHEMA shop", "CREATE TABLE shop.orders (id int PRIMARY KEY)",
                         db=db)
        slot = f"sigval_{uuid.uuid4().hex[:8]}"
        port = free_port()
        args = [*DATABUS, "relay", "--source", postgres.source_url(db), "--tables",
                r"shop\..*", "--snapshot-mode", "no_data", "--create-publication",
                "--slot", slot, "--port", str(port)]
        try:
            with running(args, tmp_path / "relay.log") as relay:
                url = f"http://127.0.0.1:{port}"
                wait_http(f"{url}/admin", relay)
                yield url
        finally:
            time.sleep(0.2)
            postgres.execute("SELECT pg_drop_replication_slot(slot_name) FROM"
                             f" pg_replication_slots WHERE slot_name = '{slot}'")


def test_postgres_relay_refuses_a_snapshot_of_no_captured_table(pg_relay: str) -> None:
    _checks(pg_relay, r"shop\.orders")
