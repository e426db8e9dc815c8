"""``databus replicate`` in batches, killed -9 at random points, inside a batch's target
transaction too: the PostgreSQL replica ends equal to the SQLite source, and no window
was applied twice.

SQLite source -> ``databus relay`` (persistent buffer) -> ``databus replicate`` into a
fresh PostgreSQL database, each its own process, while a writer commits random
transactions (inserts, updates, deletes over three tables). A trigger in the target
logs every checkpoint a transaction of the sink commits: the window SCNs it logs must
rise strictly (a window applied twice would commit its checkpoint again, or an older
one), and another logs every customer row image it writes: each source change gives a
row a new name and its transaction's number, so an image written twice is a window
applied twice. A third of the kills wait until the sink's session is inside a
transaction (``pg_stat_activity``: the sink names its connections
``databus-replicate-kill9``), a third until a transaction of its just committed (more
customer images), a third come at random.
"""

from __future__ import annotations

import base64
import json
import random
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
import yaml

from tests.support.pipeline import ProcessPipeline
from tests.support.postgres import PostgreSQL
from tests.support.procs import DATABUS, free_port
from tests.support.shop import TABLES, Writer, create_shop, table_rows
from tests.support.sql import sql_engine

APP = "databus-replicate-kill9"

# the checkpoint table as the sink makes it, made first so that a trigger can log it
LOG_CHECKPOINTS = [
    "CREATE TABLE databus_checkpoint (name VARCHAR(255) PRIMARY KEY, checkpoint TEXT NOT NULL,"
    " updated_ns BIGINT NOT NULL)",
    "CREATE TABLE checkpoint_log (seq BIGSERIAL PRIMARY KEY, scn BIGINT NOT NULL)",
    "CREATE FUNCTION log_checkpoint() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
    " INSERT INTO checkpoint_log (scn) VALUES ((NEW.checkpoint::json->>'windowScn')::bigint);"
    " RETURN NEW; END $$",
    "CREATE TRIGGER log_checkpoint AFTER INSERT OR UPDATE ON databus_checkpoint"
    " FOR EACH ROW EXECUTE FUNCTION log_checkpoint()",
    # each customer image the sink writes: every source change sets a new name and its
    # transaction's number, so an image written twice is a window applied twice
    "CREATE TABLE customers (id TEXT PRIMARY KEY, name TEXT NOT NULL, balance TEXT, tx TEXT)",
    "CREATE TABLE customer_images (id TEXT, name TEXT, tx TEXT)",
    "CREATE FUNCTION log_customer() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
    " INSERT INTO customer_images VALUES (NEW.id, NEW.name, NEW.tx); RETURN NEW; END $$",
    "CREATE TRIGGER log_customer AFTER INSERT OR UPDATE ON customers"
    " FOR EACH ROW EXECUTE FUNCTION log_customer()",
]


@dataclass
class Pipeline(ProcessPipeline):
    tmp: Path
    db: Path
    target: str
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def args(self, name: str) -> list[str]:
        if name == "relay":
            return [*DATABUS, "relay", "--config", str(self.tmp / "relay.yaml")]
        return [*DATABUS, "replicate", "--relay", self.url, "--target",
                f"{self.target}?application_name={APP}", "--batch-rows", "500"]

    def ready_url(self, name: str) -> str | None:
        return f"{self.url}/admin" if name == "relay" else None

    def max_scn(self) -> int:
        return int(httpx.get(f"{self.url}/containerStats/buffer/max_scn", timeout=10).json())

    def images(self, engine: sa.Engine) -> int:
        """Customer images committed so far."""
        with engine.connect() as conn:
            return int(conn.execute(sa.text("SELECT count(*) FROM customer_images")).scalar_one())

    def in_transaction(self, engine: sa.Engine) -> bool:
        with engine.connect() as conn:
            return bool(conn.execute(sa.text(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = :app"
                " AND xact_start IS NOT NULL AND state <> 'idle'"), {"app": APP}).scalar())


