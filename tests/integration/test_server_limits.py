"""The limits every server applies to hostile or broken clients, on a real relay:
request body size (413 before the body is read whole), header size, connections,
idle keep-alive connections, clients that send slowly (a request head or a body not
whole within ``read_timeout``: cut, 408 for a body), and a client that stops reading
a /stream answer (cut after ``send_timeout``; the same checkpoint then reads the
same bytes)."""

from __future__ import annotations

import socket
import sqlite3
import time
from collections.abc import Iterator

import httpx
import pytest

from databus.relay.relay import Relay
from tests.support.relays import make_relay
from tests.support.shop import create_shop
from tests.support.wait import wait_until

ROWS, PAYLOAD = 800, 10_000  # 8 MB of events: more than loopback socket buffers hold


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Relay]:
    tmp = tmp_path_factory.mktemp("limits")
    db = tmp / "shop.db"
    create_shop(db)
    relay = make_relay(db, tmp, capacity_bytes=32 << 20, http={
        "max_body_bytes": 4096, "max_header_bytes": 8192, "max_connections": 20,
        "idle_timeout": 1.0, "send_timeout": 1.0, "read_timeout": 1.0})
    with relay:
        with sqlite3.connect(db) as con:
            con.executemany("INSERT INTO orders (id, customer_id, note, payload, tx)"
                            " VALUES (?, 0, 'x', ?, 0)",
                            [(i, b"p" * PAYLOAD) for i in range(ROWS)])
        wait_until(lambda: relay.buffer.max_scn >= 0 and _stream_len(relay) > ROWS * PAYLOAD,
                   60, "the rows in the buffer")
        yield relay


def _stream_len(relay: Relay) -> int:
    r = httpx.get(f"{relay.url}/stream", params={"size": str(64 << 20), "timeout": "0"},
                  timeout=30)
    return len(r.content)


def _raw(relay: Relay, request: bytes, rcvbuf: int | None = None) -> socket.socket:
    s = socket.socket()
    if rcvbuf is not None:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.connect(("127.0.0.1", relay.port))
    s.sendall(request)
    return s


def _read_all(s: socket.socket, timeout: float) -> bytes:
    s.settimeout(timeout)
    out = bytearray()
    while True:
        try:
            chunk = s.recv(1 << 16)
        except (TimeoutError, ConnectionResetError):
            break
        if not chunk:
            break
        out += chunk
    return bytes(out)


def test_a_client_that_stops_reading_is_cut_and_others_are_served(limited: Relay) -> None:
    request = (f"GET /stream?size={64 << 20}&timeout=0 HTTP/1.1\r\nHost: 127.0.0.1\r\n"
               "\r\n").encode()
    with _raw(limited, request, rcvbuf=4096) as stalled:
        time.sleep(0.5)
        # while it stalls, the relay answers everyone else
        t0 = time.monotonic()
        assert httpx.get(f"{limited.url}/sources", timeout=10).status_code == 200
        assert time.monotonic() - t0 < 2
        time.sleep(2.5)  # send_timeout is 1 s: by now the relay has cut it
        got = _read_all(stalled, timeout=5)
    head, _, body = got.partition(b"\r\n\r\n")
    length = int(next(h.split(b":")[1] for h in head.split(b"\r\n")
                      if h.lower().startswith(b"content-length")))
    assert length > ROWS * PAYLOAD
    assert len(body) < length, "the stalled client got the whole answer: it was not cut"
    # the same request again (the client's checkpoint did not move) reads it all
    assert _stream_len(limited) == length


