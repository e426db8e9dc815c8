"""``databus binlog-server`` with TLS (``--tls-cert``/``--tls-key``), judged by real clients.

python-mysql-replication (through pymysql's TLS, the service's certificate verified
against the test's CA, host name included) reads the served binlog over TLS from the
moment the service listens and rebuilds the SQLite source's tables; a client without
TLS, or one that does not trust the certificate, gets nothing; with ``--tls-client-ca``
a client needs a certificate that CA signed.

The regression these guard: a client sends its TLS ClientHello right behind its MySQL
SSL request; when one socket read on the server returned both (likely while the
converter kept the service busy, e.g. right after it started), mysql-mimic's TLS upgrade
lost the ClientHello and the client hung until the 60 s handshake timeout. The raw
client below sends both in one write, which made the old server hang every time.
"""

from __future__ import annotations

import socket
import ssl
import struct
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pymysql
import pytest
from pymysqlreplication import BinLogStreamReader

from tests.support.binlog_server import (
    ALL,
    KEYS,
    PASSWORD,
    USER,
    BinlogService,
    Rebuilt,
    apply_events,
    equal_to_source,
    make_source,
    write_changes,
)
from tests.support.procs import DATABUS, running
from tests.support.tls import Certs, make_certs
from tests.support.wait import wait_until

# python-mysql-replication 1.0 opens its control connection with pymysql's old ``db=``
pytestmark = pytest.mark.filterwarnings("ignore:'db' is deprecated:DeprecationWarning")

HANDSHAKE_TIMEOUT = 10.0  # s: a working TLS handshake takes milliseconds; the bug, 60 s
ER_SECURE_TRANSPORT_REQUIRED = 3159


@contextmanager
def tls_service(svc: BinlogService, certs: Certs,
                *extra: str) -> Iterator[subprocess.Popen[bytes]]:
    """The binlog server of ``svc``'s relay with TLS, started now; not waited for (the
    callers connect as soon as it listens)."""
    with running([*DATABUS, "binlog-server", "--relay", svc.relay_url, "--port", str(svc.port),
                  "--user", USER, "--password-file", str(svc.password_file),
                  "--data-dir", str(svc.data_dir), "--tls-cert", str(certs.server_cert),
                  "--tls-key", str(certs.server_key), *extra],
                 svc.tmp / "binlog-server.log") as proc:
        yield proc


@contextmanager
def tls_source(tmp_path: Path, changes: int, seed: int, *, client_ca: bool = False
               ) -> Iterator[tuple[Path, BinlogService, Certs, subprocess.Popen[bytes]]]:
    """A SQLite source with ``changes`` transactions, its relay, certificates and the
    binlog server with TLS (requiring client certificates of the CA when ``client_ca``),
    started and not waited for."""
    certs = make_certs(tmp_path / "certs")
    db = make_source(tmp_path)
    with BinlogService(db, tmp_path, ALL, serve=False) as svc:
        write_changes(db, changes, seed=seed)
        extra = ["--tls-client-ca", str(certs.ca)] if client_ca else []
        with tls_service(svc, certs, *extra) as proc:
            yield db, svc, certs, proc


def tls_settings(svc: BinlogService, ca: Path) -> dict[str, Any]:
    """pymysql's connection settings: TLS, the server's certificate and host verified."""
    return {"host": "127.0.0.1", "port": svc.port, "user": USER, "password": PASSWORD,
            "ssl_ca": str(ca), "ssl_verify_cert": True, "ssl_verify_identity": True,
            # write_timeout too: pymysql sends the SSL request with the socket set to it,
            # and the TLS handshake after it inherits that (None: it would wait forever)
            "connect_timeout": HANDSHAKE_TIMEOUT, "read_timeout": HANDSHAKE_TIMEOUT,
            "write_timeout": HANDSHAKE_TIMEOUT}


