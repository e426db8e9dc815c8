"""The bootstrap server as a real ``databus bootstrap`` process holds the same line
as the relay: mutual TLS and tokens (plain HTTP, a wrong CA and a client without a
certificate all fail the handshake; a token reads only its tables), its producer
reads a TLS relay with its own token and CA, it refuses to listen beyond loopback
without tokens, a bad certificate path is one line, and SIGTERM/SIGINT stop it
with exit 0 and no traceback."""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from tests.support.procs import DATABUS, free_port, running, spawn, wait_http
from tests.support.shop import TABLES, create_shop
from tests.support.tls import Certs, add_token, make_certs
from tests.support.wait import wait_until


def _ctx(ca: Path, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca))
    if cert is not None:
        ctx.load_cert_chain(str(cert), str(key))
    return ctx


def _config(tmp: Path, relay_url: str, **http: object) -> Path:
    conf = tmp / "bootstrap.yaml"
    conf.write_text(yaml.safe_dump({
        "relay": relay_url, "store": {"url": f"sqlite:///{tmp / 'bs.db'}"},
        "http": http, "poll_timeout": 0.5, "apply_interval": 0.05,
        "progress_interval": 0.5}))
    return conf


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


@pytest.fixture
def tls_relay(tmp_path: Path, certs: Certs) -> Iterator[tuple[str, dict[str, str], Path]]:
    """A relay with tokens and TLS over a shop of 10 customers and 10 orders."""
    db = tmp_path / "shop.db"
    create_shop(db)
    with sqlite3.connect(db) as con:
        for i in range(10):
            con.execute("INSERT INTO customers VALUES (?, ?, 0, 0)", (i, f"c{i}"))
            con.execute("INSERT INTO orders (id, customer_id, note, tx) VALUES (?, ?, 'n', 0)",
                        (i, i))
    tokens_file = tmp_path / "tokens.jsonl"
    tokens = {"admin": add_token(tokens_file, "admin", "--tables", ".*", "--admin"),
              "orders": add_token(tokens_file, "orders", "--tables", r"main\.orders"),
              "producer": add_token(tokens_file, "producer", "--tables", ".*")}
    port = free_port()
    with running([*DATABUS, "relay", "--source", f"sqlite:///{db}", "--tables",
                  ",".join(TABLES), "--port", str(port), "--token-file", str(tokens_file),
                  "--tls-cert", str(certs.server_cert), "--tls-key", str(certs.server_key),
                  "--buffer-path", str(tmp_path / "relay.buf")], tmp_path / "relay.log"):
        url = f"https://127.0.0.1:{port}"
        wait_until(lambda: _answers(f"{url}/health", _ctx(certs.ca)), 60, "the TLS relay")
        yield url, tokens, tokens_file


