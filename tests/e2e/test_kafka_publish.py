"""SQLite -> relay -> ``databus publish`` -> Kafka, each in its own process, with crashes.

What the database committed (recorded by the writer) is compared with what a
``read_committed`` consumer reads from the topics: every table rebuilt from its topic
equals the source; each table's topic holds exactly the committed changes of that
table, in commit order, once (no loss, no duplicate); a tombstone follows every delete;
the transaction metadata's BEGIN/END records count the data messages. The broker is the
session's (``kafka`` fixture); each test has its own topic prefix and relay. Every test
here is in one xdist group, so one worker starts one broker for them. The claim tests at
the end drive a :class:`~databus.kafka.publisher.Publisher` in the test's process against
that broker (no relay: empty windows) to put two instances of one name in a chosen order.
"""

from __future__ import annotations

import base64
import random
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from databus.core.errors import KafkaFencedError, KafkaUnavailableError
from databus.kafka.config import PublishConfig
from databus.kafka.offsets import write_claim
from databus.kafka.publisher import OFFSETS_TOPIC_CONFIG, Publisher
from tests.support.kafka import KafkaBroker, Published, published_position, read_published
from tests.support.pipeline import (
    RelayPipeline,
    relay_args,
    write_config,
)
from tests.support.procs import DATABUS, free_port
from tests.support.shop import TABLES, Writer, create_shop, table_rows
from tests.support.writers import Repeating

pytest.importorskip("confluent_kafka")

# under pytest-xdist one worker runs them all (tests/conftest.py's scheduler): one
# broker, and its restart disturbs no other test


@dataclass
class Pipeline(RelayPipeline):
    tmp: Path
    db: Path
    port: int
    kafka: KafkaBroker
    prefix: str
    publish_args: list[str] = field(default_factory=list)

    def args(self, name: str) -> list[str]:
        if name == "relay":
            return relay_args(self.port, config=self.tmp / "relay.yaml")
        return [*DATABUS, "publish", "--relay", self.url,
                "--bootstrap-servers", self.kafka.bootstrap_servers,
                "--topic-prefix", self.prefix, "--heartbeat-interval", "1",
                *self.publish_args]

    def wait_published(self, timeout: float = 240.0) -> None:
        """Until the publisher's committed position is the relay's newest window."""
        def caught_up() -> bool:
            top = self.max_scn()
            return top >= 0 and published_position(self.kafka, self.prefix) == top

        self.wait("the publisher to publish the relay's newest window", caught_up, timeout,
                  interval=1.0)


@pytest.fixture
def pipeline(tmp_path: Path, kafka: KafkaBroker, request: pytest.FixtureRequest
             ) -> Iterator[Pipeline]:
    db = tmp_path / "shop.db"
    create_shop(db)
    prefix = f"t{abs(hash(request.node.name)) % 10**8}"
    p = Pipeline(tmp_path, db, free_port(), kafka, prefix)
    write_config(tmp_path / "relay.yaml", {
        "name": "kafka-e2e",
        "source": {"url": f"sqlite:///{db}", "tables": TABLES, "poll_interval": 0.01,
                   "snapshot_mode": "no_data"},  # exact delivery of each transaction
        "buffer": {"capacity_bytes": 128 * 1024 * 1024, "path": str(tmp_path / "relay.buf"),
                   "flush_interval": 0.2},
        "http": {"port": p.port},
    })
    try:
        yield p
    finally:
        p.close()


def _source_json(row: tuple[object, ...]) -> tuple[object, ...]:
    """A source row as its JSON values (blobs base64)."""
    return tuple(base64.b64encode(v).decode() if isinstance(v, bytes) else v for v in row)


