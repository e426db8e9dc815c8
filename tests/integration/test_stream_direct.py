"""``GET /stream`` answered on the connection (databus.serving.direct, databus.relay.stream):
the same bytes as the ASGI route for every kind of request (tokens included),
pipelined requests in order, a head arriving in parts, long polls woken by an append
(many at once), a client that leaves while it waits, and a shutdown that answers the
waiting polls. A request with a body (``Content-Length: 1``) is not plain, so it
takes the ASGI route: the same request with and without it compares the two routes.
One with ``Content-Length: 0`` (Java's HttpClient sends it with every GET) is plain."""

from __future__ import annotations

import json
import re
import socket
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest

from databus.core.checkpoint import Checkpoint
from databus.relay.relay import Relay
from tests.support.relays import make_relay
from tests.support.shop import create_shop
from tests.support.tls import add_token
from tests.support.wait import wait_until


def _write(db: Path, start: int, n: int) -> None:
    with sqlite3.connect(db) as con:
        for i in range(start, start + n):
            con.execute("INSERT INTO customers VALUES (?, ?, 0, 0)", (i, f"c{i}"))
            con.execute("INSERT INTO orders (id, customer_id, note, tx) VALUES (?, ?, 'n', 0)",
                        (i, i))
            con.commit()
            time.sleep(0.05)  # a window each (the txlog reader joins what it finds at once)


class Secured:
    def __init__(self, relay: Relay, db: Path, tokens: dict[str, str]) -> None:
        self.relay, self.db, self.tokens = relay, db, tokens


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    tmp = tmp_path_factory.mktemp("direct")
    db = tmp / "shop.db"
    create_shop(db)
    token_file = tmp / "tokens.jsonl"
    tokens = {"orders": add_token(token_file, "orders", "--tables", r"main\.orders"),
              "admin": add_token(token_file, "admin", "--tables", ".*", "--admin")}
    relay = make_relay(db, tmp, http={"token_file": str(token_file)})
    with relay:
        _write(db, 0, 20)
        wait_until(lambda: relay.buffer.stats()["windows"] >= 10, 30, "10 windows")
        yield Secured(relay, db, tokens)


def _request(target: str, token: str | None = None, extra: bytes = b"") -> bytes:
    auth = f"Authorization: Bearer {token}\r\n".encode() if token else b""
    return (f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode() + auth
            + b"Accept: */*\r\nConnection: keep-alive\r\n" + extra + b"\r\n")