def test_a_body_over_the_limit_is_413_before_it_is_read(limited: Relay) -> None:
    big = b"{" + b" " * 10_000 + b"}"
    r = httpx.post(f"{limited.url}/signal", content=big, timeout=10,
                   headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and r.json()["error"] == "PayloadTooLarge"

    def chunks() -> Iterator[bytes]:
        yield b'{"type": "execute-snapshot", "data": {"x": "'
        for _ in range(100):
            yield b"y" * 1000
        yield b'"}}'

    r = httpx.post(f"{limited.url}/signal", content=chunks(), timeout=10,
                   headers={"Content-Type": "application/json"})
    assert r.status_code == 413, r.text
    # a claimed length is refused without waiting for the bytes
    s = _raw(limited, b"POST /signal HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/"
             b"json\r\nContent-Length: 300000000\r\n\r\n")
    with s:
        assert b" 413 " in _read_all(s, timeout=5).split(b"\r\n")[0]


def test_oversized_headers_are_refused(limited: Relay) -> None:
    s = _raw(limited, b"GET /sources HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: "
             + b"a" * 20_000 + b"\r\n\r\n")
    with s:
        status = _read_all(s, timeout=5).split(b"\r\n")[0]
    assert status.startswith(b"HTTP/1.1 4"), status
    assert httpx.get(f"{limited.url}/sources", timeout=10).status_code == 200


def test_idle_connections_are_closed(limited: Relay) -> None:
    s = _raw(limited, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    with s:
        t0 = time.monotonic()
        got = _read_all(s, timeout=10)  # returns at the server's close
        waited = time.monotonic() - t0
    assert b" 200 " in got.split(b"\r\n")[0]
    assert waited < 5, f"an idle keep-alive connection stayed open {waited:.1f} s"


@pytest.mark.parametrize("sent", [
    b"",  # connects and says nothing
    b"GET /sources HTTP/1.1\r\nHost: 127.0.0.1\r\n",  # a head that never ends
], ids=["nothing", "partial-head"])
def test_a_client_that_sends_no_whole_request_is_cut(limited: Relay, sent: bytes) -> None:
    t0 = time.monotonic()
    with _raw(limited, sent) as s:
        got = _read_all(s, timeout=15)  # returns when the server closes
    waited = time.monotonic() - t0
    assert got == b"" and waited < 10, f"held {waited:.1f} s, got {got[:60]!r}"


def test_the_head_deadline_runs_from_the_end_of_each_answer(limited: Relay) -> None:
    """A keep-alive connection asking back to back for longer than read_timeout (1 s)
    is never cut: each answer's end moves its deadline."""
    ports = []
    with httpx.Client(base_url=limited.url, timeout=10) as c:
        t0 = time.monotonic()
        while time.monotonic() - t0 < 2.5:
            r = c.get("/sources")
            assert r.status_code == 200
            ports.append(r.extensions["network_stream"].get_extra_info("client_addr")[1])
            time.sleep(0.05)
    assert len(ports) > 10 and len(set(ports)) == 1, "the connection was cut and made again"


def test_a_trickled_head_is_cut_at_its_deadline(limited: Relay) -> None:
    """The deadline is for the whole head: a byte every 0.3 s does not extend it."""
    t0 = time.monotonic()
    with _raw(limited, b"G") as s:
        try:
            for b in b"ET /sources HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 60:
                time.sleep(0.3)
                s.sendall(bytes([b]))
        except (BrokenPipeError, ConnectionResetError):
            pass
        got = _read_all(s, timeout=5)
    assert b" 200 " not in got and time.monotonic() - t0 < 10


def test_a_body_that_stalls_is_408_and_the_server_goes_on(limited: Relay) -> None:
    s = _raw(limited, b"POST /signal HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
             b"application/json\r\nContent-Length: 100\r\n\r\n{\"type\"")
    t0 = time.monotonic()
    with s:
        got = _read_all(s, timeout=15)
    assert got.split(b"\r\n")[0].startswith(b"HTTP/1.1 408"), got[:100]
    assert b"RequestTimeout" in got and time.monotonic() - t0 < 10
    # a long poll outlives read_timeout: the deadline is for sending, not for waiting
    r = httpx.get(f"{limited.url}/stream", params={"timeout": "2.5",
                                                   "streamFromLatestScn": "true"}, timeout=30)
    assert r.status_code == 200


def test_connections_over_the_limit_get_503(limited: Relay) -> None:
    # long polls at the newest window: each holds its connection for 4 s
    def hold() -> socket.socket:
        return _raw(limited, b"GET /stream?timeout=4&streamFromLatestScn=true HTTP/1.1\r\n"
                    b"Host: 127.0.0.1\r\nConnection: close\r\n\r\n")

    # uvicorn counts open connections: 40 accepted in one batch (a busy machine) would all
    # get 503. The first 10 are served before the rest arrive: /health answers only after
    # the server has taken the connections queued before it.
    holders = [hold() for _ in range(10)]
    assert httpx.get(f"{limited.url}/health", timeout=30).status_code == 200
    holders += [hold() for _ in range(30)]
    try:
        answers = [_read_all(s, timeout=10).split(b"\r\n")[0] for s in holders]
    finally:
        for s in holders:
            s.close()
    assert any(b" 503 " in a for a in answers), answers[:3]
    assert any(b" 200 " in a for a in answers), answers[:10]
    assert httpx.get(f"{limited.url}/sources", timeout=10).status_code == 200