def check_published(p: Pipeline, w: Writer) -> dict[str, int]:
    """Everything the module docstring says, for the pipeline's topics."""
    got: Published = read_published(p.kafka, p.prefix, TABLES)
    committed = [c for tx in w.committed for c in tx]
    for t in TABLES:
        want = [c for c in committed if c[0] == t]
        changes = got.changes[t]
        assert len(changes) == len(want), (
            f"{t}: Kafka holds {len(changes)} changes, the database committed {len(want)}")
        for i, (have, expect) in enumerate(zip(changes, want, strict=True)):
            assert have == expect, f"{t}: change #{i} is {have} in Kafka, committed {expect}"
        assert got.rows(t) == [_source_json(r) for r in table_rows(p.db, t)], (
            f"{t} rebuilt from Kafka differs from the source")
        deletes = [k for (_, op, k) in want if op == "d"]
        assert got.tombstones[t] == deletes, f"{t}: tombstones differ from deletes"
    assert got.follows_delete, "a tombstone does not follow its delete"
    # transaction metadata: BEGIN then END per transaction id, END counts = data messages
    per_tx: dict[str, Counter[str]] = {}
    for t in TABLES:
        for env in got.envelopes[t]:
            per_tx.setdefault(env["transaction"]["id"], Counter())[f"main.{t}"] += 1
    begins = [r["id"] for r in got.transactions if r["status"] == "BEGIN"]
    ends = {r["id"]: r for r in got.transactions if r["status"] == "END"}
    assert len(begins) == len(set(begins)) == len(ends) == len(per_tx), (
        "BEGIN/END records do not match the data's transactions once each")
    for txid, counts in per_tx.items():
        end = ends[txid]
        assert end["event_count"] == sum(counts.values()), f"END of {txid}: event_count"
        assert {d["data_collection"]: d["event_count"] for d in end["data_collections"]} \
            == dict(counts), f"END of {txid}: data_collections"
    return {"changes": len(committed), "transactions": len(per_tx),
            "tombstones": sum(len(v) for v in got.tombstones.values())}


def check_publisher_metrics(p: Pipeline, url: str, changes: int) -> None:
    """The publisher's ``--metrics-port`` once it published everything: ready, online,
    every change counted, 0 windows behind; the relay lists it under the name it sends."""
    def sample(text: str, name: str) -> float:
        hits = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                if line.startswith(name + "{")]
        assert len(hits) == 1, f"{name}: {hits} in {url}/metrics"
        return hits[0]

    def caught_up() -> bool:
        text = httpx.get(f"{url}/metrics", timeout=10).text
        return sample(text, "databus_consumer_lag_windows") == 0

    p.wait("the publisher's own metrics to show it caught up", caught_up, 30, interval=0.5)
    text = httpx.get(f"{url}/metrics", timeout=10).text
    assert sample(text, "databus_consumer_events_total") >= changes
    assert sample(text, "databus_consumer_lag_seconds") < 5
    assert 'state="online"} 1.0' in text
    ready = httpx.get(f"{url}/health/ready", timeout=10)
    assert ready.status_code == 200, ready.text
    names = [c["name"] for c in httpx.get(f"{p.url}/consumers", timeout=10).json()["consumers"]]
    assert any(n.startswith("publish ") for n in names), names


@pytest.mark.parametrize("batch", ["1", "100"], ids=["transaction-per-window", "batched"])
def test_publisher_equivalence(pipeline: Pipeline, batch: str) -> None:
    """A random multi-table workload: a read_committed consumer rebuilds every table,
    sees each committed change once in order, a tombstone after each delete, and
    transaction metadata that counts the data; with a Kafka transaction per window and
    with up to 100 windows per transaction."""
    p = pipeline
    metrics = free_port()  # its own numbers (docs/operations.md), against a real broker
    p.publish_args = ["--batch-windows", batch, "--metrics-port", str(metrics)]
    p.start("relay")
    p.start("publish")
    with Writer(p.db, seed=31) as w:
        for _ in range(400):
            w.transaction()
    p.wait_published()
    stats = check_published(p, w)
    assert stats["changes"] > 2000 and stats["tombstones"] > 200
    check_publisher_metrics(p, f"http://127.0.0.1:{metrics}", stats["changes"])
    # idle now: heartbeats arrive on Debezium's heartbeat topic
    p.wait("a heartbeat", lambda: p.kafka.read_topic(f"__debezium-heartbeat.{p.prefix}"),
           timeout=30, interval=0.5)
    print("published:", stats)


