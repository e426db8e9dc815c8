"""``databus publish``: a relay's windows into Kafka topics, exactly once per window.

The publisher is a relay client like any other (:class:`~databus.client.DatabusClient`
drives it; it never reaches into a relay), and is its own checkpoint store:

* **Whole windows per Kafka transaction.** The publisher opens a transaction
  (``transactional.id`` = ``databus-publish-<name>``) and writes each window's messages
  (data, tombstones, transaction metadata) into it; at the client's checkpoint
  (:meth:`Publisher.save`, every ``batch_windows`` windows, or sooner when the
  transaction is ``batch_linger`` old) it writes the last window's checkpoint to the
  offsets topic (:mod:`databus.kafka.offsets`) and commits. While the relay is quiet a
  linger thread commits instead. A ``read_committed`` consumer sees whole windows and
  the checkpoint after them, or none of them. ``batch_windows`` 1: a transaction per
  window.
* **Start and restart.** :meth:`Publisher.load` makes the producer and calls
  ``init_transactions``, which fences an older instance of the same name and resolves
  its last transaction (an unfinished commit is completed, anything else aborted);
  only then is the checkpoint read back (``read_committed``, to the high-water mark).
  The client resumes after it, so a publisher killed at any point publishes each window
  once: windows before the checkpoint are in Kafka, the window of a transaction that
  was aborted is published again, whole.
* **Failures.** A Kafka error aborts the open transaction and raises (a failed commit
  of the linger thread is raised at the next callback); the client rolls back to its
  last saved checkpoint, which is never after what Kafka holds, and replays after a
  backoff (``max_retries``). When a transaction's outcome is unknown to this process
  (a commit that could not be confirmed, an abort that failed), the producer is
  dropped and a new one is made for the replay: its ``init_transactions`` settles the
  old transaction, the checkpoint is read again, and a replayed window at or before it
  is skipped.
* **One name, one publisher: the newest claim wins.** Before its first
  ``init_transactions`` a publisher writes its claim of the name to the offsets topic
  (:func:`~databus.kafka.offsets.write_claim`). Before every later one (a new producer
  after an unknown outcome), and when fenced (or any fatal producer error), it reads
  the claims written since: a newer claim by another instance stops it with
  :class:`~databus.core.errors.KafkaFencedError` instead of fencing the other back;
  none (the fencing came from an instance that claimed before it, in the moment that
  instance was making its own new producer) makes it replay with a new producer like
  any transient failure. The broker's answer to a fenced producer is not always a
  fencing error (an ``EndTxn`` answered ``UNKNOWN`` was seen), which is why the claim,
  and not the error code, decides.
* **Heartbeats** go from a second, non-transactional producer on a thread, outside
  the exactly-once contract: one per ``heartbeat_interval`` while no window is
  published.

Threading: the client's thread calls the callbacks; the linger thread shares the
transactional producer under a lock; the heartbeat thread has its own producer.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient

from databus.client.checkpoints import CheckpointStore
from databus.client.client import DatabusClient
from databus.client.config import ClientConfig
from databus.client.consumer import Consumer, ConsumerResult, DataEvent, Result
from databus.core.checkpoint import Checkpoint
from databus.core.errors import (
    ConsumerFatalError,
    DatabusError,
    KafkaContext,
    KafkaFencedError,
    KafkaUnavailableError,
    TerminalError,
)
from databus.core.schema import INTERNAL_PREFIX
from databus.kafka.config import PublishConfig
from databus.kafka.envelope import MessageEncoder, TxPosition
from databus.kafka.errors import kafka_errors
from databus.kafka.offsets import (
    ensure_topic,
    newer_claim,
    offset_record,
    read_position,
    write_claim,
)

log = logging.getLogger("databus.kafka.publisher")
KAFKA_LOG = logging.getLogger("databus.kafka.librdkafka")
"""librdkafka's own log lines (connection attempts while a broker is down...): the
publisher's errors are reported through its exceptions, so the CLI shows these only
with --verbose."""

Message = tuple[str, bytes | None, bytes | None]  # (topic, key, value)

OFFSETS_TOPIC_CONFIG = {"cleanup.policy": "compact", "segment.ms": str(3600 * 1000)}
"""The offsets topic's settings when the publisher creates it. Compaction never touches
the open segment, and every start and new producer reads the topic from its beginning
(:func:`~databus.kafka.offsets.read_position`): Kafka's default segment (7 days, 1 GiB)
would let a busy publisher's records (one per commit) pile up to that; an hour's segment
keeps the read to about an hour of commits."""


@dataclass
class PublishStats:
    """Counters of one publisher process."""

    windows: int = 0
    skipped_windows: int = 0
    messages: int = 0
    transactions: int = 0
    aborted: int = 0
    producers: int = 0
    heartbeats: int = 0
    last_scn: int = -1


class Publisher(Consumer, CheckpointStore):
    """See the module docstring. Building one does no I/O; :meth:`load` (called by the
    client when it starts) connects."""

    def __init__(self, config: PublishConfig) -> None:
        self.cfg = config
        self.encoder = MessageEncoder(config)
        self.stats = PublishStats()
        self._kafka: dict[str, Any] = {"bootstrap.servers": config.bootstrap_servers,
                                       "logger": KAFKA_LOG, **config.kafka_config}
        self._producer: Producer | None = None
        self._admin: AdminClient | None = None
        self._committed: Checkpoint | None = None
        self._known = False  # _committed is what Kafka holds (False: read it again)
        self._events: list[DataEvent] = []
        self._ready_topics: set[str] = set()
        self._last_activity = time.monotonic()
        self._closing = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.RLock()  # the producer's transaction: client and linger thread
        self._batch: list[int] = []  # windows in the open transaction
        self._batch_started = 0.0
        self._batch_checkpoint: Checkpoint | None = None
        self._broken: DatabusError | None = None
        self._instance = uuid.uuid4().hex  # this process's claims of the name
        self._claims_read: dict[int, int] | None = None  # None: no claim written yet

    # -- connecting ----------------------------------------------------------------------

    @property
    def admin(self) -> AdminClient:
        if self._admin is None:
            self._admin = AdminClient(dict(self._kafka))
        return self._admin

    def _open(self) -> None:
        """A producer with its transactions initialised, and the committed checkpoint
        known (see the module docstring)."""
        if self._producer is not None and self._known:
            return
        cfg = self.cfg
        self._ensure_topic(cfg.offsets_topic, partitions=1, config=OFFSETS_TOPIC_CONFIG)
        if self._producer is None:
            if self._claims_read is None:
                self._claims_read = write_claim(self._kafka, cfg.offsets_topic,
                                                cfg.publisher_name, self._instance)
            else:
                self._check_claims()
            producer = Producer({
                "linger.ms": 5, "client.id": f"databus-publish-{cfg.publisher_name}",
                "partitioner": "murmur2_random",  # the Java client's: same keys, same partitions
                **self._kafka, "transactional.id": cfg.transactional_id,
                "enable.idempotence": True, "acks": "all",
                "transaction.timeout.ms": cfg.transaction_timeout_ms})
            with kafka_errors(f"initialising transactions of {cfg.transactional_id}"):
                producer.init_transactions(30)
            self._producer = producer
            self.stats.producers += 1
        self._committed = read_position(self._kafka, self.admin, cfg.offsets_topic,
                                        cfg.publisher_name)
        self._known = True
        log.info("publisher %s: %s", cfg.publisher_name,
                 f"resuming after window {self._committed.window_scn}"
                 if self._committed is not None else "no published position: a new publisher")

    def _check_claims(self) -> None:
        """Raise KafkaFencedError when another instance claimed the name after us."""
        cfg = self.cfg
        assert self._claims_read is not None
        claim, self._claims_read = newer_claim(self._kafka, self.admin, cfg.offsets_topic,
                                               cfg.publisher_name, self._instance,
                                               self._claims_read)
        if claim is not None:
            raise KafkaFencedError(
                f"Kafka: another publisher named {cfg.publisher_name} started (host"
                f" {claim.get('host', '?')}, pid {claim.get('pid', '?')}, claimed at"
                f" {claim.get('ts_ms', '?')} ms): this one stops, it does not take the"
                " name back", kafka_code="CLAIMED")

    def _drop_producer(self) -> None:
        """Forget the producer: the next window makes a new one and reads the position."""
        self._producer = None
        self._known = False

    def _ensure_topic(self, topic: str, *, partitions: int | None = None,
                      config: dict[str, str] | None = None) -> None:
        if topic in self._ready_topics:
            return
        if self.cfg.create_topics or topic == self.cfg.offsets_topic:
            ensure_topic(self.admin, topic,
                         partitions=partitions if partitions is not None
                         else self.cfg.topic_partitions,
                         replication=self.cfg.topic_replication_factor, config=config or {})
        self._ready_topics.add(topic)

    # -- CheckpointStore ---------------------------------------------------------------

    def load(self) -> Checkpoint | None:
        """The checkpoint committed with the last published window (None: new)."""
        with self._lock:
            self._open()
        self._start_threads()
        return self._committed

    def save(self, checkpoint: Checkpoint) -> None:
        """Commit the open transaction: every window up to ``checkpoint`` is then in
        Kafka with the position. A failure makes the client replay after its last saved
        checkpoint."""
        try:
            with self._lock:
                self._raise_broken()
                self._commit_batch()
        except TerminalError as exc:
            raise ConsumerFatalError(str(exc)) from exc

    def close(self) -> None:
        """Stop the heartbeats and let the producers go. Idempotent."""
        self._closing.set()
        for thread in self._threads:
            thread.join(30)
        self._threads = []
        self._producer = None

    # -- Consumer ------------------------------------------------------------------------

    def on_start_data_event_sequence(self, scn: int) -> Result:
        self._events.clear()
        with self._lock:
            self._raise_broken()
        return None

    def on_data_event(self, event: DataEvent) -> Result:
        if not event.source.startswith(INTERNAL_PREFIX):  # DDL notices are not rows
            self._events.append(event)
        return None

    def on_end_data_event_sequence(self, scn: int) -> Result:
        try:
            with self._lock:
                self._raise_broken()
                self._publish(scn)
                due = bool(self._batch) and (
                    len(self._batch) >= self.cfg.batch_windows
                    or time.monotonic() - self._batch_started >= self.cfg.batch_linger)
        except TerminalError as exc:
            raise ConsumerFatalError(str(exc)) from exc
        finally:
            self._events.clear()
        return ConsumerResult.CHECKPOINT if due else None  # the client calls save: commit

    def on_rollback(self, scn: int) -> Result:
        """The client replays from its last saved checkpoint: the open transaction's
        windows come again, so it is aborted."""
        self._events.clear()
        with self._lock:
            self._broken = None
            if self._batch and self._producer is not None:
                self._failed(self._producer, KafkaUnavailableError("rolled back"), False)
            self._batch.clear()
        return None

    # -- windows into the open transaction -------------------------------------------------

    def _raise_broken(self) -> None:
        """A commit by the linger thread failed: the client must replay (see _linger);
        a terminal failure (fenced) stops it."""
        if self._broken is not None:
            exc, self._broken = self._broken, None
            if isinstance(exc, TerminalError):
                raise ConsumerFatalError(str(exc)) from exc
            raise exc

    def _publish(self, scn: int) -> None:
        """Window ``scn``'s messages into the open transaction (begun if none is)."""
        if not self._batch:
            self._open()
        done = self._committed
        if done is not None and not done.in_window and scn <= done.window_scn:
            self.stats.skipped_windows += 1
            log.info("window %d is already in Kafka (position %d); skipped", scn,
                     done.window_scn)
            return
        messages = self._messages(scn)
        for topic in {m[0] for m in messages}:
            self._ensure_topic(topic, partitions=1 if topic == self.encoder.transaction_topic
                               else None)
        base = self._batch_checkpoint if self._batch_checkpoint is not None else done
        checkpoint = (base if base is not None else Checkpoint.flexible()).window_done(scn)
        producer = self._producer
        assert producer is not None
        try:
            with kafka_errors(f"publishing window {scn}"):
                if not self._batch:
                    producer.begin_transaction()
                    self._batch_started = time.monotonic()
                for topic, key, value in messages:
                    _produce(producer, topic, key, value)
        except DatabusError as exc:
            raise self._failed(producer, exc, False) from exc
        self._batch.append(scn)
        self._batch_checkpoint = checkpoint
        self._last_activity = time.monotonic()
        self.stats.windows += 1
        self.stats.messages += len(messages)

    def _commit_batch(self) -> None:
        """Write the position and commit the open transaction (nothing when none is)."""
        if not self._batch:
            return
        producer, checkpoint = self._producer, self._batch_checkpoint
        assert producer is not None and checkpoint is not None
        scn = checkpoint.window_scn
        committing = False
        try:
            with kafka_errors(f"publishing the position after window {scn}"):
                _produce(producer, self.cfg.offsets_topic, self.cfg.publisher_name.encode(),
                         offset_record(self.cfg.publisher_name, checkpoint))
            committing = True
            _commit(producer, scn)
        except DatabusError as exc:
            raise self._failed(producer, exc, committing) from exc
        producer.poll(0)  # serve delivery reports and log lines
        self._committed = checkpoint
        self.stats.transactions += 1
        self.stats.last_scn = scn
        self._batch.clear()
        self._batch_checkpoint = None
        self._last_activity = time.monotonic()

    def _failed(self, producer: Producer, exc: DatabusError, committing: bool) -> DatabusError:
        """Abort the open transaction when its outcome is known; otherwise drop the
        producer (the next one settles the transaction and the position is read again).
        Either way the transaction's windows are gone: the client replays them. Returns
        the error to raise: fenced, the claims decide (module docstring)."""
        self.stats.aborted += 1
        self._batch.clear()
        self._batch_checkpoint = None
        if isinstance(exc, TerminalError) or committing or (
                isinstance(exc, KafkaContext) and exc.fatal):
            self._drop_producer()
            if isinstance(exc, KafkaFencedError):
                try:
                    self._check_claims()
                except DatabusError as claimed:
                    return claimed  # fenced by a newer claim, or the claims unreadable
                log.warning("fenced (%s) by an instance that claimed the name before this"
                            " one: a new producer takes the name back", exc)
                return KafkaUnavailableError(f"{exc} (no newer claim of the name: replayed"
                                             " with a new producer)")
            log.warning("publishing failed (%s): a new producer will settle the transaction", exc)
            return exc
        try:
            with kafka_errors("aborting the transaction"):
                producer.abort_transaction(30)
            log.warning("publishing failed (%s): transaction aborted", exc)
        except DatabusError as abort_exc:
            log.warning("publishing failed (%s) and aborting failed too (%s): a new"
                        " producer will settle the transaction", exc, abort_exc)
            self._drop_producer()
        return exc

    def _linger(self) -> None:
        """Commit an open transaction that is ``batch_linger`` old while no window comes
        (the client waits on the relay). A failure is kept and raised at the next
        callback: the client then replays from its last saved checkpoint, which is never
        after what Kafka holds, and windows Kafka already holds are skipped."""
        wait = max(self.cfg.batch_linger / 2, 0.005)
        while not self._closing.wait(wait):
            with self._lock:
                if not self._batch or self._broken is not None or (
                        time.monotonic() - self._batch_started < self.cfg.batch_linger):
                    continue
                try:
                    self._commit_batch()
                except DatabusError as exc:
                    self._broken = exc

    def _messages(self, scn: int) -> list[Message]:
        """The window's messages, in commit order, with BEGIN/END per source transaction."""
        enc, cfg = self.encoder, self.cfg
        out: list[Message] = []
        now_ms = time.time_ns() // 1_000_000
        txid: str | None = None
        total = 0
        counts: dict[str, int] = {}
        tx_topic = enc.transaction_topic

        def end() -> None:
            if txid is not None and cfg.transaction_metadata:
                out.append((tx_topic, enc.tx_key(txid), enc.tx_end(txid, now_ms, counts)))

        for e in self._events:
            meta = e.metadata
            this_tx = str(meta.get("txid") or scn)
            if this_tx != txid:
                end()
                txid, total, counts = this_tx, 0, {}
                if cfg.transaction_metadata:
                    out.append((tx_topic, enc.tx_key(this_tx), enc.tx_begin(this_tx, now_ms)))
            total += 1
            counts[e.source] = counts.get(e.source, 0) + 1
            codec = enc.codec(e.schema)
            op = e.op.letter
            before, after = e.before, e.after
            key = None if op == "t" else enc.key(codec, after if after is not None else before)
            value = enc.value(codec, op=op, before=before, after=after, meta=meta, scn=scn,
                              ts_ms=e.timestamp_ns // 1_000_000, snapshot=e.is_snapshot,
                              tx=TxPosition(this_tx, total, counts[e.source]), now_ms=now_ms)
            out.append((codec.topic, key, value))
            if op == "d" and cfg.tombstones_on_delete and key is not None:
                out.append((codec.topic, key, None))
        end()
        return out

    # -- heartbeats ----------------------------------------------------------------------

    def _start_threads(self) -> None:
        if self._threads:
            return
        if self.cfg.batch_windows > 1:
            self._threads.append(threading.Thread(target=self._linger, daemon=True,
                                                  name="databus-publish-linger"))
        if self.cfg.heartbeat_interval > 0:
            self._threads.append(threading.Thread(target=self._heartbeats, daemon=True,
                                                  name="databus-publish-heartbeat"))
        for thread in self._threads:
            thread.start()

    def _heartbeats(self) -> None:
        interval = self.cfg.heartbeat_interval
        producer: Producer | None = None
        topic = self.encoder.heartbeat_topic
        while not self._closing.wait(min(interval, 1.0)):
            if time.monotonic() - self._last_activity < interval:
                continue
            try:
                if producer is None:
                    self._ensure_topic(topic, partitions=1)
                    producer = Producer({**self._kafka, "linger.ms": 0,
                                         "message.timeout.ms": max(int(interval * 1000), 5000),
                                         "client.id": f"databus-heartbeat-{self.cfg.publisher_name}"})
                done = self._committed
                with kafka_errors("sending a heartbeat"):
                    producer.produce(topic, key=self.encoder.heartbeat_key(),
                                     value=self.encoder.heartbeat_value(
                                         done.window_scn if done is not None else None))
                    producer.poll(0)
                self.stats.heartbeats += 1
            except DatabusError as exc:
                log.debug("heartbeat not sent: %s", exc)
            self._last_activity = time.monotonic()
        if producer is not None:
            producer.flush(5)


