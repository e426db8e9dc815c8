"""``spark.read.format("databus-snapshot")``: a bootstrap store's snapshot as a DataFrame.

Two readers serve the format (docs/spark.md): given the bootstrap server's
``http(s)://`` URL as ``store``, the JVM reader (``java/spark-source``,
``io.databus.spark.SnapshotProvider``, loaded by :func:`databus.spark.session`)
reads the server's snapshot pages over HTTP in Spark's executors; given a store's
SQLAlchemy URL, this module's Python reader reads the store. The JVM reader hands a
SQLAlchemy URL to this one, registered as ``databus-snapshot-python`` (the name
that always means the Python reader); without the JVM reader this one also serves
``databus-snapshot``. What follows is the Python reader.

Reads the snapshot table of a bootstrap store (:mod:`databus.bootstrap.store`)
directly, in parallel: the driver fixes the snapshot SCN ``X`` and the row-id
span of the wanted sources, and splits the span into ``partitions`` equal id
ranges; each input partition pages through its range (keyset over the
``(src, id)`` index) taking the rows whose SCN is at most ``X``. Rows come out
as the streaming source's change envelope (:mod:`databus.spark.arrow`): op
``r``, ``scn`` = the window that last wrote the row, ``after`` = the row.

Why the pair "snapshot at X, then the stream after X" is exact: a row with
scn <= X read from the store is its key's image as of X unless the key
changed after X, and every change after X is in the stream after X (ids are
fixed at a key's first insertion, so a row that existed at X is in the span
fixed at planning). A key changed after X is left out (the store keeps only
its latest row, whose SCN is above X); the stream brings it to its final state.

Plan (options, sources, schema, SCN) is made when ``load()`` asks for the
schema, so bad options, an unknown source or an unreachable store fail there.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING, Literal

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from databus.bootstrap.store import BootstrapStore
from databus.core import event as ev
from databus.core.errors import (
    BootstrapTooOldError,
    BootstrapTooYoungError,
    ConfigError,
    CorruptEventError,
    DatabusError,
    UnknownSourceError,
)
from databus.core.schema import SchemaRegistry, TableSchema
from databus.spark import arrow
from databus.spark.fastread import ChunkDecoder
from databus.spark.options import MAX_PARTITIONS
from databus.spark.planned import PlannedDataSource
from databus.spark.reading import prefetched

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

FORMAT = "databus-snapshot"
PYTHON_FORMAT = "databus-snapshot-python"
_WHO = "databus-snapshot"


class SnapshotOptions(BaseModel):
    """Validated options of ``format("databus-snapshot")`` (names as given to ``.option``)."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    store: str = Field(min_length=1, description="The bootstrap store's SQLAlchemy URL, as "
                       "store.url of the bootstrap config (sqlite:///bs.db, postgresql+psycopg://"
                       "..., mysql+pymysql://...).")
    sources: tuple[str, ...] = Field(
        min_length=1, description="Comma-separated source names (db.table or table) or ids. "
        "Typed after structs need exactly one source; use valueFormat=json for several.")
    partitions: int = Field(1, ge=1, le=MAX_PARTITIONS,
                            description="Spark input partitions: equal row-id ranges.")
    scn: int | None = Field(
        None, ge=-1, description="Snapshot SCN X: rows as of X (see snapshot_scn()); "
        "default: the store's applied SCN when the DataFrame is planned.")
    value_format: Literal["struct", "json"] = Field("struct", alias="valueFormat")
    rows_per_arrow_batch: int = Field(8192, alias="rowsPerArrowBatch", ge=1)
    page_rows: int = Field(10_000, alias="pageRows", ge=1,
                           description="Rows per store query while a partition pages its range.")
    prefetch_batches: int = Field(
        4, alias="prefetchBatches", ge=0,
        description="Record batches a partition reads and decodes ahead in a thread of the "
        "Python worker (the store query releases the GIL) while Spark sends the previous ones "
        "to the JVM; 0 reads without a thread.")


