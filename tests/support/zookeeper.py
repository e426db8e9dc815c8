"""A private ZooKeeper server for tests: standalone, free port, temp data directory.

Runs ``org.apache.zookeeper.server.ZooKeeperServerMain`` from the pinned Java bundle
``zookeeper`` (scripts/java/zookeeper.pom.xml, fetched once by scripts/setup.sh;
``databus.javadeps.classpath``). The admin HTTP server is off (it would take port
8080) and only the ``ruok``/``srvr`` four-letter words are on (``srvr`` tells readiness).
``pause()``/``resume()`` (SIGSTOP/SIGCONT) and ``stop()``/``start()`` let a test
simulate an outage.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from databus.javadeps import classpath
from tests.support.procs import free_port
from tests.support.wait import wait_until


@dataclass
class ZooKeeper:
    """One standalone server; ``tick_ms`` sets the session timeout bounds
    (2x to 20x the tick)."""

    port: int = field(default_factory=free_port)
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="databus-zk-")))
    tick_ms: int = 500
    proc: subprocess.Popen[bytes] | None = None

    @property
    def hosts(self) -> str:
        """The connection string (``127.0.0.1:PORT``) for kazoo and ``zk://`` URLs."""
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> None:
        conf = self.root / "zoo.cfg"
        conf.write_text(f"tickTime={self.tick_ms}\ndataDir={self.root / 'data'}\n"
                        f"clientPort={self.port}\nclientPortAddress=127.0.0.1\n"
                        "admin.enableServer=false\n4lw.commands.whitelist=ruok,srvr\n")
        java = shutil.which("java")
        if java is None:
            raise RuntimeError("java is not installed: run `bash scripts/setup.sh`")
        with (self.root / "server.log").open("ab") as log:
            self.proc = subprocess.Popen(
                # a test server lives minutes: C1 and one GC thread spend less CPU
                [java, "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                 "-cp", classpath("zookeeper"),
                 "org.apache.zookeeper.server.ZooKeeperServerMain", str(conf)],
                stdout=log, stderr=subprocess.STDOUT)
        proc = self.proc

        def ready() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"ZooKeeper exited with {proc.returncode}: "
                                   f"see {self.root / 'server.log'}")
            return "Mode:" in self.four_letter("srvr")  # "imok" comes before serving

        wait_until(ready, timeout, f"ZooKeeper on port {self.port}", interval=0.1)

    def four_letter(self, word: str) -> str:
        """The answer to a four-letter command, or "" when nothing answers."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=2) as s:
                s.sendall(word.encode())
                chunks = []
                while data := s.recv(4096):
                    chunks.append(data)
                return b"".join(chunks).decode()
        except OSError:
            return ""

    def pause(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # a paused JVM cannot act on SIGTERM
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> ZooKeeper:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
