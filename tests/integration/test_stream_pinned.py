"""Answers written from pinned views of the relay's buffer (EventBuffer.read_pinned,
the direct route of GET /stream): a client that reads slowly while the writer must
evict the windows it is being sent. The writer waits for the send (the client gets
exactly the bytes of those windows), and cuts a client that stalls past
``pin_grace`` (it gets a prefix of those bytes, never the bytes that replaced them)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from urllib.parse import quote

import pytest

from databus.core import event as ev
from databus.core.checkpoint import Checkpoint
from databus.core.schema import ColumnSpec, SchemaRegistry, TableSchema, table_schema
from databus.core.window import Window
from databus.relay.config import parse_config
from databus.relay.relay import Relay
from databus.sources.base import Source, SourceInfo
from tests.support.wait import wait_until

SCHEMA = TableSchema(1, "pin.rows", 1, table_schema("pin", "rows", [
    ColumnSpec("id", "long", nullable=False), ColumnSpec("note", "string")]), ("id",))
EVENT_NOTE = 12 * 1024  # ~12 KiB events, 10 a window: ~120 KiB windows
CAPACITY = 20 * 1024 * 1024


def window(scn: int, fill: str) -> Window:
    events = [ev.encode(scn=scn, src_id=1, key=scn * 100 + i,
                        payload=SCHEMA.encode({"id": scn * 100 + i, "note": fill * EVENT_NOTE}),
                        schema_id=SCHEMA.id, op=ev.Op.INSERT, timestamp_ns=scn)
              for i in range(10)]
    return Window(scn, b"".join(events), len(events), scn)


class IdleSource(Source):
    """Nothing to capture: the test appends to the buffer itself."""

    def sources(self) -> list[SourceInfo]:
        return [SourceInfo(1, "pin.rows")]

    def registry(self) -> SchemaRegistry:
        return SchemaRegistry([SCHEMA])

    def read(self, after_scn: int, stop: threading.Event, timeout: float) -> list[Window]:
        stop.wait(timeout)
        return []


@pytest.fixture(params=[1, 8], ids=["1MiB-written-at-once", "8MiB-in-parts"])
def relay(request: pytest.FixtureRequest) -> Iterator[Relay]:
    """A relay with a full buffer; ``request.param`` MiB answers. A 1 MiB answer is
    written at once: the server's socket buffer is kept small (accepted sockets
    inherit it from the listening one), so the transport keeps most of it."""
    cfg = parse_config({"source": {"url": "sqlite:///unused", "tables": ["rows"]},
                        "buffer": {"capacity_bytes": CAPACITY}, "http": {"port": 0}})
    relay = Relay(cfg, source=IdleSource())
    relay.answer_size = request.param * 1024 * 1024  # type: ignore[attr-defined]
    with relay:
        if request.param == 1:
            server = relay._server
            assert server is not None
            wait_until(lambda: getattr(server, "servers", None), 10, "uvicorn's servers")
            for listening in server.servers:
                for sock in listening.sockets:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 16 * 1024)
        scn = 0
        while relay.buffer.stats()["evicted_windows"] == 0:  # full, old windows "a"
            scn += 1
            relay.buffer.append_window(window(scn, "a"))
        yield relay


def _size(relay: Relay) -> int:
    size: int = relay.answer_size  # type: ignore[attr-defined]
    return size


def _slow_client(relay: Relay, cp: Checkpoint, extra: bytes = b"",
                 body: bytes = b"") -> socket.socket:
    """A client whose receive buffer holds ~4 KiB: it asks for an answer (``extra``
    ends the request's head, ``body`` follows it) and reads nothing."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    port = int(relay.url.rsplit(":", 1)[1])
    s.connect(("127.0.0.1", port))
    s.sendall(b"GET /stream?size=%d&timeout=0&checkPoint=%s HTTP/1.1\r\nHost: x\r\n%s\r\n%s"
              % (_size(relay), quote(cp.to_json(), safe="").encode(), extra, body))
    return s


def _read_all(s: socket.socket) -> tuple[int, bytes]:
    """(content-length, the body bytes that arrived before the answer ended or the
    connection did)."""
    s.settimeout(30)
    data = b""
    while b"\r\n\r\n" not in data:
        data += s.recv(65536)
    head, body = data.split(b"\r\n\r\n", 1)
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:")))
    while len(body) < length:
        try:
            chunk = s.recv(65536)
        except ConnectionResetError:
            break
        if not chunk:
            break
        body += chunk
    return length, body


def _evict_oldest(relay: Relay, first_scn: int) -> threading.Thread:
    """A writer appending "b" windows until ``first_scn`` is evicted (it waits for pins)."""
    def run() -> None:
        scn = relay.buffer.max_scn
        while relay.buffer.min_scn <= first_scn:
            scn += 1
            relay.buffer.append_window(window(scn, "b"))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_the_writer_waits_for_a_slow_send_and_the_bytes_are_the_evicted_windows(
        relay: Relay) -> None:
    relay.buffer.pin_grace = 30.0
    cp = Checkpoint.flexible()
    expected = relay.buffer.read(cp, _size(relay)).data  # the oldest windows, copied
    first = ev.peek_scn(expected, 0)
    s = _slow_client(relay, cp)
    try:
        wait_until(lambda: relay.buffer.pinned_reads == 1, 10, "the answer pinned")
        time.sleep(0.3)
        assert relay.buffer.pinned_reads == 1  # the transport still holds part of it
        writer = _evict_oldest(relay, first)
        time.sleep(0.5)
        assert writer.is_alive() and relay.buffer.min_scn == first  # waiting for the send
        length, body = _read_all(s)
        writer.join(10)
        assert not writer.is_alive() and relay.buffer.min_scn > first
        assert length == len(expected) and body == expected
        assert relay.buffer.pinned_reads == 0
    finally:
        s.close()


def test_a_client_stalled_past_the_grace_is_cut_and_never_sent_new_bytes(
        relay: Relay) -> None:
    relay.buffer.pin_grace = 0.3
    cp = Checkpoint.flexible()
    expected = relay.buffer.read(cp, _size(relay)).data
    first = ev.peek_scn(expected, 0)
    s = _slow_client(relay, cp)
    try:
        wait_until(lambda: relay.buffer.pinned_reads == 1, 10, "the answer pinned")
        time.sleep(0.3)
        writer = _evict_oldest(relay, first)
        writer.join(10)  # the grace passed, the connection was cut, the writer went on
        assert not writer.is_alive() and relay.buffer.min_scn > first
        assert relay.buffer.pinned_reads == 0
        # the newest window, written over evicted ones, is new
        newest = Checkpoint.after(relay.buffer.max_scn - 1)
        assert b"b" * 100 in relay.buffer.read(newest, 1024 * 1024).data
        length, body = _read_all(s)
        assert length == len(expected) and len(body) < length
        assert body == expected[:len(body)]  # a prefix of the old bytes, never new ones
        assert b"b" * 100 not in body
    finally:
        s.close()
    # the relay goes on serving
    again = relay.buffer.read(Checkpoint.after(relay.buffer.min_scn), 1024 * 1024)
    assert again.events > 0


def test_a_get_with_an_empty_body_is_answered_from_pinned_views(relay: Relay) -> None:
    """``Content-Length: 0`` (Java's HttpClient, the Spark JVM reader's, sends it with
    every GET) takes the direct route: the answer is pinned views of the buffer. A body
    sends the request to the ASGI route, which copies: nothing pinned, same bytes."""
    cp = Checkpoint.flexible()
    expected = relay.buffer.read(cp, _size(relay)).data
    for extra, body, pinned in ((b"Content-Length: 0\r\n", b"", True),
                                (b"Content-Length: 1\r\n", b"x", False)):
        s = _slow_client(relay, cp, extra, body)
        try:
            if pinned:
                wait_until(lambda: relay.buffer.pinned_reads == 1, 10, "the answer pinned")
            else:
                time.sleep(0.5)
                assert relay.buffer.pinned_reads == 0
            length, got = _read_all(s)
            assert length == len(expected) and got == expected
        finally:
            s.close()
        wait_until(lambda: relay.buffer.pinned_reads == 0, 10, "the pin released")
