"""A private PostgreSQL server for tests: own data directory, free port, trust auth.

Started from Debian's binaries (``initdb`` + ``postgres`` of the newest
``/usr/lib/postgresql/N``; the set-up installs ``postgresql`` when missing),
never the system service. PostgreSQL refuses to run as root: when the suite
runs as root, the server runs as the ``postgres`` user in a directory that
user owns. ``wal_level=logical`` so later source tests can use the same
server. ``fsync=off``: a test server's durability is not under test.

``initdb`` runs once per test process: a new server's data directory is a copy of that
pristine cluster (never started itself).
"""

from __future__ import annotations

import atexit
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from tests.support.procs import free_port
from tests.support.sql import sql_engine
from tests.support.wait import wait_until


def bindir() -> Path:
    """The newest installed PostgreSQL's ``bin`` directory."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"),
                   key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0)
    if found:
        return found[-1].parent
    initdb = shutil.which("initdb")
    if initdb:
        return Path(initdb).resolve().parent
    raise RuntimeError("PostgreSQL is not installed: run `bash scripts/setup.sh` "
                       "(it installs Debian's postgresql)")


def _as_postgres() -> dict[str, Any]:
    """Popen arguments that run a command as ``postgres`` when we are root."""
    if os.geteuid() != 0:
        return {}
    return {"user": "postgres", "group": "postgres", "extra_groups": []}


_template: Path | None = None
_template_lock = threading.Lock()


def _owned_by_postgres(path: Path) -> None:
    if os.geteuid() == 0:
        pw = pwd.getpwnam("postgres")
        os.chown(path, pw.pw_uid, pw.pw_gid)


def pristine_datadir() -> Path:
    """This process's one ``initdb``-made data directory (made on first use, removed at
    exit). Never started: only copied."""
    global _template
    with _template_lock:
        if _template is None:
            root = Path(tempfile.mkdtemp(prefix="databus-pg-template-"))
            atexit.register(shutil.rmtree, root, True)
            _owned_by_postgres(root)
            subprocess.run([str(bindir() / "initdb"), "-D", str(root / "data"), "-U",
                            "postgres", "--auth=trust", "--encoding=UTF8", "--locale=C.UTF-8",
                            "--no-sync"],
                           check=True, capture_output=True, timeout=120, **_as_postgres())
            _template = root / "data"
        return _template


SETTINGS = {
    "wal_level": "logical", "max_wal_senders": "10", "max_replication_slots": "10",
    "fsync": "off", "synchronous_commit": "off", "full_page_writes": "off",
    "shared_buffers": "64MB", "max_connections": "200"}
"""The default ``postgres -c`` settings of a test server."""


@dataclass
class PostgreSQL:
    """One private server. ``settings`` are ``postgres -c`` options."""

    settings: dict[str, str] = field(default_factory=lambda: dict(SETTINGS))
    port: int = field(default_factory=free_port)
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="databus-pg-")))
    proc: subprocess.Popen[bytes] | None = None

    @property
    def datadir(self) -> Path:
        return self.root / "data"

    @property
    def log(self) -> Path:
        return self.root / "server.log"

    @property
    def admin_url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def url(self, db: str) -> str:
        """The SQLAlchemy URL of database ``db`` on this server."""
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{db}"

    def start(self, timeout: float = 60.0) -> None:
        _owned_by_postgres(self.root)
        if not self.datadir.exists():  # a copy made as its owner, modes kept (0700)
            subprocess.run(["cp", "-a", str(pristine_datadir()), str(self.datadir)],
                           check=True, capture_output=True, timeout=120, **_as_postgres())
        opts = [a for k, v in self.settings.items() for a in ("-c", f"{k}={v}")]
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [str(bindir() / "postgres"), "-D", str(self.datadir), "-p", str(self.port),
                 "-h", "127.0.0.1", "-k", str(self.root), *opts],
                stdout=log, stderr=subprocess.STDOUT, **_as_postgres())
        proc = self.proc

        def ready() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"postgres exited with {proc.returncode}: see {self.log}")
            try:
                self.execute("SELECT 1")
                return True
            except sa.exc.OperationalError:
                return False

        wait_until(ready, timeout, f"PostgreSQL on port {self.port} accepting connections",
                   interval=0.1)

    def execute(self, *sql: str, db: str = "postgres") -> None:
        with sql_engine(self.url(db), isolation_level="AUTOCOMMIT") as engine, \
                engine.connect() as conn:
            for stmt in sql:
                conn.execute(sa.text(stmt))

    def scalar(self, sql: str, db: str = "postgres") -> Any:
        """The first column of the first row of ``sql`` (None without rows)."""
        with sql_engine(self.url(db), isolation_level="AUTOCOMMIT") as engine, \
                engine.connect() as conn:
            return conn.execute(sa.text(sql)).scalar()

    def drop_slots(self, db: str, timeout: float = 30.0) -> None:
        """Ends the replication connections into database ``db``, then drops its slots
        (a slot in use cannot be dropped: waits until none is)."""
        self.execute("SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots"
                     f" WHERE database = '{db}' AND active_pid IS NOT NULL")
        wait_until(lambda: not self.scalar("SELECT count(*) FROM pg_replication_slots"
                                           f" WHERE database = '{db}' AND active"),
                   timeout, f"the replication slots of {db} to be released")
        self.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots"
                     f" WHERE database = '{db}'")

    @contextmanager
    def fresh_database(self, prefix: str = "databus_test") -> Iterator[str]:
        """Yields the URL of a new database; at exit drops its replication slots (which
        would keep its WAL, and refuse the drop), then the database (forcibly)."""
        name = f"{prefix}_{uuid.uuid4().hex[:12]}"
        self.execute(f"CREATE DATABASE {name}")
        try:
            yield self.url(name)
        finally:
            self.drop_slots(name)
            self.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    def source_url(self, db: str, user: str = "postgres") -> str:
        """The ``postgresql://`` URL of database ``db`` for the PostgreSQL source."""
        return f"postgresql://{user}@127.0.0.1:{self.port}/{db}"

    def shutdown(self, mode: str = "fast") -> None:
        """Stop the server and keep its data directory (``mode``: ``fast``, SIGINT,
        ends sessions and checkpoints; ``smart``, SIGTERM, waits for them; ``immediate``,
        SIGQUIT, a crash: the next start recovers from the WAL). A fast or smart
        shutdown waits for logical replication clients to confirm everything sent."""
        signals = {"fast": signal.SIGINT, "smart": signal.SIGTERM,
                   "immediate": signal.SIGQUIT}
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signals[mode])
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)

    def restart(self, mode: str = "fast") -> None:
        """Stop (``mode``, see :meth:`shutdown`) and start again on the same port and data
        directory."""
        self.shutdown(mode)
        self.start()

    def stop(self) -> None:
        self.shutdown("smart")
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PostgreSQL:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
