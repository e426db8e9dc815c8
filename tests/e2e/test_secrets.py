"""Secrets stay secret: a MariaDB source's password, given in the URL or in a file,
appears in no byte a relay and a consumer write (stdout, stderr at ``-v``, every
file, every HTTP answer); and TLS to MariaDB verifies the server."""

from __future__ import annotations

import os
import socket
import sqlite3
import subprocess
import threading
from pathlib import Path

import httpx
import pymysql
import pytest
import yaml

from databus.core import event as ev
from databus.core.errors import DatabusError, SourceUnavailableError
from tests.support.mariadb import BINLOG_SETTINGS, MariaDB
from tests.support.procs import DATABUS, free_port, running, spawn, stop, wait_http
from tests.support.relays import make_relay
from tests.support.shop import create_shop
from tests.support.sources import mysql_source
from tests.support.tls import make_certs
from tests.support.wait import wait_until

PASSWORD = "Zq8-secret-Pw-4711"  # distinctive, so a search cannot miss it


def _every_byte(root: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file())


@pytest.mark.slow
def test_the_source_password_appears_nowhere(mariadb: MariaDB, tmp_path: Path) -> None:
    mariadb.execute(f"CREATE USER IF NOT EXISTS 'cdc'@'127.0.0.1' IDENTIFIED BY '{PASSWORD}'",
                    "GRANT ALL PRIVILEGES ON *.* TO 'cdc'@'127.0.0.1'",
                    "CREATE DATABASE IF NOT EXISTS sec",
                    "CREATE TABLE IF NOT EXISTS sec.t (id INT PRIMARY KEY, v VARCHAR(20))",
                    "INSERT IGNORE INTO sec.t VALUES (1, 'before')")
    url = f"mysql://cdc:{PASSWORD}@127.0.0.1:{mariadb.port}"
    port = free_port()
    relay_url = f"http://127.0.0.1:{port}"
    work = tmp_path / "work"
    work.mkdir()
    with running([*DATABUS, "relay", "-v", "--source", url, "--tables", r"sec\..*",
                   "--port", str(port), "--buffer-path", str(work / "relay.buf")],
                  tmp_path / "relay.log") as relay:
        answers: list[bytes] = []
        wait_http(f"{relay_url}/health", relay)
        mariadb.execute("INSERT INTO sec.t VALUES (2, 'after')")
        tail_log = tmp_path / "tail.log"
        tail = spawn([*DATABUS, "tail", "-v", "--relay", relay_url, "--from-start",
                      "--checkpoint", str(work / "tail.cp")], tail_log)
        try:
            wait_until(lambda: b'"after"' in tail_log.read_bytes(), 120, "tail to print both rows")
        finally:
            stop(tail)
        assert b'"before"' in tail_log.read_bytes()
        answers.append(tail_log.read_bytes())
        for path in ("/admin", "/sources", "/register", "/containerStats", "/metrics",
                     "/stream?output=json&timeout=0", "/openapi.json"):
            answers.append(httpx.get(f"{relay_url}{path}", timeout=30).content)
        # a bad signal makes the relay write errors too
        answers.append(httpx.post(f"{relay_url}/signal", json={"type": "nope"}).content)
    # a refused login: the one-line error names the user, never the password
    wrong = f"mysql://cdc:{PASSWORD}x@127.0.0.1:{mariadb.port}"
    refused = subprocess.run([*DATABUS, "relay", "-v", "--source", wrong, "--tables", "sec.t",
                              "--port", str(free_port())],
                             capture_output=True, timeout=120, check=False)
    assert refused.returncode == 2
    assert b"access denied for cdc@" in refused.stderr.splitlines()[-1]
    assert b"Traceback" not in refused.stderr
    answers += [refused.stdout, refused.stderr]
    # the password from a file, not the URL
    pw_file = work / "pw"
    pw_file.write_text(PASSWORD + "\n")
    with socket.create_server(("127.0.0.1", 0)) as taken:  # a port in use
        from_file = subprocess.run(
            [*DATABUS, "relay", "-v", "--source", f"mysql://cdc@127.0.0.1:{mariadb.port}",
             "--password-file", str(pw_file), "--tables", r"sec\.t", "--snapshot-mode",
             "no_data", "--port", str(taken.getsockname()[1])],
            capture_output=True, timeout=120, check=False)
    assert from_file.returncode == 2  # cannot listen, after the login worked
    assert b"cannot listen" in from_file.stderr, from_file.stderr
    answers += [from_file.stdout, from_file.stderr]
    pw_file.unlink()
    written = b"".join(answers) + (tmp_path / "relay.log").read_bytes() + _every_byte(work)
    assert b"cdc" in written  # the search looks at real output
    for form in (PASSWORD, PASSWORD.replace("-", "%2D")):
        assert form.encode() not in written, f"the password leaked ({form})"
    # files the relay made are private
    for p in work.rglob("*"):
        assert p.stat().st_mode & 0o077 == 0, f"{p} is readable by others"


