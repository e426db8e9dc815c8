"""Driving the Debezium harness (``DebeziumHarness.java``) from Python.

:func:`classpath` builds it (``bench/peers/build.sh``: the pinned bundle
``scripts/java/debezium.pom.xml``, compiled into ``.cache/peers``). :class:`Debezium`
runs one harness process against a private MariaDB: it creates the control table
``peerctl.mark``, starts the JVM, pings the control table until the connector says it
is streaming, and stops it with a row holding its stop token or at ``--expect``
events. Offsets and schema history live in ``workdir``, so a second run resumes where
the first stopped.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import IO, Any

from tests.support.mariadb import MariaDB

ROOT = Path(__file__).resolve().parents[2]
JARS = Path(os.environ.get("DATABUS_JAVA_CACHE", ROOT / ".cache" / "java")) / "debezium"


def cached() -> bool:
    """Whether the bundle's jars are here (then :func:`classpath` fetches nothing)."""
    lock = ROOT / "scripts" / "java" / "debezium.sha256"
    if not JARS.is_dir() or not lock.exists():
        return False
    names = {line.split()[1] for line in lock.read_text().splitlines() if line.strip()}
    return names == {p.name for p in JARS.iterdir()}


def classpath() -> str:
    out = subprocess.run(["bash", str(ROOT / "bench" / "peers" / "build.sh")], check=True,
                         capture_output=True, text=True, timeout=900)
    return out.stdout.strip().splitlines()[-1]


def prepare(m: MariaDB) -> None:
    m.execute("CREATE DATABASE IF NOT EXISTS peerctl",
              "CREATE TABLE IF NOT EXISTS peerctl.mark"
              " (id INT AUTO_INCREMENT PRIMARY KEY, v VARCHAR(16))")


def mark(m: MariaDB, value: str) -> None:
    m.execute(f"INSERT INTO peerctl.mark (v) VALUES ('{value}')")


class Debezium:
    """One harness process (see the module docstring)."""

    def __init__(self, m: MariaDB, workdir: Path, *, mode: str, tables: str, cp: str,
                 expect: int = 0, out: Path | None = None, heap: str | None = None,
                 extra: dict[str, str] | None = None) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.token = f"stop-{uuid.uuid4().hex[:8]}"  # a stop row of an earlier run is no stop
        opts = {"port": str(m.port), "mode": mode, "tables": tables, "expect": str(expect),
                "stop-token": self.token,
                "offsets": str(workdir / "offsets.dat"),
                "history": str(workdir / "history.dat"), **(extra or {})}
        if out is not None:
            opts["out"] = str(out)
        args = ["java", *([f"-Xmx{heap}"] if heap else []), "-cp", cp, "DebeziumHarness"]
        for k, v in opts.items():
            args += [f"--{k}", v]
        self.m = m
        self.log = (workdir / "harness.log").open("ab")
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self.log, text=True)
        self.lines: list[str] = []
        self._streaming = threading.Event()
        self._reader = threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True)
        self._reader.start()

    def _read(self, stream: IO[str] | None) -> None:
        assert stream is not None
        for line in stream:
            self.lines.append(line.rstrip("\n"))
            if line.startswith("STREAMING"):
                self._streaming.set()

    def wait_streaming(self, timeout: float = 180.0) -> None:
        """Ping the control table until the connector has streamed a ping."""
        deadline = time.monotonic() + timeout
        while not self._streaming.wait(0.5):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the Debezium harness did not start streaming: {self.lines}")
            mark(self.m, "ping")

    def stop(self) -> None:
        mark(self.m, self.token)

    def result(self, timeout: float = 900.0) -> dict[str, Any]:
        try:
            self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self._reader.join(10)
            self.log.close()
        for line in self.lines:
            if line.startswith("RESULT "):
                res: dict[str, Any] = json.loads(line[len("RESULT "):])
                if res.get("failure") or not res.get("finished"):
                    raise RuntimeError(f"Debezium harness failed: {res}")
                return res
        raise RuntimeError(f"no RESULT from the Debezium harness: {self.lines}")
