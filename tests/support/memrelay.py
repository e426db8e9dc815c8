"""An in-memory relay for client tests: serves windows built in the test over the relay's
HTTP protocol (/sources, /register, /stream), with hooks to fail or delay requests.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from databus.core import event as ev
from databus.core.checkpoint import Checkpoint
from databus.core.errors import DatabusError, InvalidRequestError, ScnNotFoundError
from databus.core.filters import ServerFilter
from databus.core.schema import ColumnSpec, SchemaRegistry, TableSchema, table_schema
from tests.support.wait import wait_until

CUSTOMERS = TableSchema(
    src_id=1, name="shop.customers", version=1,
    avro=table_schema("shop", "customers", [
        ColumnSpec("id", "long", nullable=False),
        ColumnSpec("name", "string"),
        ColumnSpec("balance", "double"),
    ]),
    key_columns=("id",),
)


ITEMS = TableSchema(
    src_id=2, name="shop.items", version=1,
    avro=table_schema("shop", "items", [
        ColumnSpec("order_id", "long", nullable=False),
        ColumnSpec("line", "int", nullable=False),
        ColumnSpec("sku", "string"),
        ColumnSpec("qty", "int"),
    ]),
    key_columns=("order_id", "line"),
)


SOURCES = [(1, "shop.customers"), (2, "shop.items")]


_META = SchemaRegistry().metadata


def key_of(schema: TableSchema, row: dict[str, Any]) -> int | bytes:
    """Event key: the int for one integer key column, else JSON bytes of the values."""
    vals = [row[k] for k in schema.key_columns]
    if len(vals) == 1 and isinstance(vals[0], int):
        return int(vals[0])
    return json.dumps(vals, separators=(",", ":")).encode()


def data_event(schema: TableSchema, scn: int, op: ev.Op, row: dict[str, Any] | None,
               before: dict[str, Any] | None = None, *, row_no: int = 0) -> bytes:
    """One encoded data event (``row`` is the before image for deletes)."""
    meta = {"before": schema.encode(before) if before is not None else None,
            "txid": f"tx{scn}", "file": None, "pos": None, "gtid": None, "server_id": None,
            "row": row_no}
    payload = schema.encode(row) if row is not None else b""
    key = key_of(schema, row if row is not None else (before or {}))
    return ev.encode(scn=scn, src_id=schema.src_id, key=key, payload=payload,
                     schema_id=schema.id, schema_version=schema.version, op=op,
                     timestamp_ns=scn * 1_000_000, metadata=_META.encode(meta),
                     metadata_schema_id=_META.id)


def customer(scn: int, cid: int, name: str = "n", op: ev.Op = ev.Op.INSERT,
             balance: float | None = 1.5) -> bytes:
    row = {"id": cid, "name": name, "balance": balance}
    if op == ev.Op.DELETE:
        return data_event(CUSTOMERS, scn, op, {"id": cid, "name": None, "balance": None})
    return data_event(CUSTOMERS, scn, op, row)


def item(scn: int, order_id: int, line: int, qty: int = 1, op: ev.Op = ev.Op.INSERT) -> bytes:
    row = {"order_id": order_id, "line": line, "sku": f"sku-{order_id}-{line}", "qty": qty}
    return data_event(ITEMS, scn, op, row)


@dataclass
class _Window:
    scn: int
    events: list[bytes]
    eop: bytes


@dataclass
class MemoryRelay:
    """Windows in memory behind the relay's HTTP contract."""

    schemas: list[TableSchema] = field(default_factory=lambda: [CUSTOMERS, ITEMS])
    sources: list[tuple[int, str]] = field(default_factory=lambda: list(SOURCES))

    def __post_init__(self) -> None:
        self.registry = SchemaRegistry(self.schemas)
        self.windows: list[_Window] = []
        self.trimmed_scn = -1  # windows up to here were dropped
        self.fail_next = 0  # answer this many /stream requests with 503
        self.inject: list[tuple[int, bytes]] = []  # (status, body) answered before anything
        self.stream_requests: list[dict[str, str]] = []
        self._lock = threading.Lock()
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None

    # -- content --------------------------------------------------------------

    def add_window(self, scn: int, events: list[bytes]) -> None:
        with self._lock:
            assert not self.windows or scn > self.windows[-1].scn
            self.windows.append(_Window(scn, list(events), ev.encode_eop(scn, scn * 1_000_000)))

    def trim(self, upto_scn: int) -> None:
        with self._lock:
            self.windows = [w for w in self.windows if w.scn > upto_scn]
            self.trimmed_scn = max(self.trimmed_scn, upto_scn)

    @property
    def max_scn(self) -> int:
        return self.windows[-1].scn if self.windows else self.trimmed_scn

    def read(self, cp: Checkpoint, size: int, srcs: set[int] | None,
             filt: ServerFilter | None) -> bytes:
        if not cp.is_flexible and (cp.window_scn < self.trimmed_scn or (
                cp.in_window and cp.window_scn <= self.trimmed_scn)):
            raise ScnNotFoundError(
                f"checkpoint scn {cp.window_scn} is older than the oldest window "
                f"(after {self.trimmed_scn})")
        out = bytearray()
        with self._lock:
            windows = list(self.windows)
        for w in windows:
            if not cp.is_flexible and (
                    w.scn < cp.window_scn or (w.scn == cp.window_scn and not cp.in_window)):
                continue
            chosen = [e for e in w.events
                      if (srcs is None or ev.peek_src_id(e) in srcs)
                      and (filt is None or filt.matches(ev.peek_src_id(e), ev.peek_key(e)))]
            if cp.in_window and w.scn == cp.window_scn:
                chosen = chosen[cp.window_offset:]
            whole = b"".join(chosen) + w.eop
            if len(out) + len(whole) <= size:
                out += whole
                continue
            if not out:  # a window larger than size: a prefix of it
                for e in chosen:
                    if out and len(out) + len(e) > size:
                        break
                    out += e
            break
        return bytes(out)

    # -- HTTP ------------------------------------------------------------------

    def app(self) -> Starlette:
        def err(exc: DatabusError) -> JSONResponse:
            return JSONResponse({"error": exc.code, "message": str(exc)},
                                status_code=exc.http_status)

        async def sources(_: Request) -> Response:
            return JSONResponse([{"id": i, "name": n} for i, n in self.sources])

        async def register(request: Request) -> Response:
            raw = request.query_params.get("sources")
            ids = [int(x) for x in raw.split(",")] if raw else None
            return Response(self.registry.to_json(ids), media_type="application/json")

        async def stream(request: Request) -> Response:
            q = request.query_params
            self.stream_requests.append(dict(q))
            if self.inject:
                status, body = self.inject.pop(0)
                return Response(body, status_code=status)
            if self.fail_next > 0:
                self.fail_next -= 1
                return JSONResponse({"error": "InternalError", "message": "injected"},
                                    status_code=503)
            try:
                cp = (Checkpoint.from_json(q["checkPoint"]) if q.get("checkPoint")
                      else Checkpoint.flexible())
                if cp.is_flexible and q.get("streamFromLatestScn") == "true":
                    cp = Checkpoint.after(self.max_scn)
                srcs = {int(x) for x in q["sources"].split(",")} if q.get("sources") else None
                filt = ServerFilter.parse(q["filters"]) if q.get("filters") else None
                size = int(q.get("size", "1048576"))
                if size <= 0:
                    raise InvalidRequestError("size must be positive")
                deadline = time.monotonic() + float(q.get("timeout", "0"))
                while True:
                    data = self.read(cp, size, srcs, filt)
                    if data or time.monotonic() >= deadline:
                        break
                    await asyncio.sleep(0.01)
            except DatabusError as exc:
                return err(exc)
            return Response(data, media_type="application/octet-stream",
                            headers={"X-Databus-Max-Scn": str(self.max_scn)})

        return Starlette(routes=[Route("/sources", sources), Route("/register", register),
                                 Route("/stream", stream)])

    def start(self) -> MemoryRelay:
        self._sock = socket.create_server(("127.0.0.1", 0))
        cfg = uvicorn.Config(self.app(), log_level="warning", lifespan="off", access_log=False)
        self._server = uvicorn.Server(cfg)
        self._thread = threading.Thread(target=self._server.run,
                                        kwargs={"sockets": [self._sock]}, daemon=True)
        self._thread.start()
        wait_until(lambda: self._server.started, 10, "the memory relay to start",
                   interval=0.01)
        return self

    def __enter__(self) -> MemoryRelay:
        """Started (unless it already was); stopped at exit."""
        return self if self._thread is not None else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(10)
        if self._sock is not None:
            self._sock.close()

    @property
    def url(self) -> str:
        assert self._sock is not None
        return f"http://127.0.0.1:{self._sock.getsockname()[1]}"