@pytest.mark.slow
def test_tls_to_mariadb_verifies_the_server_and_presents_a_client_certificate(tmp_path: Path) -> None:
    certs = make_certs(tmp_path / "certs")
    settings = {**BINLOG_SETTINGS, "ssl-ca": str(certs.ca), "ssl-cert": str(certs.server_cert),
                "ssl-key": str(certs.server_key)}
    with MariaDB(tmp_path / "db", settings=settings) as server:
        server.execute("CREATE USER 'tls'@'127.0.0.1' IDENTIFIED BY 'tls-only-pw' REQUIRE SSL",
                       "GRANT ALL PRIVILEGES ON *.* TO 'tls'@'127.0.0.1'",
                       "CREATE DATABASE app", "CREATE TABLE app.t (id INT PRIMARY KEY)")
        url = f"mysql://tls:tls-only-pw@127.0.0.1:{server.port}"
        # a CA that did not sign the server's certificate: refused, clearly
        with pytest.raises(SourceUnavailableError, match="CERTIFICATE_VERIFY_FAILED"):
            mysql_source(url, [r"app\..*"], snapshot_mode="no_data",
                         tls={"ca_file": str(certs.other_ca)})
        # the user REQUIRE SSL: capturing proves the connections are encrypted, the wrong
        # CA's refusal above that the server's certificate is verified
        with mysql_source(url, [r"app\..*"], snapshot_mode="no_data",
                          tls={"ca_file": str(certs.ca)}) as src:
            stop_reading = threading.Event()
            got: list[ev.Event] = []
            after = -1
            src.read(after, stop_reading, 0.5)  # positioned at the end
            server.execute("INSERT INTO app.t VALUES (1), (2), (3)")

            def three() -> bool:
                nonlocal after
                for w in src.read(after, stop_reading, 0.5):
                    got.extend(e for e in ev.iter_events(w.events) if not e.is_control)
                    after = w.scn
                return len(got) >= 3

            wait_until(three, 60, "three rows over TLS")
            assert sorted(e.key for e in got) == [1, 2, 3]
        # source.tls.cert_file / key_file: a user that needs a client certificate
        server.execute("CREATE USER 'x509'@'127.0.0.1' REQUIRE X509",
                       "GRANT ALL PRIVILEGES ON *.* TO 'x509'@'127.0.0.1'")
        url = f"mysql://x509@127.0.0.1:{server.port}"
        with pytest.raises(DatabusError, match=r"(?i)access denied"):
            mysql_source(url, [r"app\..*"], snapshot_mode="no_data",
                         tls={"ca_file": str(certs.ca)})
        with mysql_source(url, [r"app\..*"], snapshot_mode="no_data",
                          tls={"ca_file": str(certs.ca), "cert_file": str(certs.client_cert),
                               "key_file": str(certs.client_key)}) as src:
            assert src.read(-1, threading.Event(), 0.2) is not None  # reads the binlog


def _user_and_shop(server: MariaDB, tmp: Path, user: str, password: str, database: str,
                   customers: int) -> tuple[Path, Path]:
    """A MariaDB user with ``password`` owning ``database``, a SQLite shop holding
    ``customers`` customers, and a file with the password: (shop, password file)."""
    server.execute(f"CREATE USER IF NOT EXISTS '{user}'@'127.0.0.1' IDENTIFIED BY '{password}'",
                   f"CREATE DATABASE IF NOT EXISTS {database}",
                   f"GRANT ALL PRIVILEGES ON {database}.* TO '{user}'@'127.0.0.1'")
    db = tmp / "shop.db"
    create_shop(db)
    with sqlite3.connect(db) as con:
        con.executemany("INSERT INTO customers VALUES (?, ?, 0, 0)",
                        [(i, f"c{i}") for i in range(customers)])
    pw_file = tmp / f"{user}.pw"
    pw_file.write_text(password + "\n")
    return db, pw_file


