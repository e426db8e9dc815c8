"""sysbench's ``oltp_write_only`` against a private MariaDB, for benchmarks.

Debian's ``sysbench`` (1.0.20, with its MySQL driver): ``DATABUS_SETUP_BENCH=1 bash
scripts/setup.sh`` installs it; the test suite does not need it. The workload is
sysbench's own: per transaction, on tables ``sbtest1..N`` (``id`` INT primary key,
``k`` INT, ``c`` CHAR(120), ``pad`` CHAR(60)), an UPDATE of ``k``, an UPDATE of ``c``,
and a DELETE then an INSERT of one id: four row changes, one of them a delete followed
by a re-insert of the same key.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.support.mariadb import MariaDB

DATABASE = "sbtest"


def binary() -> str:
    found = shutil.which("sysbench")
    if found is None:
        raise RuntimeError("sysbench is not installed: run `DATABUS_SETUP_BENCH=1 bash"
                           " scripts/setup.sh` (Debian's sysbench)")
    return found


@dataclass(frozen=True)
class Workload:
    """``oltp_write_only`` settings: ``rate`` 0 = as fast as it goes."""

    tables: int = 4
    table_size: int = 20_000
    threads: int = 4
    rate: int = 0

    def args(self, server: MariaDB) -> list[str]:
        return [binary(), "oltp_write_only", "--db-driver=mysql", "--mysql-host=127.0.0.1",
                f"--mysql-port={server.port}", "--mysql-user=root", f"--mysql-db={DATABASE}",
                f"--tables={self.tables}", f"--table-size={self.table_size}",
                f"--threads={self.threads}", f"--rate={self.rate}"]


@dataclass(frozen=True)
class Result:
    """What one ``run`` reported."""

    seconds: float
    transactions: int
    writes: int  # write statements: one row change each

    @property
    def tps(self) -> float:
        return self.transactions / self.seconds

    @property
    def rows_per_s(self) -> float:
        return self.writes / self.seconds


def prepare(server: MariaDB, workload: Workload, log: Path) -> None:
    """Create the database and sysbench's tables with their rows."""
    server.execute(f"CREATE DATABASE IF NOT EXISTS {DATABASE}")
    with log.open("ab") as fh:
        subprocess.run([*workload.args(server), "prepare"], check=True, stdout=fh,
                       stderr=subprocess.STDOUT, timeout=600)


def start(server: MariaDB, workload: Workload, seconds: float, log: Path
          ) -> subprocess.Popen[bytes]:
    """``run`` for ``seconds`` in the background; :func:`finish` reads its result."""
    fh = log.open("wb")
    try:
        return subprocess.Popen([*workload.args(server), f"--time={int(seconds)}",
                                 "--report-interval=0", "run"],
                                stdout=fh, stderr=subprocess.STDOUT)
    finally:
        fh.close()


def finish(proc: subprocess.Popen[bytes], log: Path, timeout: float = 600) -> Result:
    """Wait for a :func:`start`ed run; its figures from its report."""
    if proc.wait(timeout) != 0:
        raise RuntimeError(f"sysbench failed ({proc.returncode}): see {log}")
    return parse(log.read_text())


def parse(text: str) -> Result:
    """The figures of a sysbench ``run`` report."""
    def number(pattern: str) -> str:
        m = re.search(pattern, text)
        if m is None:
            raise RuntimeError(f"no {pattern!r} in sysbench's report:\n{text[-2000:]}")
        return m.group(1)

    return Result(seconds=float(number(r"total time:\s+([0-9.]+)s")),
                  transactions=int(number(r"transactions:\s+(\d+)")),
                  writes=int(number(r"write:\s+(\d+)")))