@pytest.mark.slow
def test_publisher_kill9_five_times(pipeline: Pipeline) -> None:
    """kill -9 of the publisher five times at random points of a running workload (JSON
    without the schema part): nothing lost, nothing twice for read_committed consumers."""
    p = pipeline
    p.publish_args = ["--no-schemas-enable"]
    p.start("relay")
    p.start("publish")
    w = Writer(p.db, seed=32)
    rng = random.Random(7)
    kills = 0

    def started() -> int:
        text = p.log("publish").read_text()
        return text.count("resuming after window") + text.count("no published position")

    try:
        with Repeating(w.transaction, 0.005) as writer:
            for _ in range(5):
                # each instance resumes and publishes before it is killed, at a random point
                def running(n: int = kills + 1) -> bool:
                    return started() == n

                p.wait("the publisher to start", running, timeout=60)
                last = published_position(p.kafka, p.prefix)

                def more(last: int = last) -> bool:
                    return published_position(p.kafka, p.prefix) > last

                p.wait("the publisher to publish more windows", more, timeout=60,
                       interval=0.2)
                writer.done.wait(rng.uniform(0.0, 1.0))
                p.kill("publish")
                kills += 1
                p.start("publish")
            writer.done.wait(2.0)
    finally:
        w.close()
    p.wait_published()
    stats = check_published(p, w)
    log = p.log("publish").read_text()
    assert kills == 5 and log.count("resuming after window") == 5, "restarts did not resume"
    print("kills:", kills, stats)


@pytest.mark.slow
def test_broker_restart_during_publishing(pipeline: Pipeline) -> None:
    """The broker is killed (-9) in the middle of publishing and comes back 5 s later
    while windows keep coming: the publisher waits, resumes, and Kafka holds every
    change once."""
    p = pipeline
    p.start("relay")
    p.start("publish")
    w = Writer(p.db, seed=33)
    try:
        with Repeating(w.transaction, 0.01) as writer:
            p.wait("windows in Kafka", lambda: published_position(p.kafka, p.prefix) > 0,
                   timeout=60, interval=0.5)
            p.kafka.kill()
            time.sleep(5)
            p.kafka.start()
            writer.done.wait(3.0)
    finally:
        w.close()
    p.wait_published()
    stats = check_published(p, w)
    print("broker restarted:", stats)


def test_a_second_publisher_of_the_same_name_fences_the_first(pipeline: Pipeline) -> None:
    """Two publishers must never write one name's topics at once: the one started second
    fences the first, which stops with KafkaFenced (exit status 2); the second goes on
    from the position, and Kafka holds every change once."""
    p = pipeline
    p.start("relay")
    p.start("publish")
    with Writer(p.db, seed=34) as w:
        for _ in range(100):
            w.transaction()
        p.wait("windows in Kafka", lambda: published_position(p.kafka, p.prefix) > 0,
               timeout=60, interval=0.5)
        first = p.procs.pop("publish")
        try:
            p.start("publish")  # the same name: the same transactional.id
            # the first learns it is fenced at its next transaction: keep windows coming
            # until it stops (a fixed number could all be published before the second
            # publisher started, on a loaded machine, leaving the first idle)
            with Repeating(w.transaction, 0.005):
                # generous: on a loaded CI machine 60 s was seen to pass
                code = first.wait(240)
            assert code == 2, f"the fenced publisher did not stop: see {p.log('publish')}"
        finally:
            if first.poll() is None:  # never leak it into the worker's later tests
                first.kill()
                first.wait()
        assert "KafkaFenced" in p.log("publish").read_text()
    p.wait_published()
    check_published(p, w)


# -- who keeps the name: the newest claim (databus.kafka.offsets) ------------------------------

def _publisher(kafka: KafkaBroker, name: str) -> Publisher:
    return Publisher(PublishConfig(relay="http://127.0.0.1:9", topic_prefix=name,
                                   bootstrap_servers=kafka.bootstrap_servers,
                                   heartbeat_interval=0, batch_windows=1))


def _window(publisher: Publisher, scn: int) -> None:
    """An empty window ``scn`` published and committed, as the client's callbacks do."""
    publisher._publish(scn)
    publisher._commit_batch()


