"""A private MariaDB server for tests: own data directory, free port, binlog on.

Started from Debian's binaries (``mariadb-install-db`` + ``mariadbd``; the
setup command installs ``mariadb-server`` when missing), never the system
service, so tests can choose server settings (binlog format, row image...)
and restart or kill the server.

``mariadb-install-db`` runs once per test process: a new server's data directory is a
copy of that pristine one (what the install would write again: the system tables and an
empty InnoDB, no binlog, no user data), so a private server costs its start only.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import tempfile
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pymysql

from databus.sources.mysql.positions import binlog_scn
from tests.support.procs import free_port
from tests.support.wait import wait_until

BINLOG_SETTINGS = {
    "log-bin": "binlog",
    "server-id": "1",
    "binlog-format": "ROW",
    "binlog-row-image": "FULL",
    "binlog-row-metadata": "FULL",
}


def _binary(name: str) -> str:
    found = shutil.which(name) or (f"/usr/sbin/{name}" if Path(f"/usr/sbin/{name}").exists()
                                   else None)
    if found is None:
        raise RuntimeError(f"{name} is not installed: run `bash scripts/setup.sh` "
                           "(it installs Debian's mariadb-server)")
    return found


INSTALL_SETTINGS = ("--innodb-log-file-size=32M",)
"""Server options the data directory is made with: those :meth:`MariaDB.start` gives
every server (a redo log made at another size would be resized at each start)."""

_template: Path | None = None
_template_lock = threading.Lock()


def _install(datadir: Path) -> None:
    datadir.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [_binary("mariadb-install-db"), "--no-defaults", f"--datadir={datadir}",
         "--auth-root-authentication-method=normal", "--skip-test-db", *INSTALL_SETTINGS,
         *(["--user=root"] if os.geteuid() == 0 else [])],
        capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:  # its own words: the exit status alone says nothing
        raise RuntimeError(f"mariadb-install-db exited with {done.returncode}:\n"
                           f"{done.stdout[-3000:]}{done.stderr[-3000:]}")


def pristine_datadir() -> Path:
    """This process's one freshly installed data directory (made on first use, removed
    at exit). Never started: only copied."""
    global _template
    with _template_lock:
        if _template is None:
            root = Path(tempfile.mkdtemp(prefix="databus-mariadb-template-"))
            atexit.register(shutil.rmtree, root, True)
            _install(root / "db")
            _template = root / "db"
        return _template


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
        """A fresh data directory: a copy of :func:`pristine_datadir`."""
        shutil.copytree(pristine_datadir(), self.datadir, dirs_exist_ok=True)

    def start(self, timeout: float = 60.0) -> None:
        if not (self.datadir / "mysql").exists():
            self.install()
        opts = [f"--{k}={v}" if v is not None else f"--{k}" for k, v in self.settings.items()]
        # its own temporary files beside its data, not in /tmp with every other server's
        # (a CI run lost one there mid-query: "Error on delete of '/tmp/#sql-temptable-..'")
        tmpdir = self.datadir.with_name(self.datadir.name + ".tmp")
        tmpdir.mkdir(parents=True, exist_ok=True)
        args = [_binary("mariadbd"), "--no-defaults",
                f"--datadir={self.datadir}", f"--port={self.port}", f"--socket={self.socket}",
                f"--tmpdir={tmpdir}",
                "--bind-address=127.0.0.1", f"--pid-file={self.datadir / 'mariadbd.pid'}",
                "--skip-name-resolve", "--innodb-buffer-pool-size=64M",
                *INSTALL_SETTINGS, *opts,
                *(["--user=root"] if os.geteuid() == 0 else [])]
        log = (self.datadir / "server.log").open("ab")
        self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        proc = self.proc

        def ready() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"mariadbd exited: see {self.datadir / 'server.log'}")
            try:
                self.connect().close()
                return True
            except pymysql.err.OperationalError:
                return False

        wait_until(ready, timeout, f"mariadbd on port {self.port} accepting connections",
                   interval=0.1)

    def url_of(self, db: str) -> str:
        """The SQLAlchemy URL of database ``db`` on this server."""
        return f"mysql+pymysql://root@127.0.0.1:{self.port}/{db}?charset=utf8mb4"

    @contextmanager
    def fresh_database(self, prefix: str = "databus_test") -> Iterator[str]:
        """Yields the SQLAlchemy URL of a new database; drops it at exit."""
        name = f"{prefix}_{uuid.uuid4().hex[:12]}"
        self.execute(f"CREATE DATABASE {name} CHARACTER SET utf8mb4")
        try:
            yield self.url_of(name)
        finally:
            self.execute(f"DROP DATABASE IF EXISTS {name}")

    def __enter__(self) -> MariaDB:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def connect(self, db: str | None = None) -> pymysql.connections.Connection:  # type: ignore[type-arg]
        return pymysql.connect(host="127.0.0.1", port=self.port, user="root", password="",
                               database=db, autocommit=True, connect_timeout=5)

    def execute(self, *sql: str) -> None:
        with self.connect() as con, con.cursor() as cur:
            for stmt in sql:
                cur.execute(stmt)

    def binlog_dumps(self) -> int:
        """Replication connections streaming the binlog now (a relay that started
        capturing at the binlog's end sees only what commits after its dump began)."""
        with self.connect() as con, con.cursor() as cur:
            cur.execute("SELECT count(*) FROM information_schema.processlist"
                        " WHERE command LIKE 'Binlog Dump%'")
            row = cur.fetchone()
            return int(row[0]) if row else 0

    def binlog_position(self) -> tuple[str, int]:
        """The binlog's end (``SHOW MASTER STATUS``): its file and position."""
        with self.connect() as con, con.cursor() as cur:
            cur.execute("SHOW MASTER STATUS")
            row = cur.fetchone()
        assert row is not None, "the server has no binlog"
        return str(row[0]), int(row[1])

    def binlog_end_scn(self) -> int:
        """The SCN the MariaDB source gives the last transaction committed now (its
        binlog file's number and the position after its commit event)."""
        return binlog_scn(*self.binlog_position())

    def gtid_pos(self) -> str:
        """The server's binlog GTID state (``@@gtid_binlog_pos``), e.g. ``0-1-12``."""
        with self.connect() as con, con.cursor() as cur:
            cur.execute("SELECT @@gtid_binlog_pos")
            row = cur.fetchone()
            return str(row[0]) if row else ""

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


def replica_settings(server_id: int) -> dict[str, str | None]:
    """Settings of a replica that can be promoted: its own server_id, its own binlog
    (the same basename as the primary's: positions that look alike, on purpose) with
    what it replicates logged too, GTIDs kept."""
    return {**BINLOG_SETTINGS, "server-id": str(server_id), "log-slave-updates": None}


def start_replication(replica: MariaDB, primary: MariaDB) -> None:
    """Make ``replica`` replicate ``primary`` by GTID (``master_use_gtid=slave_pos``),
    from the primary's first binlog event (both start from the same pristine data
    directory, so the primary's binlog is its whole history)."""
    replica.execute("STOP SLAVE", "RESET SLAVE ALL", "SET GLOBAL gtid_slave_pos = ''",
                    f"CHANGE MASTER TO master_host='127.0.0.1', master_port={primary.port},"
                    " master_user='root', master_password='', master_use_gtid=slave_pos,"
                    " master_connect_retry=1",
                    "START SLAVE")


def replica_applied(replica: MariaDB) -> str:
    """The GTID state the replica applied (``@@gtid_slave_pos``)."""
    with replica.connect() as con, con.cursor() as cur:
        cur.execute("SELECT @@gtid_slave_pos")
        row = cur.fetchone()
        return str(row[0]) if row else ""


def wait_replicated(replica: MariaDB, primary: MariaDB, timeout: float = 60.0) -> None:
    """Until ``replica`` applied every transaction ``primary`` logged so far."""
    want = primary.gtid_pos()
    wait_until(lambda: replica_applied(replica) == want, timeout,
               f"the replica on port {replica.port} to apply {want}", interval=0.1)


def promote(replica: MariaDB) -> None:
    """Stop replicating and forget the primary: the replica takes writes as a primary
    (its binlog continues the same GTID sequence)."""
    replica.execute("STOP SLAVE", "RESET SLAVE ALL")
