"""A private MariaDB server for tests: own data directory, free port, binlog on.

Started from Debian's binaries (``mariadb-install-db`` + ``mariadbd``; the
setup command installs ``mariadb-server`` when missing), never the system
service, so tests can choose server settings (binlog format, row image...)
and restart or kill the server.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pymysql

from tests.support.procs import free_port

BINLOG_SETTINGS = {
    "log-bin": "binlog",
    "server-id": "1",
    "binlog-format": "ROW",
    "binlog-row-image": "FULL",
    "binlog-row-metadata": "FULL",
}


def binaries_present() -> bool:
    return all(shutil.which(b) or Path(f"/usr/sbin/{b}").exists()
               for b in ("mariadbd", "mariadb-install-db"))


@dataclass
class MariaDB:
    """One private server. ``settings`` are mariadbd options (None = leave out)."""

    datadir: Path
    settings: dict[str, str | None] = field(default_factory=lambda: dict(BINLOG_SETTINGS))
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def socket(self) -> Path:
        return self.datadir / "mysqld.sock"

    @property
    def url(self) -> str:
        return f"mysql://root@127.0.0.1:{self.port}"

    def install(self) -> None:
        self.datadir.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["mariadb-install-db", "--no-defaults", f"--datadir={self.datadir}",
             "--auth-root-authentication-method=normal", "--skip-test-db",
             *(["--user=root"] if os.geteuid() == 0 else [])],
            check=True, capture_output=True, timeout=120)

    def start(self, timeout: float = 60.0) -> None:
        if not (self.datadir / "mysql").exists():
            self.install()
        opts = [f"--{k}={v}" if v is not None else f"--{k}" for k, v in self.settings.items()]
        args = [shutil.which("mariadbd") or "/usr/sbin/mariadbd", "--no-defaults",
                f"--datadir={self.datadir}", f"--port={self.port}", f"--socket={self.socket}",
                "--bind-address=127.0.0.1", f"--pid-file={self.datadir / 'mariadbd.pid'}",
                "--skip-name-resolve", "--innodb-buffer-pool-size=64M",
                "--innodb-log-file-size=32M", *opts,
                *(["--user=root"] if os.geteuid() == 0 else [])]
        log = (self.datadir / "server.log").open("ab")
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mariadbd exited: see {self.datadir / 'server.log'}")
            try:
                self.connect().close()
                return
            except pymysql.err.OperationalError:
                time.sleep(0.1)
        raise RuntimeError("mariadbd did not accept connections in time")

    def connect(self, db: str | None = None) -> pymysql.connections.Connection:  # type: ignore[type-arg]
        return pymysql.connect(host="127.0.0.1", port=self.port, user="root", password="",
                               database=db, autocommit=True, connect_timeout=5)

    def execute(self, *sql: str) -> None:
        con = self.connect()
        try:
            with con.cursor() as cur:
                for stmt in sql:
                    cur.execute(stmt)
        finally:
            con.close()

    def gtid_pos(self) -> str:
        """The server's binlog GTID state (``@@gtid_binlog_pos``), e.g. ``0-1-12``."""
        con = self.connect()
        try:
            with con.cursor() as cur:
                cur.execute("SELECT @@gtid_binlog_pos")
                row = cur.fetchone()
                return str(row[0]) if row else ""
        finally:
            con.close()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)