_ALIASES = {n.lower(): n for n in ("store", "sources", "partitions", "scn", "valueFormat",
                                   "rowsPerArrowBatch", "pageRows", "prefetchBatches")}
_ALIASES["path"] = "store"  # what .load(url) passes
_ALIASES["url"] = "store"


def parse_snapshot_options(raw: Mapping[str, str]) -> SnapshotOptions:
    """Validate Spark options; raises :class:`ConfigError` naming the option."""
    values: dict[str, object] = {}
    for key, value in raw.items():
        name = _ALIASES.get(key.lower())
        if name is None:
            raise ConfigError(f"{_WHO}: unknown option {key!r}; known: "
                              f"{sorted(set(_ALIASES.values()))}")
        values[name] = value
    if "sources" in values:
        values["sources"] = tuple(s.strip() for s in str(values["sources"]).split(",") if s.strip())
    try:
        return SnapshotOptions.model_validate(values)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'options'}: {e['msg']}" for e in exc.errors())
        raise ConfigError(f"{_WHO}: invalid options: {problems}") from exc


def open_store(url: str) -> BootstrapStore:
    """The store at ``url`` for reading (never creates tables; a missing SQLite file
    is a :class:`ConfigError` rather than a new empty database; so is a bootstrap
    server's URL, which the JVM reader reads)."""
    if url.startswith(("http://", "https://")):
        raise ConfigError(f"{_WHO}: {url!r} is a bootstrap server's URL: the Python reader reads "
                          "a store's SQLAlchemy URL; the JVM reader (loaded by "
                          "databus.spark.session()) reads servers as format('databus-snapshot')")
    if url.startswith("sqlite:///"):
        path = url[len("sqlite:///"):].split("?", 1)[0]
        if path and path != ":memory:" and not os.path.isfile(path):
            raise ConfigError(f"{_WHO}: no bootstrap store at {url!r} (no such file)")
    return BootstrapStore(url, create=False)


def snapshot_scn(store_url: str) -> int:
    """The SCN the store's snapshot is complete to (its applier's position).

    Read the snapshot with ``.option("scn", X)`` and start the stream with
    ``.option("startingPosition", X)`` (after window X) for no gap and no overlap.
    Raises :class:`BootstrapTooOldError` while the store is not initialised.
    ``store_url`` may be the bootstrap server's ``http(s)://`` URL (what the JVM
    reader reads): its ``/startSCN`` then says (credentials from the environment, as
    every client: ``DATABUS_TOKEN``, ``DATABUS_CA_FILE``).
    """
    if store_url.startswith(("http://", "https://")):
        from databus.client.bootstrap import BootstrapConnection
        from databus.core.checkpoint import Checkpoint

        conn = BootstrapConnection(store_url)
        try:
            cp, _ = conn.start_scn(Checkpoint.flexible(), None)
        finally:
            conn.close()
        return int(cp.bootstrap_start_scn) - 1
    store = open_store(store_url)
    try:
        st = store.state()
    finally:
        store.close()
    if not st.initialized:
        raise BootstrapTooOldError(f"{_WHO}: the bootstrap store {store_url!r} is not "
                                   "initialised yet (no initial load and no window applied)")
    return st.applied_scn


def register_snapshot(spark: SparkSession) -> None:
    """Make ``format("databus-snapshot")`` and ``format("databus-snapshot-python")``
    available in ``spark``: when :func:`databus.spark.session` loaded the JVM reader,
    ``databus-snapshot`` is that one (Spark refuses a Python source under a JVM
    source's name) and hands store URLs to ``databus-snapshot-python``."""
    from databus.spark import jvm

    if not jvm.active(spark):
        spark.dataSource.register(SnapshotDataSource)
    spark.dataSource.register(PythonSnapshotDataSource)


