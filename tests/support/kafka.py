"""A private Kafka broker for tests: one KRaft node (broker and controller in one JVM),
free ports, temp log directory.

Runs ``kafka.Kafka`` from the pinned Java bundle ``kafka`` (scripts/java/kafka.pom.xml,
fetched once by scripts/setup.sh; ``databus.javadeps.classpath``) after formatting its
storage with ``kafka.tools.StorageTool``. Everything a single node needs is set to one:
the replication factors of the offsets and transaction-state topics, and the minimum
in-sync replicas, so transactions work. ``stop()``/``start()`` restart it on the same
ports and storage (a broker outage); ``kill()`` is a kill -9.

Helpers for the tests: :meth:`KafkaBroker.read_topic` reads a topic to its end as a
``read_committed`` consumer, :meth:`KafkaBroker.topics` lists the topics.
"""

from __future__ import annotations

import base64
import os
import shutil
import signal
import subprocess
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from databus.javadeps import classpath
from tests.support.procs import free_port
from tests.support.wait import wait_until


@dataclass(frozen=True)
class Record:
    """One message as a consumer reads it (tombstones have ``value`` None)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


@dataclass
class KafkaBroker:
    """See the module docstring."""

    port: int = field(default_factory=free_port)
    controller_port: int = field(default_factory=free_port)
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="databus-kafka-")))
    proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap_servers(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def log_file(self) -> Path:
        return self.root / "server.log"

    def _properties(self) -> Path:
        conf = self.root / "server.properties"
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},"
                         f"CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.root / "data"),
            "num.partitions": "1",
            "offsets.topic.replication.factor": "1",
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "4",
            "min.insync.replicas": "1",
            "group.initial.rebalance.delay.ms": "0",
            "auto.create.topics.enable": "true",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
        }
        conf.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        return conf

    def _java(self, main: str, *args: str) -> list[str]:
        java = shutil.which("java")
        if java is None:
            raise RuntimeError("java is not installed: run `bash scripts/setup.sh`")
        return [java, "-Xmx512m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                "-Djava.awt.headless=true", "-cp", classpath("kafka"), main, *args]

    def _format(self, conf: Path) -> None:
        if (self.root / "data" / "meta.properties").exists():
            return
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        with self.log_file.open("ab") as log:
            subprocess.run(self._java("kafka.tools.StorageTool", "format", "-t", cluster_id,
                                      "-c", str(conf)),
                           stdout=log, stderr=subprocess.STDOUT, check=True, timeout=120)

    def start(self, timeout: float = 120.0) -> None:
        conf = self._properties()
        self._format(conf)
        with self.log_file.open("ab") as log:
            self.proc = subprocess.Popen(self._java("kafka.Kafka", str(conf)),
                                         stdout=log, stderr=subprocess.STDOUT)
        proc = self.proc
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers,
                             "socket.timeout.ms": 2000})

        def ready() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"Kafka exited with {proc.returncode}: see {self.log_file}")
            try:
                md = admin.list_topics(timeout=2)
            except Exception:
                return False
            return bool(md.brokers)

        wait_until(ready, timeout, f"Kafka on port {self.port}", interval=0.2)

    def topics(self) -> set[str]:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap_servers})
        return {t for t in admin.list_topics(timeout=10).topics if not t.startswith("__")}

    def read_topic(self, topic: str, timeout: float = 60.0,
                   isolation: str = "read_committed") -> list[Record]:
        """Every message of ``topic`` (all partitions, in offset order per partition) up to
        its end as seen now, as a consumer with ``isolation`` reads it."""
        from confluent_kafka import Consumer, TopicPartition

        consumer = Consumer({"bootstrap.servers": self.bootstrap_servers,
                             "group.id": f"test-{uuid.uuid4().hex}",
                             "enable.auto.commit": False, "isolation.level": isolation,
                             "auto.offset.reset": "earliest"})
        try:
            md = consumer.list_topics(topic, timeout=10)
            tmeta = md.topics.get(topic)
            if tmeta is None or tmeta.error is not None or not tmeta.partitions:
                return []
            parts = [TopicPartition(topic, p, 0) for p in sorted(tmeta.partitions)]
            ends = {}
            for tp in parts:
                # the last stable offset for read_committed: what a consumer can reach
                _, high = consumer.get_watermark_offsets(tp, timeout=10, cached=False)
                ends[tp.partition] = high
            consumer.assign(parts)
            out: list[Record] = []
            pos = {tp.partition: 0 for tp in parts}

            def done() -> bool:
                for p, end in ends.items():
                    if end > 0 and pos[p] < end:
                        pos[p] = max(pos[p], _position(consumer, topic, p))
                        if pos[p] < end:
                            return False
                return True

            def poll() -> bool:
                for msg in consumer.consume(1000, timeout=0.5):
                    if msg.error() is not None:
                        continue
                    out.append(Record(msg.topic(), msg.partition(), msg.offset(), msg.key(),
                                      msg.value()))
                    pos[msg.partition()] = msg.offset() + 1
                return done()

            wait_until(poll, timeout, f"the end of topic {topic}", interval=0)
            return out
        finally:
            consumer.close()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.kill()

    def close(self) -> None:
        self.stop()
        if not os.environ.get("DATABUS_KEEP_KAFKA"):
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> KafkaBroker:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _position(consumer: object, topic: str, partition: int) -> int:
    """The consumer's position in one partition (past aborted batches and markers)."""
    from confluent_kafka import TopicPartition

    got = consumer.position([TopicPartition(topic, partition)])  # type: ignore[attr-defined]
    off = got[0].offset
    return int(off) if off >= 0 else 0
