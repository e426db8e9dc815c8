"""databus.serving: the error answers, query parameters, lifecycle and loopback rule
the relay and the bootstrap server share, on small services served by a real uvicorn."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from databus.core.errors import ConfigError, UnknownSourceError
from databus.serving import (
    EXCEPTION_HANDLERS,
    HttpServerConfig,
    HttpService,
    bool_param,
    float_param,
    int_param,
    is_loopback,
    json_body,
    source_ids_param,
)


class Probe(HttpService):
    """Endpoints that answer, fail typed, fail unexpectedly, and parse parameters."""

    def __init__(self, port: int = 0) -> None:
        super().__init__(HttpServerConfig(port=port), "probe")
        self.events: list[str] = []
        self.worker = threading.Event()

    def build_app(self) -> Starlette:
        def ok(_: Request) -> Response:
            return JSONResponse({"worker": self.worker.is_set()})

        def typed(_: Request) -> Response:
            raise UnknownSourceError("no source 7")

        def boom(_: Request) -> Response:
            raise RuntimeError("unexpected")

        def params(request: Request) -> Response:
            ids = source_ids_param(request, {1, 2, 3})
            return JSONResponse({
                "n": int_param(request, "n", 5, 1, 10),
                "t": float_param(request, "t", 0.5, 0.0, 2.0),
                "b": bool_param(request, "b"),
                "ids": sorted(ids) if ids is not None else None})

        return Starlette(routes=[Route("/ok", ok), Route("/typed", typed), Route("/boom", boom),
                                 Route("/params", params)],
                         exception_handlers=EXCEPTION_HANDLERS)

    def on_listening(self) -> None:
        self.events.append("listening")
        self.worker.set()

    async def on_shutdown(self) -> None:
        self.events.append("shutdown")


@pytest.fixture
def probe() -> Iterator[Probe]:
    p = Probe()
    with p:
        yield p


def test_errors_answer_json_with_their_status(probe: Probe) -> None:
    with httpx.Client(base_url=probe.url, timeout=10) as c:
        r = c.get("/typed")
        assert (r.status_code, r.json()) == (404, {"error": "UnknownSource",
                                                   "message": "no source 7"})
        r = c.get("/nope")
        assert (r.status_code, r.json()["error"]) == (404, "NotFound")
        r = c.post("/ok")
        assert (r.status_code, r.json()["error"]) == (405, "MethodNotAllowed")
        r = c.get("/boom")  # the server closes this connection after answering
        assert (r.status_code, r.json()) == (500, {"error": "InternalError",
                                                   "message": "RuntimeError: unexpected"})
    with httpx.Client(base_url=probe.url, timeout=10) as c:  # and goes on serving
        assert c.get("/ok").json() == {"worker": True}


@pytest.mark.parametrize(("query", "want"), [
    ({}, {"n": 5, "t": 0.5, "b": False, "ids": None}),
    ({"n": "10", "t": "2", "b": "YES", "ids": "3,1", "sources": "3, 1"},
     {"n": 10, "t": 2.0, "b": True, "ids": [1, 3]}),
    ({"b": "0", "sources": " "}, {"n": 5, "t": 0.5, "b": False, "ids": None}),
])
def test_parameters_parse(probe: Probe, query: dict[str, str], want: dict[str, object]) -> None:
    r = httpx.get(f"{probe.url}/params", params=query, timeout=10)
    assert r.status_code == 200, r.text
    assert r.json() == want


@pytest.mark.parametrize(("query", "status", "code", "says"), [
    ({"n": "11"}, 400, "InvalidRequest", "n must be between 1 and 10"),
    ({"n": "x"}, 400, "InvalidRequest", "n must be an integer"),
    ({"t": "nan"}, 400, "InvalidRequest", "t must be between"),
    ({"b": "maybe"}, 400, "InvalidRequest", "b must be true or false"),
    ({"sources": "1,a"}, 400, "InvalidRequest", "sources must be comma-separated ids"),
    ({"sources": "1,9"}, 404, "UnknownSource", "unknown source id 9"),
])
def test_bad_parameters_are_typed_errors(probe: Probe, query: dict[str, str], status: int,
                                         code: str, says: str) -> None:
    r = httpx.get(f"{probe.url}/params", params=query, timeout=10)
    assert r.status_code == status, r.text
    assert r.json()["error"] == code and says in r.json()["message"]


def test_start_raises_when_the_port_is_taken_and_cleans_up() -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        p = Probe(port=taken.getsockname()[1])
        with pytest.raises(ConfigError, match=r"cannot listen on 127\.0\.0\.1:.*in use"):
            p.start(timeout=20)
        p.stop()
    assert p.events == ["shutdown"]  # no workers were started, what was held is closed


def test_workers_start_before_serving_and_stop_after(probe: Probe) -> None:
    assert probe.events == ["listening"]
    probe.stop()
    assert probe.events == ["listening", "shutdown"]
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{probe.url}/ok", timeout=5)


# -- one loopback rule: the token rule and the Host check agree ---------------------------


class Signals(HttpService):
    """One state-changing endpoint (``json_body``: the Host check), bound where told."""

    def __init__(self, http: HttpServerConfig) -> None:
        super().__init__(http, "signals")

    def build_app(self) -> Starlette:
        async def signal(request: Request) -> Response:
            return JSONResponse(await json_body(request))

        return Starlette(routes=[Route("/signal", signal, methods=["POST"])],
                         exception_handlers=EXCEPTION_HANDLERS)


def _outward_address() -> str | None:
    """This machine's address on its route outwards (no packet is sent), if any."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("203.0.113.1", 9))  # TEST-NET-3: routed, never reached
        except OSError:
            return None
        address = str(s.getsockname()[0])
    return None if is_loopback(address) else address


