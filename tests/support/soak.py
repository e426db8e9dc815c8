"""The randomized soak (issue 35): a mixed topology under writers while a
:class:`~tests.support.nemesis.Nemesis` injects faults, and a checker that compares
every consumer's history with what the databases committed.

**Topology** (:class:`Soak`). A private MariaDB written by sysbench's
``oltp_write_only`` (Debian's sysbench, over the server's unix socket, so that a cut of
the server's TCP port cuts the relay and not the load), captured by a two-member relay
cluster on a private ZooKeeper (``m1``, ``m2``), a chain relay reading the cluster
(``chain``); a private PostgreSQL written by a paced writer (:class:`PgWriter`, unix
socket too) captured by a relay (``pgrelay``) whose state directory is on a 16 MiB
tmpfs; ``databus replicate`` from the cluster into a database of a third server, a
target PostgreSQL (``rep_my``), and from ``pgrelay`` into another database there
(``rep_pg``); recorders (``python -m tests.support.soak``: the client library with a
file checkpoint, like ``databus tail``) on the cluster (``zk://``), on the chain relay
and on ``pgrelay``, writing every window's SCN, transaction ids and rows. The writers
are in ``tests/support/soak_writers.py``.

**The full mix** (``Settings.full``, the bench's default; the suite's paced run has
neither, issue 35): a private Kafka broker and ``databus publish`` of the cluster
(``zk://``) into it (``publish``, ``tests/support/soak_kafka.py``), and a Spark query
reading the chain relay into a Parquet file sink with a checkpoint, a driver process of
its own (``spark``, ``tests/support/soak_spark.py``). Both are read back at the end as
windows for the same checker, and both must be exactly once (no window twice either).

**Faults** (:meth:`Soak.kinds`): ``kill_relay`` (kill -9, restarted after the hold),
``kill_replicate``, ``kill_recorder``, ``pause_relay`` (SIGSTOP, SIGCONT), ``cut_relay``
(every packet to and from a relay's HTTP port dropped, ``faults.cut``), ``cut_source``
(the same for the MariaDB or PostgreSQL port), ``restart_source`` (MariaDB stopped and
started on its data directory; PostgreSQL stopped fast, immediate if that still waits after
5 s, and started) and ``disk_full``
(the tmpfs under ``pgrelay``'s state filled to its last byte); in the full mix also
``kill_publish`` (kill -9, restarted after the hold) and ``kill_spark`` (kill -9 of the
driver's whole process group, once its first batch is committed; restarted on the same
checkpoint after the hold).

**What the databases committed.** MariaDB: its binlog, read after the run by
``mariadb-binlog --base64-output=decode-rows -v`` (the server's own tool, not our
decoder) from the position taken before any table existed: each GTID group with row
changes of ``sbtest`` is one committed transaction, its changes (table, op, primary key)
in binlog order, its id the GTID. sysbench's transactions cut by a restart never reach
the binlog. PostgreSQL: every writer transaction also inserts its sequence number and
``txid_current()`` into ``marks``; after the run the rows of ``marks`` say which
transactions committed (one whose COMMIT was cut by a restart is in doubt for the
writer, not for the table) and, the writer being one connection, in which order.

**The checker** (:func:`check_history`, in ``tests/support/soak_check.py``) reads a recorder's lines: a window seen again
must be the same (a whole window replayed after a restart from a checkpoint: counted as
``duplicated``; a different one is counted ``torn``); a new SCN below one seen is
``reordered``; each window's transaction ids must be consecutive committed
transactions and its rows exactly theirs (else ``torn``; unknown ids ``phantom``);
committed transactions in no window are ``lost``. For ``replicate``, every target table
must equal its source table row for row (its effect is exactly once: none lost, none
twice).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa
import yaml

from databus.client import ClientConfig, Consumer, DatabusClient, FileCheckpointStore
from tests.support import faults, sysbench
from tests.support.kafka import KafkaBroker
from tests.support.mariadb import MariaDB
from tests.support.nemesis import Kind, Nemesis
from tests.support.pipeline import relay_args, replicate_args, write_config
from tests.support.postgres import PostgreSQL
from tests.support.procs import free_port
from tests.support.relay_cluster import Cluster
from tests.support.soak_check import History, Tx, check_history, mariadb_committed
from tests.support.soak_kafka import PublishedHistory, publish_args
from tests.support.soak_spark import (
    SparkHistory,
    driver_args,
    first_batch_committed,
    kill_driver,
    start_driver,
)
from tests.support.soak_writers import PG_SCHEMA, PgWriter, Sysbench
from tests.support.wait import wait_until
from tests.support.zookeeper import ZooKeeper

# -- the recorder ---------------------------------------------------------------------

class HistoryRecorder(Consumer):
    """One JSON line per window with rows, written (one ``write``) before the client
    persists its checkpoint: a crash can repeat windows in the file, never lose one."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.events: list[list[str]] = []
        self.txs: list[str] = []

    def on_start_data_event_sequence(self, scn: int) -> None:
        self.events, self.txs = [], []

    def on_data_event(self, event: Any) -> None:
        md = event.metadata
        tx = str(md.get("gtid") or md.get("txid") or "")
        if not self.txs or self.txs[-1] != tx:
            self.txs.append(tx)
        key = event.key if isinstance(event.key, int) else json.loads(event.key)
        self.events.append([event.source.rsplit(".", 1)[-1], event.op.letter,
                            json.dumps(key)])

    def on_end_data_event_sequence(self, scn: int) -> None:
        if self.events:  # a window of schema changes or progress only: nothing to check
            line = json.dumps({"scn": scn, "tx": self.txs, "events": self.events}) + "\n"
            os.write(self.fd, line.encode())