def _answers(url: str, ctx: ssl.SSLContext) -> bool:
    try:
        return httpx.get(url, verify=ctx, timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_bootstrap_process_with_mutual_tls_and_tokens(
        tmp_path: Path, certs: Certs, tls_relay: tuple[str, dict[str, str], Path],
        sig: signal.Signals) -> None:
    relay_url, tokens, tokens_file = tls_relay
    producer_token = tmp_path / "producer.token"
    producer_token.write_text(tokens["producer"] + "\n")
    port = free_port()
    conf = _config(tmp_path, relay_url, port=port, token_file=str(tokens_file),
                   tls={"cert_file": str(certs.server_cert), "key_file": str(certs.server_key),
                        "client_ca_file": str(certs.ca)})
    raw = yaml.safe_load(conf.read_text())
    raw["relay"] = {"url": relay_url, "token_file": str(producer_token),
                    "ca_file": str(certs.ca)}
    conf.write_text(yaml.safe_dump(raw))
    log = tmp_path / "bootstrap.log"
    proc = spawn([*DATABUS, "bootstrap", "--config", str(conf)], log)
    try:
        url = f"https://127.0.0.1:{port}"
        good = _ctx(certs.ca, certs.client_cert, certs.client_key)

        def get(path: str, token: str | None, **params: str) -> httpx.Response:
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            return httpx.get(f"{url}{path}", params=params, headers=headers, verify=good,
                             timeout=30)

        wait_until(lambda: proc.poll() is None and _answers(f"{url}/health", good), 60,
                   f"the bootstrap server (log {log})")
        # the producer read the TLS relay with its token: the store fills up
        def target_scn() -> int:
            r = get("/targetSCN", tokens["admin"])
            return int(r.json()["targetScn"]) if r.status_code == 200 else -1

        wait_until(lambda: target_scn() > 0, 60, "the store to receive the relay's windows")
        assert get("/sources", None).status_code == 401
        assert [s["name"] for s in get("/sources", tokens["orders"]).json()] == ["main.orders"]
        ids = {s["name"]: s["id"] for s in get("/sources", tokens["admin"]).json()}
        r = get("/register", tokens["orders"], sources=str(ids["main.customers"]))
        assert r.status_code == 403 and "customers" in r.json()["message"], r.text
        assert get("/admin", tokens["orders"]).status_code == 403
        # handshakes: no client certificate, a wrong CA, plain HTTP
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{url}/health", verify=_ctx(certs.ca), timeout=5)
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            httpx.get(f"{url}/health", verify=_ctx(certs.other_ca, certs.client_cert,
                                                   certs.client_key), timeout=5)
        with pytest.raises(httpx.TransportError):
            r = httpx.get(f"http://127.0.0.1:{port}/health", timeout=5)
            raise AssertionError(f"plain HTTP to a TLS port answered {r.status_code}")
        proc.send_signal(sig)
        assert proc.wait(30) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert "Traceback" not in log.read_text()
    assert tokens["producer"] not in log.read_text()
    assert (tmp_path / "bs.db").stat().st_mode & 0o777 == 0o600


def _start_fails(conf: Path) -> str:
    done = subprocess.run([*DATABUS, "bootstrap", "--config", str(conf)], capture_output=True,
                          text=True, timeout=60, check=False,
                          env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert done.returncode != 0, done.stdout
    assert "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("databus:")]
    assert len(lines) == 1, done.stderr
    return lines[0]


def test_a_bootstrap_beyond_loopback_without_tokens_refuses_to_start(tmp_path: Path) -> None:
    line = _start_fails(_config(tmp_path, "http://127.0.0.1:1", host="0.0.0.0",
                                port=free_port()))
    assert "0.0.0.0" in line and "token" in line, line


def test_a_bootstrap_with_a_bad_certificate_path_is_one_line(tmp_path: Path) -> None:
    line = _start_fails(_config(tmp_path, "http://127.0.0.1:1", port=free_port(),
                                tls={"cert_file": str(tmp_path / "missing.pem"),
                                     "key_file": str(tmp_path / "missing.key")}))
    assert "missing.pem" in line, line


def test_a_bootstrap_with_an_unreadable_token_file_is_one_line(tmp_path: Path) -> None:
    line = _start_fails(_config(tmp_path, "http://127.0.0.1:1", port=free_port(),
                                token_file=str(tmp_path / "no-tokens.jsonl")))
    assert "no-tokens.jsonl" in line, line


def test_a_bootstrap_on_a_port_in_use_is_one_line(tmp_path: Path) -> None:
    port = free_port()
    with socket.create_server(("127.0.0.1", port)):
        line = _start_fails(_config(tmp_path, "http://127.0.0.1:1", port=port))
    assert str(port) in line and "in use" in line, line


def test_a_plain_bootstrap_answers_health(tmp_path: Path) -> None:
    """The zero-config default: loopback without tokens serves (the demo's case)."""
    port = free_port()
    with running([*DATABUS, "bootstrap", "--config",
                  str(_config(tmp_path, "http://127.0.0.1:1", port=port))],
                 tmp_path / "bootstrap.log") as proc:
        wait_http(f"http://127.0.0.1:{port}/health", proc)