def _resolve(known: list[tuple[int, str]], wanted: tuple[str, ...],
             url: str) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    for w in wanted:
        hits = [s for s in known if str(s[0]) == w or s[1] == w or s[1].split(".", 1)[-1] == w]
        if len(hits) != 1:
            names = ", ".join(f"{n} ({i})" for i, n in known) or "none"
            what = "is ambiguous" if hits else "is not in"
            raise UnknownSourceError(f"{_WHO}: source {w!r} {what} the bootstrap store {url}; "
                                     f"it holds: {names}")
        if hits[0] not in out:
            out.append(hits[0])
    return out


class _Plan:
    """What planning learned from the store: sources, schemas, SCN, id span."""

    def __init__(self, options: dict[str, str]) -> None:
        self.opts = parse_snapshot_options(options)
        url = self.opts.store
        try:
            store = open_store(url)
            try:
                st = store.state()
                raw_sources = store.get("sources")
                if not st.initialized or raw_sources is None:
                    raise BootstrapTooOldError(
                        f"the store is not initialised yet (applied SCN {st.applied_scn}, "
                        f"sources {'known' if raw_sources else 'not copied from the relay'})")
                known = sorted((int(s["id"]), str(s["name"])) for s in json.loads(raw_sources))
                self.sources = _resolve(known, self.opts.sources, url)
                self.src_ids = [i for i, _ in self.sources]
                self.scn = self._scn(st.applied_scn, store.get("initial_scn"))
                self.initial_scn = store.get("initial_scn")
                self.registry_json = store.get("registry") or SchemaRegistry().to_json()
                self.span = store.snapshot_id_span(self.src_ids, self.scn)
            finally:
                store.close()
        except DatabusError as exc:
            msg = str(exc)
            raise type(exc)(msg if msg.startswith(_WHO) else f"{_WHO}: {msg}") from exc
        table: TableSchema | None = None
        if self.opts.value_format == "struct":
            if len(self.sources) != 1:
                raise ConfigError(f"{_WHO}: typed after structs need exactly one source; read "
                                  "one source per DataFrame or set valueFormat=json")
            table = SchemaRegistry.from_json(self.registry_json).latest(self.src_ids[0])
        self.arrow_schema: pa.Schema = arrow.envelope_schema(table)

    def _scn(self, applied: int, initial: str | None) -> int:
        want = self.opts.scn
        if want is None:
            return applied
        if want > applied:
            raise BootstrapTooOldError(f"the snapshot is complete only to SCN {applied}, "
                                       f"scn={want} was asked (retry later)")
        if initial is not None and want < int(initial):
            raise ConfigError(f"the store's snapshot starts at SCN {initial} (initial load); "
                              f"scn={want} is older")
        return want


class SnapshotDataSource(PlannedDataSource):
    """The ``databus-snapshot`` format (batch reads only)."""

    plan_type = _Plan

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def reader(self, schema: StructType) -> DataSourceReader:
        return SnapshotReader(self._plan())


class PythonSnapshotDataSource(SnapshotDataSource):
    """The Python reader under ``databus-snapshot-python``, whichever reader serves
    ``databus-snapshot``."""

    @classmethod
    def name(cls) -> str:
        return PYTHON_FORMAT


class IdRangePartition(InputPartition):
    """Rows with ``after_id < id <= last_id`` (and scn <= the plan's SCN)."""

    def __init__(self, index: int, after_id: int, last_id: int) -> None:
        super().__init__((index, after_id, last_id))
        self.index = index
        self.after_id = after_id
        self.last_id = last_id