def _has_ipv6_loopback() -> bool:
    try:
        with socket.create_server(("::1", 0), family=socket.AF_INET6):
            return True
    except OSError:
        return False


BIND = ["127.0.0.1", "127.0.0.5", "localhost",
        pytest.param("::1", marks=[
            pytest.mark.skipif(not _has_ipv6_loopback(), reason="no IPv6 loopback")]),
        pytest.param(_outward_address() or "", marks=pytest.mark.skipif(
            _outward_address() is None, reason="no address beyond loopback"))]


@pytest.mark.parametrize("host", BIND)
def test_the_token_rule_and_the_host_check_give_one_answer(host: str) -> None:
    """A server that may run without tokens (loopback) is one whose state-changing
    requests need a loopback Host; one that needs tokens (or ``insecure``) is not."""
    try:
        service = Signals(HttpServerConfig(host=host))
        runs_without_tokens = True
    except ConfigError as exc:
        assert "without authentication" in str(exc)
        service = Signals(HttpServerConfig(host=host, insecure=True))
        runs_without_tokens = False
    with service, httpx.Client(base_url=service.url, timeout=10) as c:
        own = c.post("/signal", json={"ok": 1})
        assert (own.status_code, own.json()) == (200, {"ok": 1})
        foreign = c.post("/signal", json={"ok": 1},
                         headers={"Host": f"evil.example:{service.port}"})
        host_checked = foreign.status_code == 403
        assert host_checked or foreign.status_code == 200, foreign.text
        for name in ("127.0.0.1", "[::1]", "localhost"):  # any loopback name will do
            r = c.post("/signal", json={"ok": 1}, headers={"Host": f"{name}:{service.port}"})
            assert r.status_code == 200, (name, r.text)
    assert runs_without_tokens is host_checked is is_loopback(host)


def test_a_server_bound_to_127_0_0_5_refuses_a_foreign_host() -> None:
    """The case the two rules disagreed on: it ran without tokens as loopback, and took
    a state-changing request naming any Host as if it were not."""
    with Signals(HttpServerConfig(host="127.0.0.5")) as service, \
            httpx.Client(base_url=service.url, timeout=10) as c:
        assert service.auth is None
        for host in ("evil.example", f"evil.example:{service.port}", "10.0.0.1", ""):
            r = c.post("/signal", json={}, headers={"Host": host})
            assert (r.status_code, r.json()["error"]) == (403, "Forbidden"), (host, r.text)
            assert "(loopback)" in r.json()["message"]
        r = c.post("/signal", json={"a": [1]}, headers={"Host": f"127.0.0.5:{service.port}"})
        assert (r.status_code, r.json()) == (200, {"a": [1]})