def _read_answer(s: socket.socket, buf: bytearray) -> bytes:
    """One answer off ``s`` (``buf`` keeps what follows it)."""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        assert chunk, f"closed before an answer: {bytes(buf)!r}"
        buf += chunk
    end = buf.index(b"\r\n\r\n") + 4
    length = next(int(line.split(b":")[1]) for line in bytes(buf[:end]).split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(buf) < end + length:
        chunk = s.recv(65536)
        assert chunk, "closed inside an answer"
        buf += chunk
    answer = bytes(buf[:end + length])
    del buf[:end + length]
    return answer


def _ask(relay: Relay, *requests: bytes, timeout: float = 30) -> list[bytes]:
    """Send ``requests`` on one connection (pipelined), return their answers."""
    with socket.create_connection(("127.0.0.1", relay.port), timeout=timeout) as s:
        s.sendall(b"".join(requests))
        buf = bytearray()
        return [_read_answer(s, buf) for _ in requests]


def _without_date(answer: bytes) -> bytes:
    """``answer`` without its times: the ``date`` header, and the time a JSON envelope
    was made (its top-level ``ts_ms``)."""
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = [line for line in head.split(b"\r\n") if not line.lower().startswith(b"date:")]
    body = re.sub(rb'("op":"[a-z]","ts_ms":)[0-9]+', rb"\1", body)
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def _cp(scn: int) -> str:
    return quote(Checkpoint.flexible().window_done(scn).to_json())


CASES = {
    "everything": ("/stream?size=100000&timeout=0", "admin"),
    "partial window": ("/stream?size=300&timeout=0", "admin"),
    "after a checkpoint": ("/stream?timeout=0&checkPoint={cp}", "admin"),
    "a restricted token (selects its tables)": ("/stream?timeout=0", "orders"),
    "json": ("/stream?timeout=0&output=json&transactions=true", "admin"),
    "nothing new": ("/stream?timeout=0&streamFromLatestScn=true", "admin"),
    "no token": ("/stream?timeout=0", None),
    "an unknown token": ("/stream?timeout=0", "nobody.secret"),
    "a table the token may not read": ("/stream?timeout=0&sources=1", "orders"),
    "a bad checkpoint": ("/stream?timeout=0&checkPoint=%7Bnot-json", "admin"),
    "a bad size": ("/stream?size=0", "admin"),
    "a bad timeout": ("/stream?timeout=nan", "admin"),
    "a bad output": ("/stream?output=xml", "admin"),
    "an unknown source": ("/stream?sources=999", "admin"),
    "a member without an admin token": ("/stream?timeout=0", "orders"),
    "a checkpoint past the buffer": ("/stream?timeout=0&checkPoint={far}", "admin"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_direct_answer_is_byte_for_byte_the_asgi_answer(secured: Secured, case: str) -> None:
    target, who = CASES[case]
    relay = secured.relay
    target = target.format(cp=_cp(relay.buffer.min_scn + 3), far=_cp(relay.buffer.max_scn + 99))
    token = secured.tokens.get(who, who) if who else None
    extra = b"X-Databus-Member: m1\r\n" if "member" in case else b""
    # a body (one byte, ignored) makes h11 take the request
    direct, asgi = _ask(relay, _request(target, token, extra),
                        _request(target, token, extra + b"Content-Length: 1\r\n") + b"x")
    assert _without_date(direct) == _without_date(asgi)
    assert direct.split(b"\r\n")[1].startswith((b"server: uvicorn", b"date: "))


def test_the_answers_keep_their_status_and_auth_header(secured: Secured) -> None:
    relay = secured.relay
    (no_token,) = _ask(relay, _request("/stream?timeout=0"))
    assert no_token.startswith(b"HTTP/1.1 401 Unauthorized\r\n")
    assert b'\r\nwww-authenticate: Bearer realm="databus"\r\n' in no_token
    (ok,) = _ask(relay, _request("/stream?timeout=0", secured.tokens["admin"]))
    assert ok.startswith(b"HTTP/1.1 200 OK\r\n") and len(ok.partition(b"\r\n\r\n")[2]) > 1000


def test_pipelined_requests_are_answered_in_order(secured: Secured) -> None:
    relay = secured.relay
    token = secured.tokens["admin"]
    targets = [f"/stream?timeout=0&size=2000&checkPoint={_cp(relay.buffer.min_scn + i)}"
               for i in range(5)]
    together = _ask(relay, *(_request(t, token) for t in targets), _request("/sources", token))
    alone = [_ask(relay, _request(t, token))[0] for t in targets]
    assert [_without_date(a) for a in together[:5]] == [_without_date(a) for a in alone]
    assert json.loads(together[5].partition(b"\r\n\r\n")[2])  # then an ASGI request


def test_a_head_in_parts_is_answered_once_whole(secured: Secured) -> None:
    relay = secured.relay
    request = _request("/stream?timeout=0", secured.tokens["admin"])
    with socket.create_connection(("127.0.0.1", relay.port), timeout=30) as s:
        for part in (request[:3], request[3:20], request[20:]):
            s.sendall(part)
            time.sleep(0.05)
        answer = _read_answer(s, bytearray())
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n")


def test_head_requests_take_the_asgi_route(secured: Secured) -> None:
    relay = secured.relay
    with socket.create_connection(("127.0.0.1", relay.port), timeout=30) as s:
        s.sendall(_request("/stream?timeout=0", secured.tokens["admin"]).replace(b"GET", b"HEAD"))
        time.sleep(0.5)
        head = s.recv(65536)
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and head.endswith(b"\r\n\r\n")


def _long_poll(relay: Relay, token: str, after: int, out: list[tuple[float, bytes]]) -> None:
    (answer,) = _ask(relay, _request(f"/stream?timeout=20&checkPoint={_cp(after)}", token))
    out.append((time.monotonic(), answer))


def test_long_polls_wake_together_at_an_append(secured: Secured) -> None:
    relay = secured.relay
    token = secured.tokens["admin"]
    latest = relay.buffer.max_scn
    answers: list[tuple[float, bytes]] = []
    threads = [threading.Thread(target=_long_poll, args=(relay, token, latest, answers))
               for _ in range(30)]
    for t in threads:
        t.start()
    time.sleep(1.0)  # all of them waiting
    assert not answers
    t0 = time.monotonic()
    _write(secured.db, 1000, 1)
    for t in threads:
        t.join(30)
    assert len(answers) == 30
    for at, answer in answers:
        assert answer.startswith(b"HTTP/1.1 200 OK\r\n")
        assert len(answer.partition(b"\r\n\r\n")[2]) > 0, "woken without the new window"
        assert at - t0 < 10


def test_a_client_that_leaves_while_waiting_costs_nothing_after(secured: Secured) -> None:
    relay = secured.relay
    token = secured.tokens["admin"]
    for _ in range(5):
        s = socket.create_connection(("127.0.0.1", relay.port), timeout=30)
        s.sendall(_request(f"/stream?timeout=20&checkPoint={_cp(relay.buffer.max_scn)}", token))
        s.close()
    time.sleep(0.3)
    _write(secured.db, 2000, 1)
    (answer,) = _ask(relay, _request("/stream?timeout=0", token))
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n")


def test_a_shutdown_answers_the_waiting_polls(tmp_path: Path) -> None:
    db = tmp_path / "shop.db"
    create_shop(db)
    relay = make_relay(db, tmp_path)
    relay.start()
    try:
        _write(db, 0, 2)
        wait_until(lambda: relay.buffer.max_scn > 0, 30, "a window")
        answers: list[tuple[float, bytes]] = []
        threads = [threading.Thread(target=_long_poll,
                                    args=(relay, "", relay.buffer.max_scn, answers))
                   for _ in range(5)]
        for t in threads:
            t.start()
        time.sleep(0.5)
    finally:
        t0 = time.monotonic()
        relay.stop()
    assert time.monotonic() - t0 < 10
    for t in threads:
        t.join(10)
    assert len(answers) == 5
    assert all(a.startswith(b"HTTP/1.1 200 OK\r\n") for _, a in answers)


def test_after_a_direct_answer_an_idle_connection_is_closed(tmp_path: Path) -> None:
    db = tmp_path / "shop.db"
    create_shop(db)
    relay = make_relay(db, tmp_path, http={"idle_timeout": 1.0, "read_timeout": 3.0})
    with relay, socket.create_connection(("127.0.0.1", relay.port), timeout=30) as s:
        s.sendall(_request("/stream?timeout=0"))
        assert _read_answer(s, bytearray()).startswith(b"HTTP/1.1 200 OK\r\n")
        t0 = time.monotonic()
        assert s.recv(100) == b""  # the server closed it
        waited = time.monotonic() - t0
    assert 0.5 < waited < 2.5, f"closed after {waited:.1f} s (idle_timeout 1 s)"