def id_ranges(lo: int, hi: int, n: int) -> list[tuple[int, int]]:
    """``n`` contiguous ``(after_id, last_id]`` ranges covering ids ``lo..hi``
    (some empty when the span has fewer ids than ``n``)."""
    width = max(hi - lo + 1, 0)
    cuts = [lo - 1 + width * i // n for i in range(n + 1)]
    return [(cuts[i], cuts[i + 1]) for i in range(n)]


class SnapshotReader(DataSourceReader):
    """Partition planning (driver) and range reads (executors); picklable."""

    def __init__(self, plan: _Plan) -> None:
        self.opts = plan.opts
        self.src_ids = plan.src_ids
        self.scn = plan.scn
        self.initial_scn = plan.initial_scn
        self.span = plan.span
        self.registry_json = plan.registry_json
        self.arrow_schema = plan.arrow_schema

    def partitions(self) -> Sequence[InputPartition]:
        return [IdRangePartition(i, a, b)
                for i, (a, b) in enumerate(id_ranges(*self.span, self.opts.partitions))]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, IdRangePartition)
        yield from prefetched(partial(self._read_range, partition), self.opts.prefetch_batches)

    def _read_range(self, partition: IdRangePartition,
                    stop: threading.Event) -> Iterator[pa.RecordBatch]:
        store = open_store(self.opts.store)
        registry = SchemaRegistry.from_json(self.registry_json)

        def refresh() -> SchemaRegistry:  # a table version the producer copied after planning
            return SchemaRegistry.from_json(store.get("registry") or self.registry_json)

        decoder = ChunkDecoder(self.arrow_schema, registry, refresh)
        try:
            for src in self.src_ids:
                yield from self._read_source(store, decoder, src, partition, stop)
            if store.get("initial_scn") != self.initial_scn:
                raise BootstrapTooYoungError(
                    f"{_WHO}: the bootstrap store was rebuilt (new initial load) while it was "
                    "read; read the snapshot again")
        finally:
            store.close()

    def _read_source(self, store: BootstrapStore, decoder: ChunkDecoder, src: int,
                     partition: IdRangePartition,
                     stop: threading.Event) -> Iterator[pa.RecordBatch]:
        """The rows of ``src`` in the partition's range as envelope batches of
        ``rowsPerArrowBatch`` rows (the last one shorter): each page comes from the
        store as concatenated events and is decoded many events per call; a page's
        tail shorter than a batch is carried into the next page's buffer."""
        per_batch = self.opts.rows_per_arrow_batch
        after, pending, rows = partition.after_id, b"", 0
        while not stop.is_set():
            chunks, last, got = store.snapshot_chunks(src, after, self.scn + 1,
                                                      self.opts.page_rows, partition.last_id)
            buf = pending + b"".join(chunks) if pending else b"".join(chunks)
            rows += got
            off = 0
            while rows >= per_batch or (not got and rows):
                ch = decoder.decode(buf, off, per_batch, _NO_END, 0)
                assert ch.batch is not None and not ch.eops  # the store holds data events only
                off, rows = ch.off, rows - ch.batch.num_rows
                yield self._snapshot_rows(ch.batch)
            if not got:
                return
            pending, after = buf[off:], last

    def _snapshot_rows(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """A decoded batch of stored events as snapshot rows: op ``r``, sequence
        index 0, ``source.snapshot`` true, no before image (what the applier and the
        initial load store already, made certain here at the cost of a few columns).
        ``scn`` is the event's, which is the store's scn column (the window that
        wrote the row; both writers store it so): checked against the plan's SCN."""
        n = batch.num_rows
        scn = batch.column("scn")
        top = pc.max(scn).as_py()
        if top is not None and top > self.scn:
            raise CorruptEventError(f"{_WHO}: a snapshot row's event has SCN {top}, above the "
                                    f"snapshot SCN {self.scn} its store row was selected by")
        source = batch.column("source")
        fields = [source.type.field(i) for i in range(source.type.num_fields)]
        children = [source.field(i) for i in range(len(fields) - 1)]
        snapshot = pa.StructArray.from_arrays(
            [*children, pa.repeat(True, n)], fields=fields)
        sequence = pa.StructArray.from_arrays(
            [scn, pa.repeat(pa.scalar(0, pa.int32()), n)], fields=list(arrow.SEQUENCE_TYPE))
        row_type = self.arrow_schema.field("before").type
        return pa.RecordBatch.from_arrays(
            [pa.repeat(pa.scalar(ev.Op.READ.letter, pa.string()), n), scn, sequence,
             batch.column("ts_ms"), snapshot, batch.column("key"), pa.nulls(n, row_type),
             batch.column("after")], schema=self.arrow_schema)


_NO_END = (1 << 63) - 1  # a snapshot has no EOP to stop at