@pytest.mark.parametrize("learns", ["unknown outcome", "fenced"])
def test_a_publisher_whose_name_was_claimed_after_it_stops_instead_of_taking_it_back(
        kafka: KafkaBroker, learns: str) -> None:
    """The first publisher learns that it lost the name either as a fencing error or, as
    seen in CI, as an EndTxn answered UNKNOWN (a commit of unknown outcome, after which it
    makes a new producer): either way the newer claim stops it, and its new producer
    never fences the second publisher back."""
    name = f"claim-{learns.replace(' ', '-')}"
    first, second = _publisher(kafka, name), _publisher(kafka, name)
    try:
        first.load()
        _window(first, 1)
        second.load()  # claims the name, then fences the first's producer
        if learns == "unknown outcome":
            first._drop_producer()  # what _failed does after an EndTxn answered UNKNOWN
            with pytest.raises(KafkaFencedError, match=f"another publisher named {name}"):
                first._publish(2)
        else:
            with pytest.raises(KafkaFencedError, match=f"another publisher named {name}"):
                _window(first, 2)
        assert first.stats.producers == 1  # no new producer: the second was not fenced
        _window(second, 2)
        assert published_position(kafka, name) == 2
    finally:
        first.close()
        second.close()


def test_a_publisher_fenced_without_a_newer_claim_takes_the_name_back(
        kafka: KafkaBroker) -> None:
    """Fenced by an instance that claimed the name before it (one that was making a new
    producer at the moment this one started), the newest claimant replays with a new
    producer: transient, not a stop."""
    from confluent_kafka import Producer

    name = "claim-older"
    first = _publisher(kafka, name)
    try:
        first.load()
        _window(first, 1)
        older = Producer({"bootstrap.servers": kafka.bootstrap_servers,
                          "transactional.id": f"databus-publish-{name}"})
        older.init_transactions(30)  # fences the first; no claim after the first's
        for _attempt in range(3):
            try:
                _window(first, 2)
                break
            except KafkaUnavailableError:  # transient: the client replays the window
                continue
        else:
            raise AssertionError("the newest claimant did not take its name back")
        assert first.stats.producers == 2
        assert published_position(kafka, name) == 2
    finally:
        first.close()


def test_a_claim_is_read_only_after_it(kafka: KafkaBroker) -> None:
    """Claims older than the publisher's own do not stop it (every start claims anew)."""
    name = "claim-restart"
    first = _publisher(kafka, name)
    try:
        first._ensure_topic(first.cfg.offsets_topic, partitions=1, config=OFFSETS_TOPIC_CONFIG)
        write_claim({"bootstrap.servers": kafka.bootstrap_servers}, first.cfg.offsets_topic,
                    name, "an-earlier-run")
        first.load()
        _window(first, 1)
        first._drop_producer()
        _window(first, 2)
        assert first.stats.producers == 2
        assert published_position(kafka, name) == 2
    finally:
        first.close()


def test_topics_are_made_with_the_publishers_settings(kafka: KafkaBroker) -> None:
    """The broker creates topics it is asked about (auto.create.topics.enable, its
    default, on here): the publisher's own settings must still apply. The offsets topic
    is compacted and rolls its segments hourly (a restart reads it from its start, and
    compaction leaves the open segment alone); data topics get ``topic_partitions``."""
    from confluent_kafka.admin import AdminClient, ConfigResource

    topic = "databus-publish-offsets-segments"
    publisher = Publisher(PublishConfig(relay="http://127.0.0.1:9", topic_prefix="seg",
                                        bootstrap_servers=kafka.bootstrap_servers,
                                        offsets_topic=topic, heartbeat_interval=0,
                                        topic_partitions=3))
    try:
        publisher.load()
        publisher._ensure_topic("seg.shop.orders")  # as before a window's first message
    finally:
        publisher.close()
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap_servers})
    resource = ConfigResource("topic", topic)
    configs = admin.describe_configs([resource])[resource].result(30)
    assert configs["cleanup.policy"].value == "compact"
    assert configs["segment.ms"].value == "3600000"
    md = admin.list_topics(timeout=30)
    assert len(md.topics["seg.shop.orders"].partitions) == 3
    assert len(md.topics[topic].partitions) == 1