def _produce(producer: Producer, topic: str, key: bytes | None, value: bytes | None,
             timeout: float = 60.0) -> None:
    """Produce one message, waiting while the local queue is full."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            producer.produce(topic, key=key, value=value)
            return
        except BufferError:
            if time.monotonic() > deadline:
                raise
            producer.poll(0.05)


def _commit(producer: Producer, scn: int, timeout: float = 60.0) -> None:
    """Commit, retrying the commit itself while Kafka calls its error retriable."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with kafka_errors(f"committing window {scn}"):
                producer.commit_transaction(15)
            return
        except KafkaUnavailableError as exc:
            if not exc.retriable or exc.txn_requires_abort or time.monotonic() > deadline:
                raise
            log.info("commit of window %d not confirmed yet (%s); trying again", scn, exc)


def run_publish(config: PublishConfig, *, stop: threading.Event | None = None,
                max_windows: int | None = None,
                watch: Callable[[DatabusClient], None] | None = None) -> Publisher:
    """Publish the relay's windows until ``stop`` is set, ``max_windows`` windows were
    handled, or a terminal error; returns the publisher (its ``stats``). ``watch``: told
    the relay client before it runs (``--metrics-port``); it reads from the relay as
    ``publish <name>@<host>``."""
    client_cfg = ClientConfig(
        relay=config.relay, sources=list(config.sources), from_start=True,
        poll_timeout=config.poll_timeout, max_retries=config.max_retries,
        checkpoint_every_windows=config.batch_windows,
        backoff_max=config.backoff_max,
        consumer_name=f"publish {config.publisher_name}@{socket.gethostname()}")
    publisher = Publisher(config)
    try:
        client = DatabusClient(client_cfg, publisher, publisher)
        if watch is not None:
            watch(client)
        client.run(stop=stop, max_windows=max_windows)
    except ConsumerFatalError as exc:
        cause = exc.__cause__
        while isinstance(cause, ConsumerFatalError) and cause.__cause__ is not None:
            cause = cause.__cause__
        if isinstance(cause, DatabusError):
            raise cause from None
        raise
    finally:
        publisher.close()
    return publisher
