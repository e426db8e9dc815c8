"""Bootstrap snapshot throughput: rows/s delivered to one consumer.

A bootstrap store holds N snapshot rows (a 4-column table, ~150-byte events).
A real bootstrap server (its own process) serves them over loopback HTTP; one
:class:`~databus.client.DatabusClient` (a new consumer configured to
bootstrap) receives every row through ``on_bootstrap_event`` - CRCs checked,
batches parsed, checkpoint persisted (in memory) after each batch - and
decodes each row's Avro (``event.after``); a third figure receives them through
the batch callback ``on_bootstrap_events`` and decodes each batch to columns
(``batch.columns``).

Baseline (same run, same table, same driver): a plain ``SELECT *`` of the
snapshot table through the store's SQLAlchemy engine, rows fetched and
dropped. The ratio consumer/baseline is what serving the snapshot to a
consumer costs against merely reading it out of the database.

    .venv/bin/python -m bench.bootstrap_snapshot [--rows 200000] [--batch 10000]
        [--runs 3] [--store sqlite | postgresql | mariadb | <SQLAlchemy URL>]

``--store postgresql`` / ``--store mariadb`` start a private server for the run
(``tests/support/postgres.py``, ``tests/support/mariadb.py``: temporary
directory, free port, stopped after), so the command needs no system service;
a URL uses that database as it is. Each figure is the best of ``--runs``
interleaved runs. The last line is machine-readable: ``RESULT {"store": ...,
"ratio": {"events": r, "decoded": r, ...}, "rows_per_s": {...}}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import uvicorn

from databus.bootstrap.server import BootstrapServer, build_app
from databus.bootstrap.store import BootstrapStore, key_bytes
from databus.client import (
    ClientConfig,
    Consumer,
    DataBatch,
    DatabusClient,
    DataEvent,
    MemoryCheckpointStore,
)
from databus.core import event as ev
from databus.core.schema import ColumnSpec, SchemaRegistry, TableSchema, table_schema


class Count(Consumer):
    def __init__(self, decode: bool, stop: threading.Event) -> None:
        self.rows = 0
        self.decode = decode
        self.stop = stop

    def on_bootstrap_event(self, event: DataEvent) -> None:
        if not self.decode or event.after is not None:
            self.rows += 1

    def on_end_bootstrap(self) -> None:
        self.stop.set()  # measure the snapshot (and its empty catch-up) only


class CountBatches(Count):
    """The batch callback: each run of rows decoded to columns (``batch.columns``)."""

    def on_bootstrap_events(self, batch: DataBatch) -> None:
        cols = batch.columns
        self.rows += len(cols["id"])


def fill(store: BootstrapStore, rows: int) -> None:
    schema = TableSchema(1, "bench.rows", 1, table_schema("bench", "rows", [
        ColumnSpec("id", "long", nullable=False), ColumnSpec("name", "string"),
        ColumnSpec("amount", "double"), ColumnSpec("note", "string")]), ("id",))
    reg = SchemaRegistry([schema])
    store.put("sources", json.dumps([{"id": 1, "name": "bench.rows"}]))
    store.put("registry", reg.to_json())
    store.start_initial_load()
    batch = []
    for key in range(1, rows + 1):
        payload = schema.encode({"id": key, "name": f"name-{key}", "amount": key * 1.5,
                                 "note": "x" * 60})
        batch.append({"src": 1, "k": key_bytes(key), "scn": 1, "ev": ev.encode(
            scn=1, src_id=1, key=key, payload=payload, schema_id=schema.id, op=ev.Op.READ,
            extra_attributes=ev.ATTR_SNAPSHOT)})
        if len(batch) == 10_000:
            store.load_rows(batch)
            batch = []
    if batch:
        store.load_rows(batch)
    store.finish_initial_load(1)


def serve_forever(url: str, port: int) -> None:
    """The server process: a bootstrap server over the store at ``url``."""
    store = BootstrapStore(url)
    sock = socket.create_server(("127.0.0.1", port))
    server = uvicorn.Server(uvicorn.Config(build_app(BootstrapServer(store)),
                                           log_level="warning", lifespan="off"))
    asyncio.run(server.serve(sockets=[sock]))


def serve(url: str) -> tuple[subprocess.Popen[bytes], str]:
    """A bootstrap server in its own process, as deployed."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "bench.bootstrap_snapshot", "--serve", url,
                             "--port", str(port)])
    http = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            httpx.get(f"{http}/admin", timeout=1)
            return proc, http
        except httpx.TransportError:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("bench server did not start") from None
            time.sleep(0.05)