def recorder_args(relay: str, out: Path, checkpoint: Path) -> list[str]:
    return [sys.executable, "-m", "tests.support.soak", "--relay", relay, "--out", str(out),
            "--checkpoint", str(checkpoint)]


# -- the topology -------------------------------------------------------------------------

@dataclass
class Settings:
    """One soak run: ``minutes`` of faults; sysbench ``rate`` (0: as fast as it goes)."""

    seed: int
    seconds: float
    tables: int = 2
    table_size: int = 1000
    threads: int = 2
    rate: int = 20
    pg_rate: float = 20.0
    buffer_mb: int = 64
    catch_up: float = 90.0  # seconds the consumers get to catch up once the faults end
    full: bool = False  # Kafka and Spark too (see the module docstring)
    hold: tuple[float, float] = (1.0, 4.0)
    gap: tuple[float, float] = (0.5, 2.0)


TIMEOUT = 4  # source.network_timeout of every relay: a silent cut is noticed in seconds
RELAYS = ("m1", "m2", "chain", "pgrelay")
REPLICATES = ("rep_my", "rep_pg")
RECORDERS = ("rec_cluster", "rec_chain", "rec_pg")
EXACT = ("publish", "spark")  # the full mix's consumers, exactly once


@dataclass
class Soak(Cluster):
    """See the module docstring (``Cluster`` gives the members ``m1``, ``m2``)."""

    mariadb: MariaDB = field(default=None)  # type: ignore[assignment]
    pg: PostgreSQL = field(default=None)  # type: ignore[assignment]
    target: PostgreSQL = field(default=None)  # type: ignore[assignment]
    disk: Path = field(default=None)  # type: ignore[assignment]
    buffer_mb: int = 64
    pg_shutdown_hangs: int = 0  # fast shutdowns that waited past 5 s (see _restart_source)
    kafka: KafkaBroker | None = None  # the full mix (publish and spark) when set
    tables: int = 2  # sysbench's: what publish and spark are checked on
    # a restarted relay reads its whole persistent buffer back before it serves (the
    # windows' index is rebuilt and checked): 14-21 s for 2 GiB under the full mix, and
    # once past the default 30 s (the run of seed 3534 stopped on it)
    start_timeout = 180.0

    def sources(self) -> list[str]:
        return [f"{sysbench.DATABASE}.sbtest{i}" for i in range(1, self.tables + 1)]

    def members(self) -> list[str]:
        return [m for m in ("m1", "m2") if m in self.procs]

    def args(self, name: str) -> list[str]:
        if name in ("m1", "m2"):  # Cluster's config, with the soak's buffer size
            args = super().args(name)
            conf = self.tmp / f"{name}.yaml"
            member = yaml.safe_load(conf.read_text())
            member["buffer"]["capacity_bytes"] = self.buffer_mb << 20
            write_config(conf, member)
            return args
        port = self.ports.setdefault(name, free_port())
        if name == "chain":
            conf = write_config(self.tmp / "chain.yaml", {
                "source": {"url": f"databus+{self.address}", "network_timeout": TIMEOUT},
                "buffer": {"path": str(self.tmp / "chain.buf"),
                           "capacity_bytes": self.buffer_mb << 20},
                "http": {"port": port}})
            return relay_args(port, config=conf)
        if name == "pgrelay":
            conf = write_config(self.tmp / "pgrelay.yaml", {
                "name": "pgsoak",
                "source": {"url": self.pg.source_url("soak"), "tables": [r"public\..*"],
                           "snapshot_mode": "no_data", "slot": "databus_soak",
                           "publication": "databus_soak", "network_timeout": TIMEOUT},
                "buffer": {"path": str(self.tmp / "pgrelay.buf"),
                           "capacity_bytes": self.buffer_mb << 20},
                "state_dir": str(self.disk / "state"),
                "http": {"port": port}})
            return relay_args(port, config=conf)
        if name == "rep_my":
            return replicate_args(self.address, self.target.url("rep_mariadb"))
        if name == "rep_pg":
            return replicate_args(self.url("pgrelay"), self.target.url("rep_pg"))
        if name == "publish":
            assert self.kafka is not None
            return publish_args(self.address, self.kafka)
        if name == "spark":
            return driver_args(self.url("chain"), self.sources(), self.tmp / "spark.out",
                               self.tmp / "spark.ckpt")
        relay = {"rec_cluster": self.address, "rec_chain": self.url("chain"),
                 "rec_pg": self.url("pgrelay")}[name]
        return recorder_args(relay, self.tmp / f"{name}.jsonl", self.tmp / f"{name}.ckpt")

    def ready_url(self, name: str) -> str | None:
        return f"{self.url(name)}/admin" if name in RELAYS else None

    def history(self, name: str) -> History | PublishedHistory | SparkHistory:
        if name == "publish":
            assert self.kafka is not None
            return PublishedHistory(self.kafka.bootstrap_servers, sysbench.DATABASE,
                                    [s.split(".")[1] for s in self.sources()])
        if name == "spark":
            return SparkHistory(self.tmp / "spark.out")
        return History(self.tmp / f"{name}.jsonl")

    def start(self, name: str) -> None:
        if name == "spark":  # a process group: the kill takes its JVM and workers too
            self.procs[name] = start_driver(self.args(name), self.log(name))
        else:
            super().start(name)

    def kill(self, name: str) -> None:
        if name == "spark":
            kill_driver(self.procs[name])
        else:
            super().kill(name)

    def close(self) -> None:
        if "spark" in self.procs:
            kill_driver(self.procs["spark"])
        super().close()

    # -- faults: each injects, holds, heals -------------------------------------------

    def _kill(self, name: str, hold: float) -> None:
        self.kill(name)
        time.sleep(hold)
        self.start(name)

    def _pause(self, name: str, hold: float) -> None:
        self.procs[name].send_signal(signal.SIGSTOP)
        try:
            time.sleep(hold)
        finally:
            self.procs[name].send_signal(signal.SIGCONT)

    def _cut_relay(self, name: str, hold: float) -> None:
        with faults.cut(self.ports[name]):
            time.sleep(hold)

    def _cut_source(self, name: str, hold: float) -> None:
        with faults.cut(self.mariadb.port if name == "mariadb" else self.pg.port):
            time.sleep(hold)

    def _restart_source(self, name: str, hold: float) -> None:
        if name == "mariadb":
            self.mariadb.stop()
            time.sleep(hold)
            self.mariadb.start()
        else:
            self._pg_fast_shutdown()
            time.sleep(hold)
            self.pg.start()

    def _pg_fast_shutdown(self, wait: float = 5.0) -> None:
        """``pg_ctl stop -m fast`` (SIGINT); if the server has not stopped after ``wait``
        seconds, counted in :attr:`pg_shutdown_hangs` and finished as an immediate one
        (SIGQUIT: the postmaster ends its children; the next start recovers from the
        WAL). ``PostgreSQL.shutdown`` would SIGKILL the postmaster alone after 60 s,
        leaving children that keep the next start from running."""
        proc = self.pg.proc
        assert proc is not None
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(wait)
        except subprocess.TimeoutExpired:
            self.pg_shutdown_hangs += 1
            proc.send_signal(signal.SIGQUIT)
            proc.wait(60)

    def _kill_spark(self, name: str, hold: float) -> None:
        proc = self.procs[name]

        def first() -> bool:  # a driver that died is the checker's finding, not ours
            return proc.poll() is not None or first_batch_committed(self.tmp / "spark.ckpt")

        wait_until(first, 600, "the Spark query's first batch", interval=0.5)
        if proc.poll() is None:
            self._kill(name, hold)

    def _disk_full(self, name: str, hold: float) -> None:
        with faults.filled(self.disk):
            time.sleep(hold)

    def kinds(self) -> list[Kind]:
        return [Kind("kill_relay", RELAYS, self._kill),
                Kind("kill_replicate", REPLICATES, self._kill),
                Kind("kill_recorder", RECORDERS, self._kill),
                Kind("pause_relay", RELAYS, self._pause),
                Kind("cut_relay", RELAYS, self._cut_relay),
                Kind("cut_source", ("mariadb", "postgresql"), self._cut_source),
                Kind("restart_source", ("mariadb", "postgresql"), self._restart_source),
                Kind("disk_full", ("pgrelay",), self._disk_full),
                *([Kind("kill_publish", ("publish",), self._kill),
                   Kind("kill_spark", ("spark",), self._kill_spark)]
                  if self.kafka is not None else [])]


