"""The bootstrap service with the MariaDB source, every part its own process.

A private MariaDB holds rows before capture starts (accounts, orders, and
items with a composite primary key); ``databus relay`` (snapshot_mode
initial, a 1 MiB buffer so history falls off) sends them as ``r`` events and
streams a random workload; ``databus bootstrap`` logs and folds everything;
a consumer started late (``databus replicate --bootstrap``) must end with a
replica equal to MariaDB (every table, columns included, order-independent
digests of normalised values) while writes continue, an ``ALTER TABLE ADD
COLUMN`` runs before its start (its snapshot mixes table versions) and
another during its bootstrap, and updates change primary keys (int keys on
orders, composite keys on items).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from tests.support.bootmysql import Pipeline, Writer, mariadb_keys, snapshot_keys
from tests.support.mariadb import BINLOG_SETTINGS, MariaDB
from tests.support.mysql_workload import SCHEMA
from tests.support.postgres import PostgreSQL

PG_FAST = "?options=-c%20synchronous_commit%3Doff"
Make = Callable[[str, str], tuple[Pipeline, Writer]]


@pytest.fixture
def make(tmp_path: Path, postgres: PostgreSQL) -> Iterator[Make]:
    """make(store, target) with store/target in {"sqlite", "pg"}: a MariaDB with
    pre-existing rows, a Pipeline (nothing started) and a Writer (not started)."""
    server = MariaDB(tmp_path / "db", settings={**BINLOG_SETTINGS,
                                                  "innodb-flush-log-at-trx-commit": "2"})
    server.start()
    with ExitStack() as stack:
        stack.callback(server.stop)

        def url(kind: str, name: str) -> str:
            if kind == "pg":
                return stack.enter_context(postgres.fresh_database(f"databus_bsm_{name}")) + PG_FAST
            return f"sqlite:///{tmp_path / (name + '.db')}"

        def build(store: str, target: str) -> tuple[Pipeline, Writer]:
            server.execute(*SCHEMA)
            writer = Writer(server.port, seed=7)
            stack.callback(writer.finish)
            for _ in range(1500):  # rows that exist before capture starts
                writer.step()
            p = Pipeline(tmp_path, server, url(store, "store"), url(target, "replica"))
            stack.callback(p.close)
            p.write_configs()
            return p, writer

        yield build


def _start_capture(p: Pipeline, writer: Writer) -> int:
    """Relay + bootstrap service, writes during the relay's initial snapshot; the
    ALTER TABLE runs once the snapshot is done (so the bootstrap snapshot holds
    rows of both table versions). Returns the SCN that must fall off the relay."""
    p.start("relay")
    p.start("bootstrap")
    p.wait_relay_dump()
    writer.start()
    p.wait("the relay's initial snapshot completed",
           lambda: p.relay_stat("snapshot_completed_total") >= 1)
    writer.ddl.set()
    return p.relay_scn("max_scn")


def _fell_off(p: Pipeline, scn: int) -> None:
    p.wait("the initial snapshot fell off the relay", lambda: p.relay_scn("min_scn") > scn,
           timeout=300)


@pytest.mark.parametrize(("store", "target"), [("sqlite", "pg"), ("pg", "sqlite")])
def test_late_consumer_replica_equals_mariadb(make: Make, store: str, target: str) -> None:
    p, writer = make(store, target)
    t0 = time.monotonic()
    snap_scn = _start_capture(p, writer)
    _fell_off(p, snap_scn)
    moved_before = len(writer.moved)
    p.start("replicate")
    t1 = time.monotonic()
    p.wait("the consumer's bootstrap", lambda: (p.mode() or "").startswith("BOOTSTRAP"))
    writer.ddl2.set()  # ALTER TABLE items ADD COLUMN note, during the bootstrap
    p.wait("the consumer on the relay", lambda: p.mode() == "ONLINE_CONSUMPTION", timeout=300)
    boot = time.monotonic() - t1
    assert writer.items_note, "the second ALTER TABLE did not run during the bootstrap"
    assert writer.is_alive(), "the writer stopped before the bootstrap ended"
    switched = p.consumer_checkpoint()
    p.wait("a little more streaming after the switch",
           lambda: p.consumer_checkpoint() != switched)
    writer.finish()
    assert writer.w.has_tier, "the first ALTER TABLE never ran"
    assert moved_before > 0 and len(writer.moved) > moved_before, "no composite key moves"
    settle = p.wait_equal()
    print(f"\n[{store} store -> {target} replica] bootstrap {boot:.1f}s, equal "
          f"{settle:.1f}s after the writes stopped, {writer.count} transactions, "
          f"{len(writer.moved)} composite-key moves, total {time.monotonic() - t0:.1f}s",
          file=sys.stderr)


def test_kill9_consumer_in_bootstrap_and_bootstrap_service(make: Make) -> None:
    p, writer = make("pg", "pg")
    p.batch = 100  # many small batches, so the bootstrap lasts long enough to be hit
    t0 = time.monotonic()
    _fell_off(p, _start_capture(p, writer))
    p.start("replicate")
    killed = []
    p.wait("the consumer's bootstrap", lambda: (p.mode() or "").startswith("BOOTSTRAP")
           and (p.consumer_checkpoint() or {}).get("snapshot_offset", 0) != 0)
    p.kill("replicate")
    killed.append(f"consumer in {p.mode()}")
    writer.ddl2.set()  # ALTER TABLE items ADD COLUMN note while the consumer is down
    p.start("replicate")
    first = p.consumer_checkpoint()
    p.wait("more progress", lambda: p.consumer_checkpoint() != first)
    p.kill("bootstrap")
    killed.append(f"bootstrap service, consumer in {p.mode()}")
    p.start("bootstrap")
    p.wait("the consumer on the relay", lambda: p.mode() == "ONLINE_CONSUMPTION", timeout=300)
    assert writer.is_alive()
    switched = p.consumer_checkpoint()
    p.wait("a little more streaming after the switch",
           lambda: p.consumer_checkpoint() != switched)
    writer.finish()
    settle = p.wait_equal()
    assert killed[0].startswith("consumer in BOOTSTRAP"), killed
    assert killed[1].startswith("bootstrap service, consumer in "), killed
    print(f"\n[kill -9] {killed}; equal {settle:.1f}s after the writes stopped, "
          f"total {time.monotonic() - t0:.1f}s", file=sys.stderr)


def test_primary_key_changes_leave_no_old_row(make: Make) -> None:
    """UPDATEs that change an int key (orders) and a composite key (items), made
    after capture started: the bootstrap snapshot holds exactly MariaDB's keys
    (the old keys' rows are gone), and so does a replica bootstrapped from it."""
    p, writer = make("sqlite", "sqlite")
    p.start("relay")
    p.start("bootstrap")
    p.wait_relay_dump()
    p.wait("the relay's initial snapshot completed",
           lambda: p.relay_stat("snapshot_completed_total") >= 1)
    before = mariadb_keys(p.server)
    for _ in range(300):  # moves of both kinds, folded in the bootstrap store
        writer.step()
        writer.move_item()
    writer.w.con.cursor().execute("UPDATE orders SET id = id + 1000000 WHERE id <= 20")
    after = mariadb_keys(p.server)
    gone = {t: before[t] - after[t] for t in ("orders", "items")}
    assert len(gone["items"]) > 50 and len(gone["orders"]) >= 20, gone
    top = p.server.binlog_end_scn()  # the relay may not have read the last writes yet
    p.wait("the relay to capture every write", lambda: p.relay_scn("max_scn") >= top)
    p.wait("the store folded everything", lambda: _applied(p) >= top)
    snap = snapshot_keys(p.store_url)
    for table in ("accounts", "orders", "items"):
        stale = snap.get(table, set()) - after[table]
        assert not stale, f"{table}: {len(stale)} old keys kept in the snapshot, e.g. " \
                          f"{sorted(stale)[:5]}"
        assert snap.get(table, set()) == after[table], table
    p.start("replicate")
    p.wait_equal()


def _applied(p: Pipeline) -> int:
    import httpx

    return int(httpx.get(f"{p.bs}/admin", timeout=10).json()["applied_scn"])
