"""``spark.readStream.format("databus")``: a Python Data Source over a relay.

Register once per session with :func:`register` (or
``spark.dataSource.register(DatabusDataSource)``), then::

    spark.readStream.format("databus").option("relay", url)
         .option("sources", "shop.customers").option("partitions", 4).load()

Driver side (:class:`DatabusStreamReader`): offsets are per-bucket Databus
checkpoints (see :mod:`databus.spark.reading`); ``latestOffset`` asks the relay
for its newest window, or scans window headers when a row/byte read limit
applies; ``prepareForTriggerAvailableNow`` pins the relay's newest window so an
availableNow run ends there. Executor side: each input partition pulls one
MOD bucket of the server-side filter and yields Arrow record batches of the
change envelope (:mod:`databus.spark.arrow`).

Options are checked, and the relay asked for the sources and schemas, when
``load()`` builds the schema: a bad option, an unknown source or an
unreachable relay fails there with a :class:`~databus.core.errors.DatabusError`
message instead of a query that hangs.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.types import StructType

from databus.client.relay import RelayConnection
from databus.core.checkpoint import Checkpoint
from databus.core.errors import ConfigError, DatabusError
from databus.core.schema import SchemaRegistry, TableSchema
from databus.spark import arrow
from databus.spark.limits import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxBytes,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from databus.spark.offsets import Identity, offset_of, offset_scn, relay_address
from databus.spark.options import StreamOptions, parse_options
from databus.spark.planned import PlannedDataSource
from databus.spark.reading import (
    prefetched,
    read_bucket_batches,
    relay_catalog,
    relay_top,
    resolve_sources,
    retrying,
    scan_limit,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

FORMAT = "databus"


PYTHON_FORMAT = "databus-python"


def register(spark: SparkSession) -> None:
    """Make ``format("databus")`` and ``format("databus-python")`` available in ``spark``.

    When :func:`databus.spark.session` loaded the JVM reader (:mod:`databus.spark.jvm`),
    ``format("databus")`` is that one (same rows, schema, offsets and options; Spark
    refuses a Python source under a JVM source's name) and only ``databus-python`` is
    registered here.
    """
    from databus.spark import jvm

    if not jvm.active(spark):
        spark.dataSource.register(DatabusDataSource)
    spark.dataSource.register(PythonDatabusDataSource)


class _Plan:
    """What ``load()`` learned from the relay: options, sources, schemas."""

    def __init__(self, options: dict[str, str]) -> None:
        self.opts: StreamOptions = parse_options(options)
        if self.opts.newest_per_key:
            raise ConfigError(
                "databus source: newestPerKey is read by the JVM reader only (format(\"databus\")"
                " once its jar is built: docs/spark.md); this is the Python source")
        retry = self.opts.relay_retry_seconds
        try:
            with self.opts.connection() as conn:
                # a relay restarting when a query (re)starts is waited for as a running
                # read waits for it: relayRetrySeconds, then the error
                served, origin = retrying(lambda: relay_catalog(conn), retry)
                self.sources = resolve_sources(conn, self.opts.sources, served)
                self.src_ids = [i for i, _ in self.sources]
                registry = retrying(lambda: conn.register(self.src_ids), retry)
                self.registry_json = registry.to_json(self.src_ids)
        except DatabusError as exc:
            msg = str(exc)
            raise type(exc)(msg if msg.startswith("databus source:")
                            else f"databus source: {msg}") from exc
        self.ident = Identity(relay_address(self.opts.relay), origin,
                              tuple(n for _, n in self.sources))
        table: TableSchema | None = None
        if self.opts.value_format == "struct":
            if len(self.sources) != 1:
                raise ConfigError(
                    "databus source: typed before/after structs need exactly one source; give "
                    "one source per stream or set valueFormat=json")
            table = SchemaRegistry.from_json(self.registry_json).latest(self.src_ids[0])
        if self.opts.envelope == "flat":
            assert table is not None  # parse_options: flat needs valueFormat=struct
            try:
                self.arrow_schema: pa.Schema = arrow.flat_schema(table)
            except DatabusError as exc:
                raise ConfigError(f"databus source: envelope=flat: {exc}") from exc
        else:
            self.arrow_schema = arrow.envelope_schema(table)


class DatabusDataSource(PlannedDataSource):
    """The ``databus`` format (streaming reads only)."""

    plan_type = _Plan

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return DatabusStreamReader(self._plan())


class PythonDatabusDataSource(DatabusDataSource):
    """The same source under ``databus-python``: the Python reader even when the JVM one
    serves ``databus``."""

    @classmethod
    def name(cls) -> str:
        return PYTHON_FORMAT


class BucketPartition(InputPartition):
    """One MOD bucket's share of a micro-batch: ``(start, end_scn]``."""

    def __init__(self, bucket: int, start: dict[str, Any], end_scn: int) -> None:
        super().__init__((bucket, end_scn))
        self.bucket = bucket
        self.start = start
        self.end_scn = end_scn


class DatabusStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):  # type: ignore[misc]
    """Offsets, admission control and partition reads; picklable to executors."""

    def __init__(self, plan: _Plan) -> None:
        self.opts = plan.opts
        self.src_ids = plan.src_ids
        self.registry_json = plan.registry_json
        self.arrow_schema = plan.arrow_schema
        self.ident: Identity = plan.ident  # stamped on every offset, checked on every one read
        self._target: int | None = None  # availableNow: never plan past this SCN
        # Spark 4.1 does not pass the batch's start to latestOffset: the end this reader
        # last returned stands in for it. Only that: on 4.1 Spark also calls partitions()
        # and commit() for batches of an earlier run when a query restarts, and an
        # availableNow run then asks for one end offset that must not be capped
        # (measured: remembering those made an availableNow run stop after one batch)
        self._start: dict[str, Any] | None = None

    # -- driver ---------------------------------------------------------------

    def _conn(self) -> RelayConnection:
        return self.opts.connection()

    def initialOffset(self) -> dict[str, Any]:
        # not remembered as the start: Spark 4.1 asks for it on restarts too, where the
        # query's real start is its checkpoint's offset (a cap from here would end behind it)
        pos = self.opts.starting_position
        if pos == "earliest":
            return offset_of(-1, -1, self.opts.partitions, self.ident)
        if pos == "latest":
            with self._conn() as conn:
                return offset_of(relay_top(conn, self.src_ids), -1, self.opts.partitions, self.ident)
        scn = self.opts.source_scn
        assert scn is not None  # parse_options guarantees a number here
        return offset_of(scn, -1, self.opts.partitions, self.ident)

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_rows_per_batch is not None:
            return ReadMaxRows(self.opts.max_rows_per_batch)
        if self.opts.max_bytes_per_batch is not None:
            return ReadMaxBytes(self.opts.max_bytes_per_batch)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        with self._conn() as conn:
            self._target = relay_top(conn, self.src_ids, self.opts.relay_retry_seconds)

    def latestOffset(self, start: dict[str, Any] | None = None,
                     limit: ReadLimit | None = None) -> dict[str, Any]:
        if start is None:  # Spark 4.1 (see databus.spark.limits)
            start, limit = self._start, self.getDefaultReadLimit()
            if start is None:  # a fresh reader: the first batch is not capped
                start, limit = offset_of(-1, -1, self.opts.partitions, self.ident), ReadAllAvailable()
        assert limit is not None
        end = self._latest(start, limit)
        self._start = end
        return end

    def _latest(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        start_scn = offset_scn(start, self.opts.partitions, self.ident)
        start_cp = Checkpoint.from_dict(start["buckets"]["0"])
        with self._conn() as conn:
            top = (relay_top(conn, self.src_ids, self.opts.relay_retry_seconds)
                   if self._target is None else self._target)
            if top <= start_scn:
                return start
            max_rows = max_bytes = None
            if isinstance(limit, ReadMaxRows):
                max_rows = limit.max_rows
                max_bytes = self.opts.max_bytes_per_batch
            elif isinstance(limit, ReadMaxBytes):
                max_bytes = limit.max_bytes
            if max_rows is None and max_bytes is None:
                return offset_of(top, start_scn, self.opts.partitions, self.ident)
            scan = scan_limit(conn, self.src_ids, start_cp, top, max_rows=max_rows,
                              max_bytes=max_bytes, fetch_bytes=self.opts.fetch_bytes,
                              retry_seconds=self.opts.relay_retry_seconds)
        if scan.scn <= start_scn:
            return start
        return offset_of(scan.scn, scan.prev_scn, self.opts.partitions, self.ident)

    def reportLatestOffset(self) -> dict[str, Any] | None:
        try:
            with self._conn() as conn:
                return offset_of(relay_top(conn, self.src_ids), -1, self.opts.partitions, self.ident)
        except DatabusError:
            return None  # only informational (query progress)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        offset_scn(start, self.opts.partitions, self.ident)
        end_scn = offset_scn(end, self.opts.partitions, self.ident)
        return [BucketPartition(b, start["buckets"][str(b)], end_scn)
                for b in range(self.opts.partitions)]

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: the relay keeps no consumer state.

        Not remembered as the next start either: Spark 4.1 also calls this when a
        query restarts, before an availableNow run asks for its one end offset, which
        must then be the relay's newest window, not a capped one."""

    # -- executor ---------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        # imported here: the driver's source runner, a new process per query, never decodes
        from databus.spark.fastread import ChunkDecoder

        assert isinstance(partition, BucketPartition)

        def refresh() -> SchemaRegistry:
            with self._conn() as conn:
                return conn.register(self.src_ids)

        decoder = ChunkDecoder(self.arrow_schema, SchemaRegistry.from_json(self.registry_json),
                               refresh)
        yield from prefetched(
            lambda stop: read_bucket_batches(self.opts, self.src_ids, partition.bucket,
                                             partition.start, partition.end_scn, decoder, stop),
            self.opts.prefetch_batches)


def changes(envelope: DataFrame) -> DataFrame:
    """Flatten the envelope for :func:`databus.spark.apply_changes`.

    The row's columns at top level (the after image, or the before image for a
    delete) plus ``_op`` (c/u/d/r/t) and ``_sequence`` (struct of scn, index):
    use ``sequence_by="_sequence"``, ``apply_as_deletes="_op = 'd'"``,
    ``apply_as_truncates="_op = 't'"`` and ``except_column_list=["_op", "_sequence"]``.
    Needs ``valueFormat=struct``. A stream read with ``envelope=flat`` already
    has this shape and is returned as it is.
    """
    from pyspark.sql import functions as F

    if envelope.columns[-2:] == list(arrow.FLAT_COLUMNS):  # a full envelope ends with after
        return envelope
    if dict(envelope.dtypes).get("after", "").startswith("string"):
        raise ConfigError("changes() needs typed before/after (valueFormat=struct)")
    return envelope.select(
        F.coalesce("after", "before").alias("__row"), F.col("op").alias("_op"),
        F.col("sequence").alias("_sequence"),
    ).select("__row.*", "_op", "_sequence")