def table_rows(url: str, table: str, cols: str, key: str) -> list[tuple[str, ...]]:
    """Every row of ``table`` ordered by ``key``, values as text (CHAR padding cut)."""
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            return [tuple(str(v).rstrip() for v in r) for r in conn.execute(
                sa.text(f"SELECT {cols} FROM {table} ORDER BY {key}"))]
    finally:
        engine.dispose()


def unavailable() -> str | None:
    """Why this machine cannot run the soak (root for cuts and the tmpfs, sysbench)."""
    reason = faults.nft_unavailable() or faults.mount_unavailable()
    if reason is None:
        try:
            sysbench.binary()
        except RuntimeError as exc:
            reason = str(exc)
    return reason


@contextmanager
def _servers(tmp: Path, full: bool) -> Iterator[
        tuple[MariaDB, PostgreSQL, PostgreSQL, ZooKeeper, KafkaBroker | None]]:
    with ExitStack() as stack:
        zk = stack.enter_context(ZooKeeper())
        my = stack.enter_context(MariaDB(tmp / "mariadb"))
        pg = stack.enter_context(PostgreSQL())
        target = stack.enter_context(PostgreSQL())
        kafka = stack.enter_context(KafkaBroker()) if full else None
        yield my, pg, target, zk, kafka


def run_soak(tmp: Path, s: Settings, say: Callable[[str], None] = print) -> dict[str, Any]:
    """One soak (see the module docstring); the report: faults per kind and the log,
    transactions checked, each recorder's and replicate's counts, ``ok``."""
    t_start = time.monotonic()
    with _servers(tmp, s.full) as (my, pg, target, zk, kafka), \
            faults.small_disk(16 << 20) as disk, \
            Soak(tmp, tmp / "unused.db", zk, "soak", mariadb=my, pg=pg, target=target,
                 disk=disk, buffer_mb=s.buffer_mb, kafka=kafka, tables=s.tables,
                 source={"url": my.url, "tables": [r"sbtest\..*"], "snapshot_mode": "no_data",
                         "network_timeout": TIMEOUT}) as p:
        my.execute(f"CREATE DATABASE {sysbench.DATABASE}")
        start = my.binlog_position()  # before any table: every row change is after it
        pg.execute("CREATE DATABASE soak")
        pg.execute(*PG_SCHEMA, db="soak")
        target.execute("CREATE DATABASE rep_mariadb", "CREATE DATABASE rep_pg")
        bench = Sysbench(my, sysbench.Workload(tables=s.tables, table_size=s.table_size,
                                               threads=s.threads, rate=s.rate),
                         tmp / "sysbench.log")
        bench.prepare()
        for name in ("m1", "m2"):
            p.start(name)
        p.wait("a leader", p.leader, 60)
        p.wait_dump(my)
        p.start("chain")
        p.start("pgrelay")
        p.wait("pgrelay to stream from its slot", lambda: pg.scalar(
            "SELECT count(*) FROM pg_replication_slots WHERE active", db="soak"), 60)
        bench.fill()
        for name in (*RECORDERS, *REPLICATES, *(EXACT if kafka is not None else ())):
            p.start(name)
        writer = PgWriter(pg, "soak", s.pg_rate, s.seed)
        bench.start()
        writer.start()
        say(f"soak: topology up in {time.monotonic() - t_start:.0f} s; faults for"
            f" {s.seconds:g} s, seed {s.seed}")
        nemesis = Nemesis(p.kinds(), s.seed, hold=s.hold, gap=s.gap, say=say)
        try:
            nemesis.run(s.seconds)
        finally:
            bench.stop()
            writer.stop()
        report = _check(p, my, target, start, writer, s, say)
        report.update(seed=s.seed, faults=nemesis.counts,
                      fault_log=[i.line() for i in nemesis.log],
                      sysbench_starts=bench.starts, pg_writer_errors=writer.errors,
                      pg_fast_shutdown_hangs=p.pg_shutdown_hangs,
                      wall_s=round(time.monotonic() - t_start, 1))
        return report


