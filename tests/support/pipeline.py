"""The process-pipeline harness of the end-to-end tests: named ``databus`` processes
(relay, bootstrap, replicate, recorder...) of one test.

A test's pipeline subclasses :class:`ProcessPipeline` and says only what differs: the
command line of each name (:meth:`args`) and the URL that answers once it is ready
(:meth:`ready_url`). Logs are kept in ``tmp/<name>.log`` for post-mortems; every wait
fails as soon as one of the processes died, naming its log. Used as a context manager
it stops every process at exit.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Self, TypeVar

from tests.support.mariadb import MariaDB
from tests.support.procs import kill9, spawn, stop, wait_http
from tests.support.wait import wait_until

T = TypeVar("T")


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

    def start(self, name: str) -> None:
        self.procs[name] = spawn(self.args(name), self.log(name))
        url = self.ready_url(name)
        if url is not None:
            wait_http(url, self.procs[name])

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

        return wait_until(alive_and, timeout, f"{what} (logs in {self.tmp})", interval=interval)

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
