"""The soak's Kafka consumer (``bench.soak --full``): ``databus publish`` of the relay
cluster into a private broker, and what a ``read_committed`` consumer reads there, as
windows for the checker (``tests/support/soak_check.py``).

**What is checked, and why that much.** docs/kafka.md promises exactly once for
``read_committed`` consumers: whole windows per Kafka transaction, the publisher's
position committed in the same transaction, an older instance fenced and settled before
a new one reads the position. So nothing may be missing, nothing may be there twice, and
no window may be split. :class:`PublishedHistory` rebuilds the windows from the data
topics alone: each change's ``source.scn`` (the window), ``source.gtid`` (the committed
transaction), ``transaction.id`` and ``transaction.total_order`` (its place in its
transaction), ``op`` and key; the transaction topic's BEGIN records give the order of
the transactions of a window and their END records how many changes each has. A window
is complete once every transaction in it has its END and exactly that many changes;
complete windows are handed to the checker in SCN order, only below the lowest window
still incomplete (the topics are read one after another, and Kafka writes a
transaction's commit markers to each partition separately: a window can be visible in
one topic before another). A change read again (the same window, transaction and
``total_order``), before or after its window was handed over, starts a second copy of
the window, handed over as a window of its own (the checker counts it ``duplicated``
when equal, ``torn`` when not; for ``publish`` either is a failure). Within each topic partition the SCNs must never go down (no
reorder per key: a key always lands in one partition); each time one does is counted in
:attr:`PublishedHistory.reordered`. ``read(final=True)`` hands over what is still
incomplete too (the checker then finds it torn or lost).

Tombstones (null values after a delete) and heartbeats are not checked here
(tests/e2e/test_kafka_publish.py does).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from typing import Any

from tests.support.kafka import KafkaBroker
from tests.support.procs import DATABUS
from tests.support.soak_check import Window, rows_text

PREFIX = "soak"


def publish_args(relay: str, broker: KafkaBroker, prefix: str = PREFIX) -> list[str]:
    """``databus publish`` of ``relay`` into ``broker`` (values without the Connect
    schema: a 30-minute run publishes millions of changes, read back at the end)."""
    return [*DATABUS, "publish", "--relay", relay,
            "--bootstrap-servers", broker.bootstrap_servers, "--topic-prefix", prefix,
            "--no-schemas-enable", "--heartbeat-interval", "5"]


def _key(raw: bytes | None) -> str:
    """A data message's key ``{"id": 7}`` as the checker's key text (``7``)."""
    if raw is None:
        return "null"
    values = list(json.loads(raw).values())
    return json.dumps(values[0] if len(values) == 1 else values)


class PublishedHistory:
    """See the module docstring: the windows ``publish`` wrote for ``tables`` of ``db``
    under ``prefix`` in the broker at ``bootstrap_servers``, read incrementally by one
    ``read_committed`` consumer."""

    def __init__(self, bootstrap_servers: str, db: str, tables: Sequence[str],
                 prefix: str = PREFIX) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.tx_topic = f"{prefix}.transaction"
        self.topics = [f"{prefix}.{db}.{t}" for t in tables] + [self.tx_topic]
        self.windows: list[Window] = []
        self.reordered = 0
        self.problems: list[str] = []
        self.messages = 0
        self._consumer: Any = None
        self._pos: dict[tuple[str, int], int] = {}
        self._last_scn: dict[tuple[str, int], int] = {}
        # scn -> the copies of the window read so far (one, unless it was published
        # twice): txid -> total_order -> (gtid, change)
        self._pending: dict[int, list[dict[str, dict[int, tuple[str, list[str]]]]]] = {}
        self._ends: dict[str, list[int]] = {}  # txid -> event_count of each END, until used
        self._begun: dict[str, int] = {}  # txid -> rank of its BEGIN, until used
        self._rank = 0
        self._top = -1  # the highest SCN handed to the checker
        self._copies = 0

    def _assign(self) -> list[Any]:
        from confluent_kafka import Consumer, TopicPartition

        if self._consumer is None:
            self._consumer = Consumer({
                "bootstrap.servers": self.bootstrap_servers,
                "group.id": f"soak-{uuid.uuid4().hex}", "enable.auto.commit": False,
                "isolation.level": "read_committed", "auto.offset.reset": "earliest",
                "fetch.max.bytes": 64 << 20})
        md = self._consumer.list_topics(timeout=10)
        parts = []
        for topic in self.topics:
            t = md.topics.get(topic)
            if t is None or t.error is not None:
                continue  # not created yet: nothing published for that table so far
            for p in sorted(t.partitions):
                parts.append(TopicPartition(topic, p, self._pos.setdefault((topic, p), 0)))
        self._consumer.assign(parts)
        return parts

    def read(self, final: bool = False) -> list[Window]:
        """Every message committed by now (read to each partition's last stable offset
        taken at the call's start), then the windows complete (``final``: all)."""
        parts = self._assign()
        ends = {}
        for tp in parts:
            _, high = self._consumer.get_watermark_offsets(tp, timeout=10, cached=False)
            ends[(tp.topic, tp.partition)] = high
        idle_since = time.monotonic()
        while any(self._pos[k] < e for k, e in ends.items()):
            msgs = self._consumer.consume(5000, timeout=0.5)
            for msg in msgs:
                if msg.error() is None:
                    self._one(msg)
            if msgs:
                idle_since = time.monotonic()
            for (topic, p), end in ends.items():
                if self._pos[(topic, p)] < end:  # past aborted batches and markers too
                    from confluent_kafka import TopicPartition

                    got = self._consumer.position([TopicPartition(topic, p)])[0].offset
                    self._pos[(topic, p)] = max(self._pos[(topic, p)], int(got))
            if time.monotonic() - idle_since > 60:
                self.problems.append(f"Kafka read stalled below {ends} at {self._pos}")
                break
        self._hand_over(final)
        return self.windows

    def _one(self, msg: Any) -> None:
        topic, part, off = msg.topic(), msg.partition(), msg.offset()
        self._pos[(topic, part)] = max(self._pos[(topic, part)], off + 1)
        raw = msg.value()
        if raw is None:
            return  # a tombstone
        self.messages += 1
        value = json.loads(raw)
        if topic == self.tx_topic:
            if value["status"] == "BEGIN":
                self._rank += 1
                self._begun[value["id"]] = self._rank
            else:
                self._ends.setdefault(value["id"], []).append(int(value["event_count"]))
            return
        src, tx = value["source"], value["transaction"]
        scn = int(src["scn"])
        last = self._last_scn.get((topic, part), -1)
        if scn < last:
            self.reordered += 1
            if len(self.problems) < 10:
                self.problems.append(f"{topic}[{part}] offset {off}: window {scn} after {last}")
        self._last_scn[(topic, part)] = max(last, scn)
        if scn <= self._top and scn not in self._pending:
            self._copies += 1  # a window handed over already: a second copy of it
        copies = self._pending.setdefault(scn, [])
        txid, order = str(tx["id"]), int(tx["total_order"])
        for txs in copies:  # the first copy without this change takes it
            if order not in txs.get(txid, {}):
                break
        else:
            if copies:
                self._copies += 1  # this change again: the window published twice
            txs = {}
            copies.append(txs)
        change = [str(src["table"]), str(value["op"]), _key(msg.key())]
        txs.setdefault(txid, {})[order] = (str(src.get("gtid") or txid), change)

    def _complete(self, copies: list[dict[str, dict[int, tuple[str, list[str]]]]]) -> bool:
        """Every copy has, for each of its transactions, a BEGIN and its own END whose
        count it holds (the k-th copy the k-th END)."""
        return all(t in self._begun and len(self._ends.get(t, ())) > k
                   and self._ends[t][k] == len(c)
                   for k, txs in enumerate(copies) for t, c in txs.items())

    def _hand_over(self, final: bool) -> None:
        done = sorted(s for s, c in self._pending.items() if final or self._complete(c))
        ready = set(done)
        waiting = [s for s in self._pending if s not in ready]
        below = min(waiting) if waiting else None
        for scn in done:
            if below is not None and scn > below:
                break  # after a window still incomplete: next time, in SCN order
            copies = self._pending.pop(scn)
            for txs in copies:
                order = sorted(txs, key=lambda t: self._begun.get(t, 1 << 62))
                gtids: list[str] = []
                events: list[list[str]] = []
                for t in order:
                    for _, (gtid, change) in sorted(txs[t].items()):
                        if not gtids or gtids[-1] != gtid:
                            gtids.append(gtid)
                        events.append(change)
                self.windows.append((scn, tuple(gtids), rows_text(events)))
            for t in {t for txs in copies for t in txs}:
                self._ends.pop(t, None)  # a later copy needs its own END
                self._begun.pop(t, None)
            self._top = max(self._top, scn)

    @property
    def copies(self) -> int:
        """Second copies of windows (a change of a window read again)."""
        return self._copies

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