def _check(p: Soak, my: MariaDB, target: PostgreSQL, start: tuple[str, int],
           writer: PgWriter, s: Settings, say: Callable[[str], None]) -> dict[str, Any]:
    """Wait (``s.catch_up`` seconds at most) until every recorder holds every committed
    transaction and every replica equals its source; then the counts."""
    committed = {"my": mariadb_committed(my, start, sysbench.DATABASE),
                 "pg": writer.committed()}
    say(f"soak: committed {len(committed['my'])} MariaDB and {len(committed['pg'])}"
        " PostgreSQL transactions; waiting for the consumers to catch up")
    of = {"rec_cluster": "my", "rec_chain": "my", "rec_pg": "pg", "publish": "my",
          "spark": "my"}
    histories = {name: p.history(name) for name in (*RECORDERS, *EXACT) if name in p.procs}
    tables = [(f"sbtest{i}", "id, k, c, pad", "id") for i in range(1, s.tables + 1)]
    replicas = {"rep_my": (my.url_of(sysbench.DATABASE), target.url("rep_mariadb"), tables),
                "rep_pg": (p.pg.url("soak"), target.url("rep_pg"),
                           [("items", "id, v", "id"), ("marks", "tx, xid", "tx")])}
    recorders: dict[str, dict[str, Any]] = {}
    replicated: dict[str, dict[str, Any]] = {}
    t0 = time.monotonic()
    while True:
        # a process that died (a consumer told it cannot go on) fails the run, but the
        # histories are still checked: what they hold up to then is part of the finding
        died = {n: f"exited with {q.returncode}: {_last_line(p.log(n))}"
                for n, q in p.procs.items() if q.poll() is not None}
        for name, h in histories.items():
            recorders[name] = check_history(h.read(), committed[of[name]])
        for name, (src, dst, tabs) in replicas.items():
            if replicated.get(name, {}).get("equal"):
                continue
            differ = []
            for table, cols, key in tabs:
                try:
                    if table_rows(src, table, cols, key) != table_rows(dst, table, cols, key):
                        differ.append(table)
                except sa.exc.DBAPIError:  # not made yet by the replica's first window
                    differ.append(table)
            replicated[name] = {"equal": not differ, "tables_differing": differ}
        done = all(r["lost"] == 0 for r in recorders.values()) and all(
            r["equal"] for r in replicated.values())
        if done or died or time.monotonic() - t0 > s.catch_up:
            break
        time.sleep(2.0)
    say(f"soak: consumers {'caught up' if done else 'did NOT catch up'} in"
        f" {time.monotonic() - t0:.0f} s")
    for name in EXACT:  # what is still incomplete, handed over too; counts exactly once
        exact = histories.get(name)
        if isinstance(exact, PublishedHistory | SparkHistory):
            recorders[name] = _exactly_once(exact, committed["my"])
    bad = sum(r[k] for r in recorders.values()
              for k in ("lost", "torn", "reordered", "phantom"))
    bad += sum(recorders[n]["duplicated"] for n in EXACT if n in recorders)
    if died:
        say(f"soak: processes died: {died}")
    return {"ok": done and bad == 0 and not died,
            "committed": {k: len(v) for k, v in committed.items()},
            "recorders": recorders, "replicates": replicated, "died": died}


