"""Bootstrap snapshot throughput: rows/s delivered to one consumer.

A bootstrap store holds N snapshot rows (a 4-column table, ~150-byte events).
A real bootstrap server (its own process) serves them over loopback HTTP; one
:class:`~databus.client.DatabusClient` (a new consumer configured to
bootstrap) receives every row through ``on_bootstrap_event`` - CRCs checked,
batches parsed, checkpoint persisted (in memory) after each batch - and
decodes each row's Avro (``event.after``).

Baseline (same run, same table, same driver): a plain ``SELECT *`` of the
snapshot table through the store's SQLAlchemy engine, rows fetched and
dropped. The ratio consumer/baseline is what serving the snapshot to a
consumer costs against merely reading it out of the database.

    .venv/bin/python -m bench.bootstrap_snapshot [--rows 200000] [--batch 10000]
        [--runs 3] [--store sqlite:///path.db | postgresql+psycopg://... | mysql+pymysql://...]

Each figure is the best of ``--runs`` interleaved runs.
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
from pathlib import Path

import httpx
import uvicorn

from databus.bootstrap.server import BootstrapServer, build_app
from databus.bootstrap.store import BootstrapStore, key_bytes
from databus.client import ClientConfig, Consumer, DatabusClient, DataEvent, MemoryCheckpointStore
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


def consume(url: str, batch: int, decode: bool) -> tuple[int, float]:
    stop = threading.Event()
    consumer = Count(decode, stop)
    cfg = ClientConfig(relay_url=url, bootstrap_url=url, bootstrap_batch_size=batch,
                       poll_timeout=0.1)
    t0 = time.perf_counter()
    DatabusClient(cfg, consumer, MemoryCheckpointStore()).run(stop=stop)
    return consumer.rows, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--store", default=None, help="store URL (default: a temporary SQLite)")
    ap.add_argument("--serve", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve_forever(args.serve, args.port)
        return
    with tempfile.TemporaryDirectory() as tmp:
        url = args.store or f"sqlite:///{Path(tmp) / 'bs.db'}"
        store = BootstrapStore(url)
        fill(store, args.rows)
        proc, http = serve(url)
        try:
            # best of --runs each, interleaved: the machine is shared, so the
            # fastest run is the one least disturbed by others
            n_sel, t_sel = n_raw, t_raw = n_dec, t_dec = 0, float("inf")
            store.select_all_snapshot()  # warm the page cache
            for _ in range(args.runs):
                t0 = time.perf_counter()
                n_sel = store.select_all_snapshot()
                t_sel = min(t_sel, time.perf_counter() - t0)
                n_raw, t = consume(http, args.batch, decode=False)
                t_raw = min(t_raw, t)
                n_dec, t = consume(http, args.batch, decode=True)
                t_dec = min(t_dec, t)
        finally:
            proc.terminate()
            proc.wait(30)
            store.close()
    assert n_sel == n_raw == n_dec == args.rows, (n_sel, n_raw, n_dec)
    print(f"{args.rows} snapshot rows, store {store.dialect}, batch {args.batch}")
    print(f"consumer, events only (HTTP+CRC+callbacks):   {n_raw / t_raw:>10,.0f} rows/s")
    print(f"consumer, rows Avro-decoded (event.after):    {n_dec / t_dec:>10,.0f} rows/s")
    print(f"baseline: SELECT * through the same driver:   {n_sel / t_sel:>10,.0f} rows/s")
    print(f"ratio consumer/baseline: {n_raw / t_raw / (n_sel / t_sel):.2f} (events), "
          f"{n_dec / t_dec / (n_sel / t_sel):.2f} (decoded)")


if __name__ == "__main__":
    main()