@pytest.mark.slow
def test_replicate_takes_the_target_password_from_a_file(mariadb: MariaDB,
                                                         tmp_path: Path) -> None:
    target_pw = "Tgt-pass-9931-xyz"
    db, pw_file = _user_and_shop(mariadb, tmp_path, "sink", target_pw, "replica_pw", 10)
    with make_relay(db, tmp_path, snapshot_mode="initial") as relay:
        log = tmp_path / "replicate.log"
        with running([*DATABUS, "replicate", "-v", "--relay", relay.url, "--target",
                      f"mysql+pymysql://sink@127.0.0.1:{mariadb.port}/replica_pw",
                      "--target-password-file", str(pw_file)], log):
            wait_until(lambda: _count(mariadb, "replica_pw.customers") == 10, 120,
                       "the replica to hold the ten customers")
    assert target_pw not in log.read_text()


def _count(server: MariaDB, table: str) -> int:
    con = server.connect()
    with con, con.cursor() as cur:
        try:
            cur.execute(f"SELECT COUNT(*) FROM {table}")
        except pymysql.err.ProgrammingError:  # not created yet
            return -1
        row = cur.fetchone()
    return int(row[0]) if row else -1


@pytest.mark.parametrize("form", ["password_file", "env"])
def test_a_yaml_config_takes_the_source_password_from_a_file_or_the_environment(
        mariadb: MariaDB, tmp_path: Path, form: str) -> None:
    mariadb.execute(f"CREATE USER IF NOT EXISTS 'cdc'@'127.0.0.1' IDENTIFIED BY '{PASSWORD}'",
                    "GRANT ALL PRIVILEGES ON *.* TO 'cdc'@'127.0.0.1'",
                    "CREATE DATABASE IF NOT EXISTS secyaml",
                    "CREATE TABLE IF NOT EXISTS secyaml.t (id INT PRIMARY KEY, v VARCHAR(20))",
                    "REPLACE INTO secyaml.t VALUES (1, 'kept')")
    source: dict[str, object] = {"tables": [r"secyaml\..*"], "snapshot_mode": "initial"}
    env = dict(os.environ)
    if form == "password_file":
        pw = tmp_path / "source.pw"
        pw.write_text(PASSWORD + "\n")
        source.update(url=f"mysql://cdc@127.0.0.1:{mariadb.port}", password_file=str(pw))
    else:  # ${ENV} anywhere in the file, here inside the URL
        env["DATABUS_TEST_SOURCE_PW"] = PASSWORD
        source["url"] = f"mysql://cdc:${{DATABUS_TEST_SOURCE_PW}}@127.0.0.1:{mariadb.port}"
    port = free_port()
    conf = tmp_path / "relay.yaml"
    conf.write_text(yaml.safe_dump({"source": source, "http": {"port": port}}))
    assert PASSWORD not in conf.read_text()
    log = tmp_path / "relay.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([*DATABUS, "relay", "-v", "--config", str(conf)], env=env,
                                stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        wait_http(f"http://127.0.0.1:{port}/health", proc)

        def kept() -> bool:
            r = httpx.get(f"http://127.0.0.1:{port}/stream",
                          params={"output": "json", "timeout": "1"}, timeout=30)
            return b'"kept"' in r.content

        wait_until(kept, 120, "the snapshot row through the relay")
    finally:
        stop(proc)
    assert PASSWORD not in log.read_text()


def test_a_bootstrap_store_takes_its_password_from_a_file(mariadb: MariaDB,
                                                          tmp_path: Path) -> None:
    store_pw = "Store-pw-5150-abc"
    db, pw_file = _user_and_shop(mariadb, tmp_path, "bs", store_pw, "bs_pw", 5)
    port = free_port()
    with make_relay(db, tmp_path, snapshot_mode="initial") as relay:
        conf = tmp_path / "bootstrap.yaml"
        conf.write_text(yaml.safe_dump({
            "relay": relay.url, "http": {"port": port}, "poll_timeout": 0.5,
            "apply_interval": 0.05,
            "store": {"url": f"mysql+pymysql://bs@127.0.0.1:{mariadb.port}/bs_pw",
                      "password_file": str(pw_file)}}))
        log = tmp_path / "bootstrap.log"
        with running([*DATABUS, "bootstrap", "-v", "--config", str(conf)], log) as proc:
            wait_http(f"http://127.0.0.1:{port}/health", proc)

            def target_scn() -> int:
                r = httpx.get(f"http://127.0.0.1:{port}/targetSCN", timeout=10)
                return int(r.json()["targetScn"]) if r.status_code == 200 else -1

            wait_until(lambda: target_scn() >= relay.buffer.max_scn >= 0, 60,
                       "the store to hold the relay's windows")
            admin = httpx.get(f"http://127.0.0.1:{port}/admin", timeout=10).text
    assert store_pw not in log.read_text() + admin
