"""A private Kafka broker for tests: one KRaft node (broker and controller in one JVM),
free ports, temp log directory.

Runs ``kafka.Kafka`` from the pinned Java bundle ``kafka`` (scripts/java/kafka.pom.xml,
fetched once by scripts/setup.sh; ``databus.javadeps.classpath``) after formatting its
storage with ``kafka.tools.StorageTool``. Everything a single node needs is set to one:
the replication factors of the offsets and transaction-state topics, and the minimum
in-sync replicas, so transactions work. ``stop()``/``start()`` restart it on the same
ports and storage (a broker outage); ``kill()`` is a kill -9.

Helpers for the tests: :meth:`KafkaBroker.read_topic` reads a topic to its end as a
``read_committed`` consumer, :meth:`KafkaBroker.topics` lists the topics;
:func:`read_published` reads back what ``databus publish`` wrote for a topic prefix
(changes per table, tombstones, transaction metadata) and rebuilds the tables,
:func:`published_position` is a publisher's committed SCN.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from databus.javadeps import classpath
from tests.support.procs import free_port
from tests.support.shop import Change
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
            subprocess.run(self._java("kafka.tools.StorageTool", "format", f"--cluster-id={cluster_id}",
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
                    part, off = msg.partition(), msg.offset()
                    assert part is not None and off is not None
                    out.append(Record(topic, part, off, msg.key(), msg.value()))
                    pos[part] = off + 1
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


# -- reading what a publisher wrote ------------------------------------------------------------

def payload(raw: bytes | None) -> Any:
    """The JSON of a key or value, without the Connect ``schema`` part when present."""
    if raw is None:
        return None
    obj = json.loads(raw)
    if isinstance(obj, dict) and set(obj) == {"schema", "payload"}:
        return obj["payload"]
    return obj


@dataclass
class Published:
    """What ``databus publish`` holds in Kafka for one topic prefix, read_committed."""

    changes: dict[str, list[Change]]  # table -> (table, op, key text) in topic order
    envelopes: dict[str, list[dict[str, Any]]]  # table -> data envelopes in topic order
    tombstones: dict[str, list[str]]  # table -> keys of tombstones
    follows_delete: bool  # every tombstone right after a delete of its key
    transactions: list[dict[str, Any]]  # records of <prefix>.transaction, in order

    def rows(self, table: str) -> list[tuple[object, ...]]:
        """The table rebuilt from its topic: the last image per key, deletes applied."""
        state: dict[str, tuple[object, ...]] = {}
        for env, (_, op, key) in zip(self.envelopes[table], self.changes[table], strict=True):
            if op == "d":
                state.pop(key, None)
            else:
                state[key] = tuple(env["after"].values())
        return [state[k] for k in sorted(state, key=lambda k: json.loads(k))]


def _key_text(key: dict[str, Any]) -> str:
    values = list(key.values())
    return json.dumps(values[0] if len(values) == 1 else values)


def read_published(broker: KafkaBroker, prefix: str, tables: list[str],
                   db: str = "main") -> Published:
    changes: dict[str, list[Change]] = {}
    envelopes: dict[str, list[dict[str, Any]]] = {}
    tombstones: dict[str, list[str]] = {}
    follows = True
    for table in tables:
        changes[table], envelopes[table], tombstones[table] = [], [], []
        last: Change | None = None
        for rec in broker.read_topic(f"{prefix}.{db}.{table}"):
            key = _key_text(payload(rec.key))
            value = payload(rec.value)
            if value is None:
                tombstones[table].append(key)
                follows = follows and last == (table, "d", key)
                last = None
                continue
            last = (table, value["op"], key)
            changes[table].append(last)
            envelopes[table].append(value)
    transactions = [payload(r.value) for r in broker.read_topic(f"{prefix}.transaction")]
    return Published(changes, envelopes, tombstones, follows, transactions)


def published_position(broker: KafkaBroker, name: str,
                       topic: str = "databus-publish-offsets") -> int:
    """The SCN of the last window publisher ``name`` committed (-1: none)."""
    scn = -1
    for rec in broker.read_topic(topic):
        if rec.key == name.encode() and rec.value is not None:
            scn = int(json.loads(rec.value)["scn"])
    return scn


# -- Spark's own Kafka source over what a publisher wrote ---------------------------------------

def spark_kafka_jars() -> list[str]:
    """The jars of the pinned ``spark-kafka`` bundle (Spark's Kafka source and its
    dependencies; ``ConfigError`` naming the fetch command when not fetched), to put on
    ``spark.jars`` beside the lakehouse jars before the session's JVM starts."""
    from databus import javadeps

    return [str(j) for j in javadeps.jars("spark-kafka")]


def spark_kafka_changes(stream: Any, *, bootstrap_servers: str, topic: str, row_ddl: str,
                        schemas: bool = True, min_partitions: int | None = None,
                        starting_offsets: str = "earliest") -> Any:
    """A streaming DataFrame of ``databus publish``'s messages on ``topic`` read by Spark's
    own Kafka source (``format("kafka")``, ``read_committed``, from ``starting_offsets``:
    ``earliest`` or ``latest``), in the change shape of the databus source's
    ``envelope=flat``: the row's columns (``row_ddl``, e.g. ``"id BIGINT, a BIGINT"``; the
    after image, the before image for a delete) then ``_op`` and ``_sequence`` (struct of
    ``scn`` = ``source.scn``, ``index`` = ``transaction.total_order``: the window and the
    order of the change inside it, the order the relay gives). Tombstones are dropped.
    ``stream`` is ``spark.readStream``; ``schemas``:
    values carry Connect's ``schema``/``payload`` (``--schemas-enable``, the default)."""
    from pyspark.sql import functions as F

    envelope = (f"struct<before: struct<{row_ddl}>, after: struct<{row_ddl}>, op: string,"
                " source: struct<scn: bigint>, transaction: struct<total_order: bigint>>")
    value_type = f"struct<payload: {envelope}>" if schemas else envelope
    reader = (stream.format("kafka").option("kafka.bootstrap.servers", bootstrap_servers)
              .option("subscribe", topic).option("kafka.isolation.level", "read_committed")
              .option("startingOffsets", starting_offsets))
    if min_partitions is not None:
        reader = reader.option("minPartitions", str(min_partitions))
    raw = reader.load()
    parsed = (raw.where(F.col("value").isNotNull())
              .select(F.from_json(F.col("value").cast("string"), value_type).alias("v")))
    e = "v.payload" if schemas else "v"
    return parsed.select(
        F.coalesce(f"{e}.after", f"{e}.before").alias("__row"),
        F.col(f"{e}.op").alias("_op"),
        F.struct(F.col(f"{e}.source.scn").alias("scn"),
                 F.col(f"{e}.transaction.total_order").cast("int").alias("index")
                 ).alias("_sequence"),
    ).select("__row.*", "_op", "_sequence")