def consume(url: str, batch: int, decode: bool, batches: bool = False) -> tuple[int, float]:
    stop = threading.Event()
    consumer = CountBatches(True, stop) if batches else Count(decode, stop)
    cfg = ClientConfig(relay=url, bootstrap_url=url, bootstrap_batch_size=batch,
                       poll_timeout=0.1)
    t0 = time.perf_counter()
    DatabusClient(cfg, consumer, MemoryCheckpointStore()).run(stop=stop)
    return consumer.rows, time.perf_counter() - t0


@contextmanager
def store_url(spec: str | None, tmp: Path) -> Iterator[str]:
    """The store URL for ``--store``: a temporary SQLite file, a fresh database on
    a private PostgreSQL or MariaDB server (stopped at exit), or a URL as given."""
    if spec in (None, "sqlite"):
        yield f"sqlite:///{tmp / 'bs.db'}"
    elif spec in ("postgresql", "postgres"):
        from tests.support.postgres import PostgreSQL

        with PostgreSQL() as pg, pg.fresh_database("bench_bs") as url:
            yield url
    elif spec in ("mariadb", "mysql"):
        from tests.support.mariadb import MariaDB

        # no binlog: the store is not a capture source here
        with MariaDB(tmp / "mariadb", settings={}) as db, db.fresh_database("bench_bs") as url:
            yield url
    else:
        yield spec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--store", default=None,
                    help="sqlite (default, a temporary file), postgresql or mariadb (a "
                         "private server started for the run), or a store URL")
    ap.add_argument("--serve", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve_forever(args.serve, args.port)
        return
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        url = stack.enter_context(store_url(args.store, Path(tmp)))
        store = BootstrapStore(url)
        fill(store, args.rows)
        proc, http = serve(url)
        try:
            # best of --runs each, interleaved: the machine is shared, so the
            # fastest run is the one least disturbed by others
            n_sel, t_sel = n_raw, t_raw = n_dec, t_dec = n_bat, t_bat = 0, float("inf")
            store.select_all_snapshot()  # warm the page cache
            for _ in range(args.runs):
                t0 = time.perf_counter()
                n_sel = store.select_all_snapshot()
                t_sel = min(t_sel, time.perf_counter() - t0)
                n_raw, t = consume(http, args.batch, decode=False)
                t_raw = min(t_raw, t)
                n_dec, t = consume(http, args.batch, decode=True)
                t_dec = min(t_dec, t)
                n_bat, t = consume(http, args.batch, decode=True, batches=True)
                t_bat = min(t_bat, t)
        finally:
            proc.terminate()
            proc.wait(30)
            store.close()
    assert n_sel == n_raw == n_dec == n_bat == args.rows, (n_sel, n_raw, n_dec, n_bat)
    base = n_sel / t_sel
    rates = {"events": n_raw / t_raw, "decoded": n_dec / t_dec, "batch": n_bat / t_bat}
    print(f"{args.rows} snapshot rows, store {store.dialect}, batch {args.batch}, "
          f"best of {args.runs}")
    print(f"consumer, events only (HTTP+CRC+callbacks):   {rates['events']:>10,.0f} rows/s")
    print(f"consumer, rows Avro-decoded (event.after):    {rates['decoded']:>10,.0f} rows/s")
    print(f"consumer, batches to columns (batch.columns): {rates['batch']:>10,.0f} rows/s")
    print(f"baseline: SELECT * through the same driver:   {base:>10,.0f} rows/s")
    print("ratio consumer/baseline: " + ", ".join(f"{r / base:.2f} ({k})"
                                                  for k, r in rates.items()))
    print("RESULT " + json.dumps({
        "store": store.dialect, "rows": args.rows, "batch": args.batch, "runs": args.runs,
        "ratio": {k: round(r / base, 3) for k, r in rates.items()},
        "rows_per_s": {**{k: round(r) for k, r in rates.items()}, "select": round(base)}}))

if __name__ == "__main__":
    main()
