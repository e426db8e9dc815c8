"""Security of the servers, against real ``databus`` processes: bearer tokens (401,
403, admin, revocation on SIGHUP), clients that take their token from the
environment, TLS and mutual TLS handshakes, refusing to serve beyond loopback
without tokens, one-line start-up errors and clean stops on SIGTERM/SIGINT."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import ssl
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.support.procs import DATABUS, free_port, running, spawn, stop, wait_http
from tests.support.shop import create_shop
from tests.support.tls import Certs, add_token, make_certs
from tests.support.wait import wait_until


def _run(*args: str, env: dict[str, str] | None = None,
         timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*DATABUS, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, check=False)



def _write(db: Path, n: int, start: int = 0) -> None:
    with sqlite3.connect(db) as con:
        for i in range(start, start + n):
            con.execute("INSERT INTO customers VALUES (?, ?, 0, 0)", (i, f"c{i}"))
            con.execute("INSERT INTO orders (id, customer_id, note, tx) VALUES (?, ?, 'n', 0)",
                        (i, i))


@dataclass
class SecuredRelay:
    url: str
    proc: subprocess.Popen[bytes]
    tokens: dict[str, str]
    token_file: Path
    db: Path
    log: Path

    def get(self, path: str, token: str | None = None, **params: str) -> httpx.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.get(f"{self.url}{path}", params=params, headers=headers, timeout=30)

    def source_ids(self) -> dict[str, int]:
        r = self.get("/sources", self.tokens["admin"])
        return {s["name"]: s["id"] for s in r.json()}


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[SecuredRelay]:
    db = tmp_path / "shop.db"
    create_shop(db)
    _write(db, 5)
    token_file = tmp_path / "tokens.jsonl"
    tokens = {"orders": add_token(token_file, "orders", "--tables", r"main\.orders"),
              "admin": add_token(token_file, "admin", "--tables", ".*", "--admin")}
    assert token_file.stat().st_mode & 0o777 == 0o600
    port = free_port()
    log = tmp_path / "relay.log"
    with running([*DATABUS, "relay", "--source", f"sqlite:///{db}", "--tables",
                  "customers,orders", "--port", str(port), "--token-file", str(token_file),
                  "--buffer-path", str(tmp_path / "relay.buf")], log) as proc:
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/health", proc)
        yield SecuredRelay(url, proc, tokens, token_file, db, log)


def test_no_token_is_401_and_only_health_and_metrics_are_open(secured: SecuredRelay) -> None:
    for path in ("/sources", "/register", "/stream", "/admin", "/containerStats"):
        r = secured.get(path)
        assert r.status_code == 401, (path, r.text)
        assert r.json()["error"] == "Unauthorized"
        assert r.headers["WWW-Authenticate"].startswith("Bearer")
    assert secured.get("/sources", "orders.not-the-secret").status_code == 401
    assert secured.get("/sources", "nobody.x").status_code == 401
    assert secured.get("/health").json()["status"] == "ok"
    metrics = secured.get("/metrics")
    assert metrics.status_code == 200 and "databus_relay" in metrics.text
    assert "c1" not in metrics.text  # no row data


def test_a_token_reads_only_its_tables(secured: SecuredRelay) -> None:
    ids = secured.source_ids()
    tok = secured.tokens["orders"]
    assert [s["name"] for s in secured.get("/sources", tok).json()] == ["main.orders"]
    # naming another table is 403, not an empty answer
    for path in ("/stream", "/register"):
        r = secured.get(path, tok, sources=str(ids["main.customers"]))
        assert r.status_code == 403 and "customers" in r.json()["message"], r.text
    both = f"{ids['main.orders']},{ids['main.customers']}"
    assert secured.get("/stream", tok, sources=both).status_code == 403
    filt = json.dumps({str(ids["main.customers"]): {
        "partitionType": "MOD",
        "filters": [{"numBuckets": 2, "bktRange": {"start": 0, "end": 1}}]}})
    assert secured.get("/stream", tok, filters=filt).status_code == 403
    # asking for nothing in particular is asking for everything it may read
    reg = secured.get("/register", tok)
    assert {s["name"] for s in reg.json()} == {"main.orders"}

    def orders_seen() -> list[dict[str, object]]:
        r = secured.get("/stream", tok, output="json", timeout="1")
        assert r.status_code == 200, r.text
        return [json.loads(x) for x in r.text.splitlines() if '"op"' in x]

    rows = wait_until(lambda: len(orders_seen()) >= 5 and orders_seen(), 30,
                      "the orders rows on the stream")
    assert {r["source"]["table"] for r in rows} == {"orders"}  # type: ignore[index]
    # the admin token reads both
    r = secured.get("/stream", secured.tokens["admin"], output="json", timeout="1")
    tables = {json.loads(x)["source"]["table"] for x in r.text.splitlines() if '"op"' in x}
    assert tables == {"orders", "customers"}


def test_admin_endpoints_need_the_admin_flag(secured: SecuredRelay) -> None:
    tok, admin = secured.tokens["orders"], secured.tokens["admin"]
    assert secured.get("/admin", tok).status_code == 403
    assert secured.get("/admin", admin).status_code == 200
    body = {"type": "execute-snapshot", "data": {"data-collections": [r"main\.orders"]}}
    r = httpx.post(f"{secured.url}/signal", json=body, timeout=30,
                   headers={"Authorization": f"Bearer {tok}"})
    assert r.status_code == 403 and r.json()["error"] == "Forbidden"
    assert httpx.post(f"{secured.url}/signal", json=body, timeout=30).status_code == 401
    # an admin token limited to orders signals about orders only
    ops = add_token(secured.token_file, "ops", "--tables", r"main\.orders", "--admin")
    secured.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: secured.get("/admin", ops).status_code == 200, 30, "the ops token")

    def signal_as(token: str, tables: list[str]) -> httpx.Response:
        return httpx.post(f"{secured.url}/signal", timeout=30,
                          headers={"Authorization": f"Bearer {token}"},
                          json={"type": "execute-snapshot",
                                "data": {"data-collections": tables}})

    r = signal_as(ops, [r"main\.customers"])
    assert r.status_code == 403 and "customers" in r.json()["message"], r.text
    r = signal_as(ops, [r"main\..*"])  # a pattern that reaches a table it may not read
    assert r.status_code == 403, r.text
    # its own table passes the token check and reaches the source (SQLite takes no
    # signals: the source's own 400, not the guard's 403)
    r = signal_as(ops, [r"main\.orders"])
    assert r.status_code == 400 and "takes no signals" in r.json()["message"], r.text


def test_tail_takes_its_token_from_the_environment(secured: SecuredRelay,
                                                   tmp_path: Path) -> None:
    token_path = tmp_path / "my.token"
    token_path.write_text(secured.tokens["orders"] + "\n")
    done = _run("tail", "--relay", secured.url, "--from-start", "--max-windows", "1",
                env={"DATABUS_TOKEN_FILE": str(token_path)})
    assert done.returncode == 0, done.stderr
    lines = [json.loads(x) for x in done.stdout.splitlines() if x.strip()]
    assert lines and {x["source"]["table"] for x in lines} == {"orders"}
    assert secured.tokens["orders"] not in done.stdout + done.stderr
    # without a token the client stops with the server's reason, not retrying forever
    done = _run("tail", "--relay", secured.url, "--from-start", "--max-windows", "1",
                env={"DATABUS_TOKEN_FILE": "", "DATABUS_TOKEN": ""})
    assert done.returncode == 2 and "Unauthorized" in done.stderr, done.stderr


def test_replicate_takes_its_token_from_the_environment(secured: SecuredRelay,
                                                        tmp_path: Path) -> None:
    token_path = tmp_path / "replicate.token"
    token_path.write_text(secured.tokens["orders"] + "\n")
    replica = tmp_path / "replica.db"
    log = tmp_path / "replicate.log"
    env = {**os.environ, "DATABUS_TOKEN_FILE": str(token_path)}
    env.pop("DATABUS_TOKEN", None)
    with log.open("wb") as out:
        proc = subprocess.Popen([*DATABUS, "replicate", "-v", "--relay", secured.url,
                                 "--target", f"sqlite:///{replica}"], env=env, stdout=out,
                                stderr=subprocess.STDOUT)
    try:
        def orders() -> int:
            assert proc.poll() is None, log.read_text()
            if not replica.exists():
                return 0
            with sqlite3.connect(replica) as con:
                names = {r[0] for r in con.execute(
                    "SELECT name FROM sqlite_master WHERE type = 'table'")}
                if "orders" not in names:
                    return 0
                return int(con.execute("SELECT count(*) FROM orders").fetchone()[0])

        wait_until(lambda: orders() == 5, 60, "the five orders in the replica")
    finally:
        stop(proc)
    with sqlite3.connect(replica) as con:
        names = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert "customers" not in names  # its token does not read them
    assert secured.tokens["orders"] not in log.read_text()


def test_a_revoked_token_is_refused_after_sighup(secured: SecuredRelay) -> None:
    tok = secured.tokens["orders"]
    assert secured.get("/sources", tok).status_code == 200
    done = _run("token", "remove", "orders", "--file", str(secured.token_file))
    assert done.returncode == 0, done.stderr
    assert secured.get("/sources", tok).status_code == 200  # until the server re-reads it
    secured.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: secured.get("/sources", tok).status_code == 401, 30,
               "the revoked token to be refused")
    assert secured.get("/sources", secured.tokens["admin"]).status_code == 200
    # a rotated token: the new one works after SIGHUP, the old one does not
    new = add_token(secured.token_file, "admin", "--tables", ".*", "--admin", "--replace")
    secured.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: secured.get("/sources", new).status_code == 200, 30, "the new token")
    assert secured.get("/sources", secured.tokens["admin"]).status_code == 401


def test_a_server_beyond_loopback_without_tokens_refuses_to_start(tmp_path: Path) -> None:
    db = tmp_path / "shop.db"
    create_shop(db)
    port = str(free_port())
    done = _run("relay", "--source", f"sqlite:///{db}", "--tables", "orders", "--port", port,
                "--host", "0.0.0.0")
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert "without authentication" in lines[-1] and "--insecure" in lines[-1]
    assert "Traceback" not in done.stderr
    log = tmp_path / "insecure.log"
    with running([*DATABUS, "relay", "--source", f"sqlite:///{db}", "--tables", "orders",
                  "--port", port, "--host", "0.0.0.0", "--insecure"], log) as proc:
        wait_http(f"http://127.0.0.1:{port}/health", proc)
        assert "WITHOUT AUTHENTICATION" in log.read_text()
    assert proc.returncode == 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_the_relay_cleanly(tmp_path: Path, sig: signal.Signals) -> None:
    db = tmp_path / "shop.db"
    create_shop(db)
    port = free_port()
    proc = spawn([*DATABUS, "relay", "--source", f"sqlite:///{db}", "--tables", "orders",
                  "--port", str(port), "--buffer-path", str(tmp_path / "r.buf")],
                 tmp_path / "relay.log")
    wait_http(f"http://127.0.0.1:{port}/health", proc)
    proc.send_signal(sig)
    assert proc.wait(30) == 0, (tmp_path / "relay.log").read_text()
    assert "Traceback" not in (tmp_path / "relay.log").read_text()
    # files it made are its own
    assert (tmp_path / "r.buf").stat().st_mode & 0o777 == 0o600


# -- TLS ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("certs"))


def _tls_relay(tmp_path: Path, certs: Certs, *extra: str) -> tuple[str, subprocess.Popen[bytes]]:
    db = tmp_path / "shop.db"
    create_shop(db)
    _write(db, 3)
    port = free_port()
    proc = spawn([*DATABUS, "relay", "--source", f"sqlite:///{db}", "--tables", "orders",
                  "--port", str(port), "--tls-cert", str(certs.server_cert), "--tls-key",
                  str(certs.server_key), *extra], tmp_path / "relay.log")
    return f"https://127.0.0.1:{port}", proc


def _ctx(ca: Path, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca))
    if cert is not None:
        ctx.load_cert_chain(str(cert), str(key))
    return ctx


def test_tls_handshakes(tmp_path: Path, certs: Certs) -> None:
    url, proc = _tls_relay(tmp_path, certs)
    try:
        wait_until(lambda: _answers(f"{url}/health", _ctx(certs.ca)), 30, "the TLS relay")
        assert httpx.get(f"{url}/sources", verify=_ctx(certs.ca)).status_code == 200
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            httpx.get(f"{url}/sources", verify=_ctx(certs.other_ca))
        plain = url.replace("https://", "http://")
        with pytest.raises(httpx.TransportError):
            r = httpx.get(f"{plain}/sources", timeout=5)
            raise AssertionError(f"plain HTTP to a TLS port answered {r.status_code}")
        # the shipped client over https, its CA from the environment
        done = _run("tail", "--relay", url, "--from-start", "--max-windows", "1",
                    env={"DATABUS_CA_FILE": str(certs.ca)})
        assert done.returncode == 0 and '"orders"' in done.stdout, done.stderr
    finally:
        stop(proc)


def test_mutual_tls_needs_a_client_certificate(tmp_path: Path, certs: Certs) -> None:
    url, proc = _tls_relay(tmp_path, certs, "--tls-client-ca", str(certs.ca))
    with_cert = _ctx(certs.ca, certs.client_cert, certs.client_key)
    try:
        wait_until(lambda: _answers(f"{url}/health", with_cert), 30, "the mTLS relay")
        assert httpx.get(f"{url}/sources", verify=with_cert).status_code == 200
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{url}/sources", verify=_ctx(certs.ca), timeout=5)
        done = _run("tail", "--relay", url, "--from-start", "--max-windows", "1",
                    env={"DATABUS_CA_FILE": str(certs.ca),
                         "DATABUS_CERT_FILE": str(certs.client_cert),
                         "DATABUS_KEY_FILE": str(certs.client_key)})
        assert done.returncode == 0 and '"orders"' in done.stdout, done.stderr
    finally:
        stop(proc)


def test_a_chain_relay_copies_a_tls_relay_with_its_ca_and_token_from_files(
        tmp_path: Path, certs: Certs) -> None:
    tokens = tmp_path / "tokens.jsonl"
    chain_token = tmp_path / "chain.token"
    chain_token.write_text(add_token(tokens, "chain", "--tables", ".*") + "\n")
    url, proc = _tls_relay(tmp_path, certs, "--token-file", str(tokens))
    try:
        wait_until(lambda: _answers(f"{url}/health", _ctx(certs.ca)), 30, "the TLS relay")
    except AssertionError:
        stop(proc)
        raise
    port = free_port()
    conf = tmp_path / "chain.yaml"
    conf.write_text(json.dumps({  # YAML is a superset of JSON
        "source": {"url": url.replace("https://", "databus+https://"),
                   "token_file": str(chain_token), "ca_file": str(certs.ca)},
        "buffer": {"path": str(tmp_path / "chain.buf")}, "http": {"port": port}}))
    chain = spawn([*DATABUS, "relay", "--config", str(conf)], tmp_path / "chain.log")
    try:
        wait_http(f"http://127.0.0.1:{port}/health", chain)
        headers = {"Authorization": f"Bearer {chain_token.read_text().strip()}"}

        def body(base: str, verify: ssl.SSLContext | bool = True) -> bytes:
            return httpx.get(f"{base}/stream", params={"size": str(16 << 20), "timeout": "0"},
                             headers=headers, verify=verify, timeout=30).content

        upstream = body(url, _ctx(certs.ca))
        assert upstream
        wait_until(lambda: body(f"http://127.0.0.1:{port}") == upstream, 60,
                   "the chain relay to hold the TLS relay's windows byte for byte")
    finally:
        stop(chain)
        stop(proc)
    assert chain_token.read_text().strip() not in (tmp_path / "chain.log").read_text()


def test_a_bad_certificate_path_is_one_line(tmp_path: Path) -> None:
    db = tmp_path / "shop.db"
    create_shop(db)
    done = _run("relay", "--source", f"sqlite:///{db}", "--tables", "orders", "--port",
                str(free_port()), "--tls-cert", str(tmp_path / "missing.pem"), "--tls-key",
                str(tmp_path / "missing.key"))
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("databus: ConfigError:") and "TLS" in last, done.stderr
    assert "Traceback" not in done.stderr


def test_an_unreadable_token_file_is_one_line(tmp_path: Path) -> None:
    db = tmp_path / "shop.db"
    create_shop(db)
    bad = tmp_path / "tokens.jsonl"
    bad.write_text("{not json\n")
    for file in (bad, tmp_path / "missing.jsonl"):
        done = _run("relay", "--source", f"sqlite:///{db}", "--tables", "orders", "--port",
                    str(free_port()), "--token-file", str(file))
        assert done.returncode == 2, done.stderr
        assert "token file" in done.stderr.strip().splitlines()[-1]
        assert "Traceback" not in done.stderr


def _answers(url: str, ctx: ssl.SSLContext) -> bool:
    try:
        return httpx.get(url, verify=ctx, timeout=2).status_code == 200
    except httpx.TransportError:
        return False