def _exactly_once(h: PublishedHistory | SparkHistory, committed: list[Tx]
                  ) -> dict[str, Any]:
    """The checker's counts for a consumer whose effect is exactly once: read to the end
    (incomplete windows too), every copy of a window ``duplicated`` (a failure here), and
    the consumer's own findings (reorders inside a Kafka partition, files the Spark sink
    holds outside its log) added."""
    r = check_history(h.read(final=True), committed)
    r["problems"] = [*r["problems"], *h.problems]
    if isinstance(h, PublishedHistory):
        r["reordered"] += h.reordered
        r["messages"] = h.messages
        h.close()
    else:
        r["uncommitted_files"] = h.uncommitted
    r["copies"] = h.copies
    return r


def _last_line(log: Path) -> str:
    """The last line of a process's log (its error, for one that died)."""
    try:
        with log.open("rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 4096))
            lines = f.read().decode(errors="replace").strip().splitlines()
    except OSError:
        return "(no log)"
    return lines[-1][:500] if lines else "(empty log)"


def main() -> None:
    ap = argparse.ArgumentParser(description="record a relay's windows for the soak")
    ap.add_argument("--relay", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--checkpoint", required=True)
    args = ap.parse_args()
    DatabusClient(ClientConfig(relay=args.relay, poll_timeout=1.0, http_timeout=TIMEOUT),
                  HistoryRecorder(args.out), FileCheckpointStore(args.checkpoint)).run()


if __name__ == "__main__":
    main()