def connect_once_listening(svc: BinlogService, proc: subprocess.Popen[bytes],
                           settings: dict[str, Any]) -> pymysql.connections.Connection[Any]:
    """The first connection, retried only while nothing listens yet (refused at once);
    any other failure (a hung handshake times out) is the test's failure."""
    deadline = time.monotonic() + 60
    while True:
        assert proc.poll() is None, (svc.tmp / "binlog-server.log").read_text()[-2000:]
        with socket.socket() as probe:
            listening = probe.connect_ex(("127.0.0.1", svc.port)) == 0
        if listening:
            return pymysql.connect(**settings)
        assert time.monotonic() < deadline, "the binlog server did not listen within 60 s"
        time.sleep(0.005)


def rebuild_over_tls(settings: dict[str, Any]) -> Rebuilt:
    """Everything the binlog holds now, read from its first file (non-blocking) by
    python-mysql-replication with ``settings`` (TLS): three TLS connections (SHOW BINARY
    LOGS, the reader's control connection and its dump connection)."""
    con = pymysql.connect(**settings)
    try:
        with con.cursor() as cur:
            cur.execute("SHOW BINARY LOGS")
            files = cur.fetchall()
    finally:
        con.close()
    out = Rebuilt()
    if not files:
        return out  # nothing converted yet
    reader = BinLogStreamReader(connection_settings=dict(settings), server_id=7101,
                                blocking=False, resume_stream=True, log_file=files[0][0],
                                log_pos=4)
    try:
        apply_events(iter(reader), out, KEYS, reader)
    finally:
        reader.close()
    return out


def test_replication_over_tls_from_the_moment_the_service_listens_rebuilds_the_source(
        tmp_path: Path) -> None:
    # a backlog of changes: the converter is busy as it starts
    with tls_source(tmp_path, 150, 11) as (db, svc, certs, proc):
        first = connect_once_listening(svc, proc, tls_settings(svc, certs.ca))
        try:
            with first.cursor() as cur:
                cur.execute("SELECT @@version")
                assert cur.fetchone() == ("8.0.36-databus",)
        finally:
            first.close()
        # the source keeps changing, so the converter stays busy while ten readers
        # connect (thirty TLS handshakes), each reading the binlog so far
        stop = threading.Event()

        def keep_writing() -> None:
            seed = 100
            while not stop.is_set():
                write_changes(db, 3, seed=seed)
                seed += 1

        writer = threading.Thread(target=keep_writing)
        writer.start()
        try:
            rows = [rebuild_over_tls(tls_settings(svc, certs.ca)).rows for _ in range(10)]
        finally:
            stop.set()
            writer.join()
        assert rows == sorted(rows) and rows[-1] > 0  # each read the binlog so far
        got: list[Rebuilt] = []

        def same() -> bool:
            got[:] = [rebuild_over_tls(tls_settings(svc, certs.ca))]
            return equal_to_source(db, got[0])

        wait_until(same, 120, "the binlog rebuilt over TLS to equal SQLite")
        assert len(set(got[0].gtids)) == len(got[0].gtids)


