"""A private ZooKeeper server for tests: standalone, free port, temp data directory.

Runs ``org.apache.zookeeper.server.ZooKeeperServerMain`` from the pinned Java bundle
``zookeeper`` (scripts/java/zookeeper.pom.xml, fetched once by scripts/setup.sh;
``databus.javadeps.classpath``). The admin HTTP server is off (it would take port
8080) and only the ``ruok``/``srvr`` four-letter words are on (``srvr`` tells readiness).
``pause()``/``resume()`` (SIGSTOP/SIGCONT) and ``stop()``/``start()`` let a test
simulate an outage.

:class:`Ensemble` (``with Ensemble(3) as zk:``) is a replicated ZooKeeper of ``n``
such servers on private ports (client, quorum and election port each) and directories;
``zk.hosts`` is the connection string of all of them, and each member
(``zk.servers[i]``) can be stopped, killed, paused and started again on its own, so a
test can take one member away, then a majority.
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
    myid: int = 0  # an ensemble member's id (0: standalone)
    quorum: str = ""  # an ensemble member's server.N lines

    @property
    def hosts(self) -> str:
        """The connection string (``127.0.0.1:PORT``) for kazoo and ``zk://`` URLs."""
        return f"127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> None:
        self.launch()
        self.wait_serving(timeout)

    def launch(self) -> None:
        """Start the JVM without waiting (an ensemble member serves only in a quorum)."""
        data = self.root / "data"
        data.mkdir(parents=True, exist_ok=True)
        if self.myid:
            (data / "myid").write_text(f"{self.myid}\n")
        conf = self.root / "zoo.cfg"
        conf.write_text(f"tickTime={self.tick_ms}\ndataDir={data}\n"
                        f"clientPort={self.port}\nclientPortAddress=127.0.0.1\n"
                        "admin.enableServer=false\n4lw.commands.whitelist=ruok,srvr\n"
                        + (f"initLimit=10\nsyncLimit=4\n{self.quorum}" if self.myid else ""))
        java = shutil.which("java")
        if java is None:
            raise RuntimeError("java is not installed: run `bash scripts/setup.sh`")
        main = ("org.apache.zookeeper.server.quorum.QuorumPeerMain" if self.myid
                else "org.apache.zookeeper.server.ZooKeeperServerMain")
        with (self.root / "server.log").open("ab") as log:
            self.proc = subprocess.Popen(
                # a test server lives minutes: C1 and one GC thread spend less CPU
                [java, "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                 "-cp", classpath("zookeeper"), main, str(conf)],
                stdout=log, stderr=subprocess.STDOUT)

    def serving(self) -> bool:
        """Whether it answers clients now (a member: within a quorum)."""
        return "Mode:" in self.four_letter("srvr")  # "imok" comes before serving

    def mode(self) -> str:
        """``standalone``, ``leader``, ``follower``, or "" when not serving."""
        for line in self.four_letter("srvr").splitlines():
            if line.startswith("Mode:"):
                return line.split(":", 1)[1].strip()
        return ""

    def wait_serving(self, timeout: float = 60.0) -> None:
        proc = self.proc
        assert proc is not None

        def ready() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"ZooKeeper exited with {proc.returncode}: "
                                   f"see {self.root / 'server.log'}")
            return self.serving()

        wait_until(ready, timeout, f"ZooKeeper on port {self.port}", interval=0.1)

    def kill(self) -> None:
        """SIGKILL (a crashed machine): nothing is closed cleanly."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(30)

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


class Ensemble:
    """``n`` ZooKeeper servers in one quorum (see the module docstring)."""

    def __init__(self, n: int = 3, tick_ms: int = 500) -> None:
        ports = [(free_port(), free_port()) for _ in range(n)]
        quorum = "".join(f"server.{i + 1}=127.0.0.1:{q}:{e}\n" for i, (q, e) in enumerate(ports))
        self.servers = [ZooKeeper(tick_ms=tick_ms, myid=i + 1, quorum=quorum)
                        for i in range(n)]

    @property
    def hosts(self) -> str:
        """Every member's ``127.0.0.1:PORT``, comma-separated (kazoo, ``zk://`` URLs)."""
        return ",".join(s.hosts for s in self.servers)

    def start(self, timeout: float = 90.0) -> None:
        for s in self.servers:
            s.launch()
        for s in self.servers:
            s.wait_serving(timeout)

    def leader(self) -> ZooKeeper:
        """The member the quorum elected (it changes when that one goes)."""
        for s in self.servers:
            if s.mode() == "leader":
                return s
        raise RuntimeError("no ZooKeeper member says it leads")

    def close(self) -> None:
        for s in self.servers:
            s.close()

    def __enter__(self) -> Ensemble:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
