"""The process-pipeline harness of the end-to-end tests: named ``databus`` processes
(relay, bootstrap, replicate, recorder...) of one test.

A test's pipeline subclasses :class:`ProcessPipeline` and says only what differs: the
command line of each name (:meth:`args`) and the URL that answers once it is ready
(:meth:`ready_url`). Logs are kept in ``tmp/<name>.log`` for post-mortems; every wait
fails as soon as one of the processes died, naming its log. Used as a context manager
it stops every process at exit.

The command lines come from one set of builders: :func:`relay_args` (``databus relay``
from flags or a config file), :func:`write_config` (a component's YAML),
:func:`replicate_args` and :func:`recorder_args` (``tests.support.recorder``);
:func:`http_url` and :func:`relay_max_scn` read what a relay holds.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Self, TypeVar

import httpx
import yaml

from tests.support.mariadb import MariaDB
from tests.support.procs import DATABUS, kill9, spawn, stop, wait_http
from tests.support.wait import wait_until

T = TypeVar("T")


def http_url(port: int) -> str:
    return f"http://127.0.0.1:{port}"


def relay_args(port: int, *, config: Path | None = None, source: str | None = None,
               tables: str | None = None, snapshot_mode: str | None = "no_data",
               buffer_path: Path | None = None, buffer_size: int | None = None,
               more: tuple[str, ...] = ()) -> list[str]:
    """``databus relay`` on ``port``: from ``config`` (a YAML file, which then names its
    own port: ``port`` only documents it) or from flags; stream-only unless
    ``snapshot_mode`` says otherwise (None: the relay's default)."""
    if config is not None:
        return [*DATABUS, "relay", "--config", str(config), *more]
    assert source is not None, "a relay from flags needs its --source"
    args = [*DATABUS, "relay", "--source", source, "--port", str(port)]
    if tables is not None:
        args += ["--tables", tables]
    if snapshot_mode is not None:
        args += ["--snapshot-mode", snapshot_mode]
    if buffer_path is not None:
        args += ["--buffer-path", str(buffer_path)]
    if buffer_size is not None:
        args += ["--buffer-size", str(buffer_size)]
    return [*args, *more]


def write_config(path: Path, config: Mapping[str, Any]) -> Path:
    """``config`` as the YAML file ``path`` (a relay's, a bootstrap service's...)."""
    path.write_text(yaml.safe_dump(dict(config)))
    return path


def replicate_args(relay: str, target: str, *more: str) -> list[str]:
    """``databus replicate`` from ``relay`` (a URL, URLs or a zk:// address) into
    ``target`` (a SQLAlchemy URL)."""
    return [*DATABUS, "replicate", "--relay", relay, "--target", target, *more]


def recorder_args(relay: str, out: Path, checkpoint: Path, *more: str) -> list[str]:
    """``tests.support.recorder``: every window ``relay`` serves, one line each in
    ``out`` (``more``: ``--group`` and the like)."""
    return [sys.executable, "-m", "tests.support.recorder", "--relay", relay,
            "--out", str(out), "--checkpoint", str(checkpoint), *more]


def relay_max_scn(url: str) -> int:
    """The newest window SCN the relay at ``url`` holds."""
    return int(httpx.get(f"{url}/containerStats/buffer/max_scn", timeout=10).json())


class ProcessPipeline:
    """See the module docstring. Subclasses set ``tmp`` (a dataclass field)."""

    tmp: Path

    @property
    def procs(self) -> dict[str, subprocess.Popen[bytes]]:
        if "_procs" not in self.__dict__:
            self.__dict__["_procs"] = {}
        procs: dict[str, subprocess.Popen[bytes]] = self.__dict__["_procs"]
        return procs

    def args(self, name: str) -> list[str]:
        raise NotImplementedError

    def ready_url(self, name: str) -> str | None:
        """A URL that answers once ``name`` serves (None: no wait)."""
        return None

    def log(self, name: str) -> Path:
        return self.tmp / f"{name}.log"

    start_timeout = 30.0
    """Seconds :meth:`start` waits for a process's ready URL."""

    def start(self, name: str) -> None:
        self.procs[name] = spawn(self.args(name), self.log(name))
        url = self.ready_url(name)
        if url is not None:
            wait_http(url, self.procs[name], self.start_timeout)

    def kill(self, name: str) -> None:
        kill9(self.procs[name])

    def alive(self) -> None:
        for name, p in self.procs.items():
            assert p.poll() is None, f"{name} died ({p.returncode}): see {self.log(name)}"

    def wait(self, what: str, pred: Callable[[], T], timeout: float = 180.0,
             interval: float = 0.1) -> T:
        """``pred()``'s first truthy value, while every process stays alive."""
        def alive_and() -> T:
            self.alive()
            return pred()

        try:
            return wait_until(alive_and, timeout, f"{what} (logs in {self.tmp})",
                              interval=interval)
        except AssertionError as exc:
            # the temporary directory is gone by the time a CI failure is read
            raise AssertionError(f"{exc}\n{self.log_tails()}") from None

    def log_tails(self, lines: int = 12) -> str:
        """The last ``lines`` lines of every process's log: a timed-out wait's post-mortem."""
        out = []
        for name in self.procs:
            path = self.log(name)
            text = path.read_text(errors="replace").splitlines() if path.exists() else []
            out.append(f"--- {name} ({path.name}, last {lines} lines)")
            out.extend(line[:300] for line in text[-lines:])
        return "\n".join(out)

    def wait_dump(self, server: MariaDB, timeout: float = 120.0) -> None:
        """Until a relay's replication connection streams from ``server`` (a new relay
        starts at the binlog's end: a workload must not begin before)."""
        self.wait("the relay to start its binlog dump", server.binlog_dumps, timeout)

    def close(self) -> None:
        for p in self.procs.values():
            stop(p)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RelayPipeline(ProcessPipeline):
    """A pipeline around one relay process named ``relay`` on ``port`` (a field of the
    subclass, like ``tmp``): its URL, that it is ready once ``/admin`` answers, its newest
    window, and where a recorder of it writes (``record``)."""

    port: int

    @property
    def url(self) -> str:
        return http_url(self.port)

    @property
    def record(self) -> Path:
        return self.tmp / "recorded.jsonl"

    def ready_url(self, name: str) -> str | None:
        return f"{self.url}/admin" if name == "relay" else None

    def max_scn(self) -> int:
        return relay_max_scn(self.url)


class BootstrapPipeline(ProcessPipeline):
    """A relay named ``relay`` on ``relay_port``, a bootstrap server named ``bootstrap``
    on ``bs_port`` (fields of the subclass, like ``tmp``) and a SQLite replica
    (``replica.db``) that ``replicate`` fills: both servers ready once ``/admin``
    answers; the checkpoint the replica committed (what survives a kill -9)."""

    relay_port: int
    bs_port: int

    @property
    def replica(self) -> Path:
        return self.tmp / "replica.db"

    def ready_url(self, name: str) -> str | None:
        port = {"relay": self.relay_port, "bootstrap": self.bs_port}.get(name)
        return f"{http_url(port)}/admin" if port else None

    def replica_checkpoint(self) -> dict[str, object] | None:
        """The checkpoint committed in the replica; None before there is one."""
        if not self.replica.exists():
            return None
        con = sqlite3.connect(self.replica, timeout=30)
        try:
            row = con.execute("SELECT checkpoint FROM databus_checkpoint").fetchone()
        except sqlite3.OperationalError:
            return None
        finally:
            con.close()
        return None if row is None else dict(json.loads(row[0]))