def _mysql_ssl_request_and_client_hello(port: int, ca: Path, *, one_write: bool) -> str:
    """A MySQL client's TLS upgrade by hand: read the server's greeting, send the SSL
    request and the TLS ClientHello (in one write, or 0.2 s apart), finish the TLS
    handshake. Returns the TLS version; raises TimeoutError when the server does not
    answer the handshake within HANDSHAKE_TIMEOUT."""
    with socket.create_connection(("127.0.0.1", port), timeout=HANDSHAKE_TIMEOUT) as sock:
        (header,) = struct.unpack("<I", sock.recv(4, socket.MSG_WAITALL))
        greeting = sock.recv(header & 0xFFFFFF, socket.MSG_WAITALL)
        assert greeting[0] == 10  # HandshakeV10
        # CLIENT_PROTOCOL_41 | CLIENT_SSL | CLIENT_SECURE_CONNECTION | CLIENT_PLUGIN_AUTH
        caps = 0x200 | 0x800 | 0x8000 | 0x80000
        body = struct.pack("<IIB", caps, 1 << 24, 45) + bytes(23)
        ssl_request = struct.pack("<I", len(body) | (1 << 24)) + body
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        tls = ssl.create_default_context(cafile=str(ca)).wrap_bio(
            incoming, outgoing, server_hostname="127.0.0.1")
        with pytest.raises(ssl.SSLWantReadError):
            tls.do_handshake()
        client_hello = outgoing.read()
        if one_write:
            sock.sendall(ssl_request + client_hello)
        else:
            sock.sendall(ssl_request)
            time.sleep(0.2)
            sock.sendall(client_hello)
        while True:
            data = sock.recv(65536)  # socket.timeout (a TimeoutError) when nothing comes
            assert data, "the server closed the connection during the TLS handshake"
            incoming.write(data)
            try:
                tls.do_handshake()
            except ssl.SSLWantReadError:
                sock.sendall(outgoing.read())
                continue
            sock.sendall(outgoing.read())
            version = tls.version()
            assert version is not None
            return version


def test_tls_is_required_verified_and_survives_a_client_hello_read_with_the_ssl_request(
        tmp_path: Path) -> None:
    with tls_source(tmp_path, 5, 3) as (db, svc, certs, proc):
        connect_once_listening(svc, proc, tls_settings(svc, certs.ca)).close()
        # the SSL request and the ClientHello in one segment: one server read gets both
        for one_write in (True, False, True, True):
            assert _mysql_ssl_request_and_client_hello(
                svc.port, certs.ca, one_write=one_write).startswith("TLSv1.")
        # TLS is required: a client without it is refused with MySQL's 3159
        # (ssl_disabled: pymysql otherwise upgrades whenever the server offers TLS)
        plain: dict[str, Any] = {
            "host": "127.0.0.1", "port": svc.port, "user": USER, "password": PASSWORD,
            "ssl_disabled": True, "connect_timeout": HANDSHAKE_TIMEOUT,
            "read_timeout": HANDSHAKE_TIMEOUT, "write_timeout": HANDSHAKE_TIMEOUT}
        with pytest.raises(pymysql.err.OperationalError) as refused:
            pymysql.connect(**plain)
        assert refused.value.args[0] == ER_SECURE_TRANSPORT_REQUIRED
        reader = BinLogStreamReader(connection_settings=plain, server_id=7102,
                                    blocking=False)
        with pytest.raises(pymysql.err.OperationalError) as refused:
            next(iter(reader))
        reader.close()
        assert refused.value.args[0] == ER_SECURE_TRANSPORT_REQUIRED
        # the certificate is verified: a client trusting another CA does not connect
        with pytest.raises(pymysql.err.OperationalError) as untrusted:
            pymysql.connect(**tls_settings(svc, certs.other_ca))
        assert "CERTIFICATE_VERIFY_FAILED" in str(untrusted.value)
        # and the right CA reads the binlog
        trusted = tls_settings(svc, certs.ca)
        wait_until(lambda: equal_to_source(db, rebuild_over_tls(trusted)), 120,
                   "the binlog rebuilt over TLS to equal SQLite")


def test_mutual_tls_reads_with_a_client_certificate_and_refuses_a_client_without_one(
        tmp_path: Path) -> None:
    with tls_source(tmp_path, 5, 5, client_ca=True) as (db, svc, certs, proc):
        with_cert = {**tls_settings(svc, certs.ca), "ssl_cert": str(certs.client_cert),
                     "ssl_key": str(certs.client_key)}
        connect_once_listening(svc, proc, with_cert).close()
        with pytest.raises(pymysql.err.OperationalError):
            pymysql.connect(**tls_settings(svc, certs.ca))  # no client certificate
        wait_until(lambda: equal_to_source(db, rebuild_over_tls(with_cert)), 120,
                   "the binlog rebuilt over mutual TLS to equal SQLite")