def _until(condition: Callable[[], bool], timeout: float = 20.0) -> bool:
    """Poll ``condition`` as fast as it answers; whether it held before ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
    return False


def _text(value: Any) -> Any:
    """A SQLite value as the replica holds it: SQLite columns may hold several storage
    classes, so the sink stores them as text (docs/client.md, Limits)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    return json.dumps(value)


def _pg_rows(engine: sa.Engine, table: str) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        return sorted(tuple(r) for r in conn.execute(sa.text(f"SELECT * FROM {table}")))


def _equal(db: Path, engine: sa.Engine) -> bool:
    try:
        return all(sorted(tuple(_text(v) for v in r) for r in table_rows(db, t))
                   == _pg_rows(engine, t) for t in TABLES)
    except sa.exc.ProgrammingError:  # a table not created yet
        return False


@pytest.fixture
def pipeline(tmp_path: Path, postgres: PostgreSQL) -> Iterator[Pipeline]:
    db = tmp_path / "shop.db"
    create_shop(db)
    with postgres.fresh_database("replicate_kill9") as target:
        with sql_engine(target) as engine, engine.begin() as conn:
            for stmt in LOG_CHECKPOINTS:
                conn.execute(sa.text(stmt))
        p = Pipeline(tmp_path, db, target, free_port())
        (tmp_path / "relay.yaml").write_text(yaml.safe_dump({
            "name": "kill9",
            "source": {"url": f"sqlite:///{db}", "tables": TABLES, "poll_interval": 0.01,
                       "snapshot_mode": "no_data"},
            "buffer": {"capacity_bytes": 64 * 1024 * 1024, "path": str(tmp_path / "relay.buf"),
                       "flush_interval": 0.2},
            "http": {"port": p.port}}))
        try:
            yield p
        finally:
            p.close()


def test_kill9_inside_and_between_batches(pipeline: Pipeline) -> None:
    p = pipeline
    p.start("relay")
    p.start("replicate")
    writer = Writer(p.db, seed=32)
    writer.con.execute("PRAGMA synchronous=NORMAL")
    done = threading.Event()

    def write() -> None:
        while not done.is_set() and len(writer.committed) < 6_000:
            writer.transaction()
            done.wait(0.001)

    thread = threading.Thread(target=write)
    thread.start()
    rng = random.Random(32)
    kills = {"inside a transaction": 0, "right after a commit": 0, "at random": 0}
    with sql_engine(p.target) as engine:
        try:
            for i in range(12):
                done.wait(rng.uniform(1.0, 2.5))  # a new process starts in about a second
                p.alive()
                how = list(kills)[i % 3]
                if how == "inside a transaction":
                    hit = _until(lambda: p.in_transaction(engine))
                elif how == "right after a commit":
                    images = p.images(engine)
                    hit = _until(lambda n=images: p.images(engine) > n)
                else:
                    hit = True
                p.kill("replicate")
                kills[how] += hit
                p.start("replicate")
        finally:
            done.set()
            thread.join()
            writer.close()
        assert min(kills.values()) >= 3, kills
        p.wait("the replica to equal the source", lambda: _equal(p.db, engine), 180,
               interval=0.5)
        with engine.connect() as conn:
            scns = [int(r[0]) for r in conn.execute(sa.text(
                "SELECT scn FROM checkpoint_log ORDER BY seq"))]
            stored = conn.execute(sa.text("SELECT checkpoint FROM databus_checkpoint")
                                  ).scalar_one()
            twice = conn.execute(sa.text(
                "SELECT id, name, tx, count(*) FROM customer_images GROUP BY id, name, tx"
                " HAVING count(*) > 1")).all()
            images = conn.execute(sa.text("SELECT count(*) FROM customer_images")).scalar()
    assert not twice, f"row images written twice: {twice[:5]}"
    assert images and images > 100
    assert all(a < b for a, b in pairwise(scns)), (
        "a checkpoint was committed twice or went back: a window applied twice")
    assert len(scns) >= 10  # batches were committed between the kills
    assert f'"windowScn":{p.max_scn()}' in stored
    con = sqlite3.connect(p.db)
    try:
        assert con.execute("SELECT count(*) FROM customers").fetchone()[0] > 100
    finally:
        con.close()
