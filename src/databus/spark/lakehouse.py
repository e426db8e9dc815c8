"""apply_changes into Delta Lake and Apache Iceberg tables: one MERGE per micro-batch.

The ``foreachBatch`` function behind ``apply_changes(format="delta"|"iceberg")``
(:class:`TableApplier`). Each batch is reduced per key in sequence order and merged
into the table with one ``MERGE INTO``, so each batch is one ACID commit (one Delta
version, one Iceberg snapshot) and the table's history is the batches' history
(time travel: :func:`read_lakehouse` with ``version``).

Table layout: the stored columns, then

* SCD1: ``__seq`` (the sequence of the change that wrote the row). A delete
  removes the row; an older change than the stored one is not applied.
* SCD2: ``__START_AT``, ``__END_AT`` (the names of Spark's AUTO CDC flow; null end =
  the current version) and ``__seq`` (the last change folded into the version). A
  change to a tracked column starts a version; other changes update the current one
  in place; a delete ends it (no row for the delete).

The table is created at the first batch, with table properties ``databus.keys`` and
``databus.scd_type``, checked at every later start. A Delta target is a path, a URI
(``s3a://...``, through Hadoop) or a table name (:mod:`databus.spark.targets`).

**Exactly once.** Spark may run a batch again after a crash between the table
commit and the checkpoint. The commit carries the query's identity
(``app_id``: by default the checkpoint's query id) and the batch id:

* Delta: as an idempotent write (session confs
  ``spark.databricks.delta.write.txnAppId``/``txnVersion``); Delta itself skips
  a batch id it already committed for that app id.
* Iceberg: as snapshot properties ``databus.app``/``databus.batch``; before its first
  batch, the applier reads the table's snapshots (unless it created the table) and skips
  a batch id at or below the newest one committed for that app id.

The ``__seq`` guard (a change not newer than the stored row does nothing) makes a
batch replayed by any other path harmless for SCD1 too.

**A first batch into a new table.** SCD1's first batch into a table that does not
exist yet is one ``CREATE TABLE ... AS SELECT`` of each key's newest change that is
not a delete: the table, its rows and the batch's record in one commit. Not a
``MERGE`` (a join to nothing), not ``CREATE`` then ``INSERT`` (two commits, and
Delta's idempotent-write check of the second rebuilds the log state in three Spark
jobs): 1.4-1.7x less time into Delta (bench/RESULTS.md, spark_lakehouse). A failed
attempt leaves no table; the next creates it. SCD2 creates the table, then merges.

**Schema evolution.** A column the batch has and the table lacks is added
(``ALTER TABLE ... ADD COLUMNS``) before the merge; a column the table has and
the batch lacks (dropped at the source) is kept and written as null by later
changes; a column whose type differs fails the batch with a
:class:`~databus.core.errors.SchemaError` naming it (nothing is written). A
stream's schema is fixed when its query starts: :class:`EvolvingQuery` restarts
the query from its checkpoint when the source reports a new table version.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Literal

from py4j.protocol import Py4JError  # type: ignore[import-untyped]
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.streaming.query import StreamingQuery
from pyspark.sql.types import DataType, Row, StructType

from databus.core.errors import ConfigError, SchemaError
from databus.spark.spec import ApplySpec
from databus.spark.targets import delta_log_holds_files, q, read_text, table_ident

log = logging.getLogger(__name__)

Format = Literal["delta", "iceberg"]
TXN_APP = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"
SNAP_PROP = "spark.sql.iceberg.snapshot-property."
SEQ, START, END = "__seq", "__START_AT", "__END_AT"


def _sql_literal(value: Any) -> str:
    """A sequence value as SQL (numbers, and structs of numbers such as ``_sequence``)."""
    if isinstance(value, Row):
        parts = ", ".join(f"'{k}', {_sql_literal(v)}" for k, v in value.asDict().items())
        return f"named_struct({parts})"
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"apply_changes: a truncate needs a numeric sequence, not {value!r}")
    return repr(value)



def query_app_id(checkpoint_location: str) -> Callable[[], str]:
    """The id of the streaming query that owns ``checkpoint_location`` (read when first asked).

    Spark writes ``<checkpoint>/metadata`` (``{"id": ...}``) when the query first
    starts and keeps it for every restart; a new checkpoint is a new id, so its
    batch ids (which start again at 0) are never mistaken for committed ones.
    """
    found: list[str] = []

    def get() -> str:
        if not found:
            path = checkpoint_location.rstrip("/") + "/metadata"  # a path or a URI
            try:
                found.append("databus:" + json.loads(read_text(None, path))["id"])
            except (OSError, ValueError, KeyError, Py4JError) as exc:
                raise ConfigError(f"apply_changes: cannot read the query id in {path}: {exc}") \
                    from exc
        return found[0]

    return get


class TableApplier:
    """The ``foreachBatch`` function: one batch, one MERGE, one table commit, once."""

    def __init__(self, spec: ApplySpec, fmt: Format, app_id: Callable[[], str]) -> None:
        if fmt not in ("delta", "iceberg"):
            raise ConfigError(f"apply_changes: unknown table format {fmt!r}")
        self.spec = spec
        self.fmt: Format = fmt
        self.ident = table_ident(spec.target, fmt)
        self.app_id = app_id
        self.batches = 0  # merged by this applier (skipped replays not counted)
        self.skipped = 0
        # checked once per applier: the batch schema the table was last found to fit, and
        # per app id the newest batch an Iceberg table holds (only the first batch after a
        # (re)start can be a replay: later ones have ids this applier has not seen)
        self._fits: tuple[StructType, list[str]] | None = None
        self._iceberg_last: dict[str, int | None] = {}
        self._created = False  # no table at the first batch: this applier made it
        self._make = False  # SCD1 and no table yet: the batch creates it (CTAS)
        self.table_properties: dict[str, str] = {}  # more properties of a table it creates
        self.one_row_per_key = False
        """Set when the query starts: its source gives at most one row per key per batch
        (:func:`databus.spark.perkey.one_row_per_key`), so SCD1 needs no window."""

    # -- the batch ---------------------------------------------------------------

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        self.apply(batch, batch_id)

    def apply(self, batch: DataFrame, batch_id: int, app_id: str | None = None) -> bool:
        """Merge ``batch`` as batch ``batch_id`` of ``app_id``; False when it was already."""
        spark = batch.sparkSession
        app = app_id or self.app_id()
        changes = self._changes(batch)
        columns = [c for c in changes.columns if not c.startswith("__")]
        if self._fits is not None and self._fits[0] == changes.schema:
            dropped = self._fits[1]
        else:
            dropped = self._ensure_table(spark, changes.schema, columns)
            # a table this batch makes is checked at the next (a failed CTAS made none)
            self._fits = None if self._make else (changes.schema, dropped)
        if self.fmt == "iceberg" and self._iceberg_done(spark, app, batch_id):
            log.info("apply_changes: batch %d of %s is already in %s: skipped", batch_id, app,
                     self.ident)
            self.skipped += 1
            return False
        cached: list[DataFrame] = []  # unpersisted once the MERGE has committed
        make, self._make = self._make, False
        try:
            if self.spec.stored_as_scd_type == 1:
                source, sql = self._scd1(spark, changes, columns, dropped, cached,
                                         make=make)
            else:
                changes = changes.persist()  # read more than once: read the batch once
                cached.append(changes)
                source, sql = self._scd2(spark, changes, columns, dropped)
            view = f"__databus_batch_{id(self)}"
            source.createOrReplaceTempView(view)
            try:
                self._commit(spark, app, batch_id, sql.format(src=view))
            finally:
                spark.catalog.dropTempView(view)
        finally:
            for df in cached:
                df.unpersist()
        self.batches += 1
        return True

    def _must_cache(self, spark: SparkSession) -> bool:
        """Whether an SCD1 batch's newest change per key is persisted before the MERGE.

        Not for Delta without truncates: the MERGE's source is then read by nothing
        else, and Delta materializes it itself before its two passes
        (``merge.materializeSource=auto`` does for any source that is not a Delta
        table), so a persist would be a second copy (measured in bench/RESULTS.md,
        spark_lakehouse). Iceberg's MERGE reads its source twice (the files to
        rewrite, then the rows) and a truncate's sequence is read before the MERGE:
        without the persist, each would read the batch again from the relay.
        """
        if self.fmt != "delta" or self.spec.apply_as_truncates is not None:
            return True
        mode = spark.conf.get("spark.databricks.delta.merge.materializeSource", "auto")
        return (mode or "auto").lower() == "none"

    def _changes(self, batch: DataFrame) -> DataFrame:
        return self.spec.changes(batch)

    def _commit(self, spark: SparkSession, app: str, batch_id: int, sql: str) -> None:
        if self.fmt == "delta":
            confs = {TXN_APP: app, TXN_VERSION: str(batch_id)}
        else:
            confs = {SNAP_PROP + "databus.app": app, SNAP_PROP + "databus.batch": str(batch_id)}
        for k, v in confs.items():
            spark.conf.set(k, v)
        try:
            spark.sql(sql)
            if self.fmt == "iceberg":
                self._iceberg_last[app] = batch_id
        except PySparkException as exc:
            raise ConfigError(f"apply_changes: batch {batch_id} into {self.ident} failed: "
                              f"{exc}") from exc
        finally:
            for k in confs:  # Delta keeps them for every later write of the session
                spark.conf.unset(k)

    def _iceberg_done(self, spark: SparkSession, app: str, batch_id: int) -> bool:
        if app not in self._iceberg_last:
            # a table created by this applier has no snapshot yet: nothing to look up
            self._iceberg_last[app] = None if self._created else self._iceberg_newest(spark, app)
        last = self._iceberg_last[app]
        return last is not None and batch_id <= last

    def _iceberg_newest(self, spark: SparkSession, app: str) -> int | None:
        row = spark.sql(
            f"SELECT max(CAST(summary['databus.batch'] AS BIGINT)) FROM {self.ident}.snapshots "
            f"WHERE summary['databus.app'] = '{app.replace(chr(39), '')}'").collect()[0]
        return None if row[0] is None else int(row[0])

    # -- the table ---------------------------------------------------------------

    def _ensure_table(self, spark: SparkSession, schema: StructType,
                      columns: list[str]) -> list[str]:
        """Create the table, check it is ours, add new columns, refuse changed types.

        Returns the table's columns the batch lacks (dropped at the source).
        """
        types: dict[str, DataType] = {f.name: f.dataType for f in schema.fields}
        seq_type = types[SEQ]
        wanted = [(c, types[c]) for c in columns] + [(SEQ, seq_type)]
        if self.spec.stored_as_scd_type == 2:
            wanted += [(START, seq_type), (END, seq_type)]
        if not self._exists(spark):
            self._namespace(spark)
            if self.spec.stored_as_scd_type == 1:
                self._make = True  # created by the batch's own commit (module docstring)
            else:
                self._create(spark, wanted)
            self._created = True
            return []
        table = spark.table(self.ident)
        props = self._properties(spark)
        keys = props.get("databus.keys")
        scd = props.get("databus.scd_type")
        if keys != json.dumps(list(self.spec.keys)) or scd != str(self.spec.stored_as_scd_type):
            raise ConfigError(
                f"apply_changes: {self.ident} holds keys={keys} scd_type={scd}, not keys="
                f"{list(self.spec.keys)} scd_type={self.spec.stored_as_scd_type} (or it was not "
                "made by apply_changes)")
        have = {f.name: f.dataType for f in table.schema.fields}
        changed = [f"{c} ({have[c].simpleString()} -> {t.simpleString()})"
                   for c, t in wanted if c in have and have[c] != t]
        if changed:
            raise SchemaError(
                f"apply_changes: columns of {self.ident} changed type at the source: "
                f"{', '.join(changed)}; nothing of this batch was written. Convert the column "
                "in the table (or start a new table) and restart the query")
        added = [(c, t) for c, t in wanted if c not in have]
        if added:
            cols = ", ".join(f"{q(c)} {t.simpleString()}" for c, t in added)
            log.info("apply_changes: adding columns to %s: %s", self.ident, cols)
            spark.sql(f"ALTER TABLE {self.ident} ADD COLUMNS ({cols})")
        hidden = {SEQ, START, END}
        return [c for c in have if c not in hidden and c not in types]

    def _exists(self, spark: SparkSession) -> bool:
        if self.ident.startswith("delta.`"):
            return delta_log_holds_files(spark, self.spec.target)
        return bool(spark.catalog.tableExists(self.spec.target))

    def _properties(self, spark: SparkSession) -> dict[str, str]:
        return {r[0]: r[1] for r in spark.sql(f"SHOW TBLPROPERTIES {self.ident}").collect()}

    def _props(self) -> str:
        props = {"databus.keys": json.dumps(list(self.spec.keys)),
                 "databus.scd_type": str(self.spec.stored_as_scd_type), **self.table_properties}
        return "TBLPROPERTIES (" + ", ".join(f"'{k}' = '{v}'" for k, v in props.items()) + ")"

    def _namespace(self, spark: SparkSession) -> None:
        parts = self.spec.target.split(".")
        if self.fmt == "iceberg" and len(parts) > 2:
            spark.sql(f"CREATE NAMESPACE IF NOT EXISTS {'.'.join(parts[:-1])}")

    def _create(self, spark: SparkSession, columns: list[tuple[str, DataType]]) -> None:
        cols = ", ".join(f"{q(c)} {t.simpleString()}" for c, t in columns)
        log.info("apply_changes: creating %s table %s", self.fmt, self.ident)
        spark.sql(f"CREATE TABLE IF NOT EXISTS {self.ident} ({cols}) USING {self.fmt} "
                  f"{self._props()}")

    # -- SCD1 --------------------------------------------------------------------

    def _scd1(self, spark: SparkSession, changes: DataFrame, columns: list[str],
              dropped: list[str], cached: list[DataFrame], *,
              make: bool = False) -> tuple[DataFrame, str]:
        """The newest change per key and the MERGE that applies it (``{src}`` = it);
        with ``make`` (no table yet), the ``CREATE TABLE ... AS SELECT`` of its rows
        that are not deletes.

        One pass over the batch: the newest change per key, and with truncates
        also the newest truncate, are computed in the job that persists them; the
        truncate's sequence is then read from the persisted rows (a handful), and
        the changes at or before it are left out. Leaving them out after picking
        the newest per key is the same as before: a key whose newest change is
        older than the truncate has all its changes older.
        """
        keys = self.spec.keys
        truncates = self.spec.apply_as_truncates is not None
        part = [F.col(q(k)) for k in keys]
        if truncates:  # a truncate competes with truncates only, never with a key's changes
            part.append(F.col("__kind") == "t")
        if self.one_row_per_key:  # the reader kept each key's newest change already
            top = changes
        else:
            w = Window.partitionBy(*part).orderBy(F.col(SEQ).desc())
            top = changes.withColumn("__n", F.row_number().over(w)).where("__n = 1").drop("__n")
        if self._must_cache(spark) and (truncates or not make):  # a CTAS reads it once
            top = top.persist()
            cached.append(top)
        trunc = None
        if truncates:
            trunc = top.where("__kind = 't'").agg(F.max(SEQ)).collect()[0][0]
            top = top.where(F.col("__kind") != "t")
            if trunc is not None:
                top = top.where(F.col(SEQ) > F.lit(trunc))
        names = ", ".join(q(c) for c in [*columns, SEQ])
        values = ", ".join(f"s.{q(c)}" for c in [*columns, SEQ])
        if make:  # the columns' names and types are the batch's, as _create would give
            log.info("apply_changes: creating %s with its first batch", self.ident)
            return top, (f"CREATE TABLE {self.ident} USING {self.fmt} {self._props()} AS "
                         f"SELECT {values} FROM {{src}} s WHERE s.__kind = 'u'")
        on = " AND ".join(f"t.{q(k)} <=> s.{q(k)}" for k in keys)
        sets = ", ".join([f"{q(c)} = s.{q(c)}" for c in [*columns, SEQ]]
                         + [f"{q(c)} = NULL" for c in dropped])
        sql = (f"MERGE INTO {self.ident} t USING {{src}} s ON {on} "
               f"WHEN MATCHED AND s.{SEQ} > t.{SEQ} AND s.__kind = 'd' THEN DELETE "
               f"WHEN MATCHED AND s.{SEQ} > t.{SEQ} THEN UPDATE SET {sets} "
               f"WHEN NOT MATCHED AND s.__kind = 'u' THEN INSERT ({names}) VALUES ({values})")
        if trunc is not None:
            sql += (f" WHEN NOT MATCHED BY SOURCE AND t.{SEQ} < {_sql_literal(trunc)} "
                    "THEN DELETE")
        return top, sql

    # -- SCD2 --------------------------------------------------------------------

    def _scd2(self, spark: SparkSession, changes: DataFrame, columns: list[str],
              dropped: list[str]) -> tuple[DataFrame, str]:
        """The versions the batch creates or changes, merged on (keys, ``__START_AT``).

        The key's current version (if any) joins the batch as its first event,
        so a batch that continues it (untracked change) updates it in place and
        one that starts a new version or deletes the key closes it.
        """
        keys = list(self.spec.keys)
        kcols = [F.col(q(k)) for k in keys]
        tracked = self.spec.tracked(columns)
        ev = changes.select(*[F.col(q(c)) for c in columns], SEQ, "__kind",
                            F.col(SEQ).alias("__at"))
        ev = ev.dropDuplicates([*keys, SEQ])
        touched = ev.select(*kcols).distinct()
        cur = (spark.table(self.ident).where(F.col(END).isNull())
               .join(touched, on=keys, how="left_semi"))
        cur_ev = cur.select(*[F.col(q(c)) for c in columns], F.col(SEQ),
                            F.lit("c").alias("__kind"), F.col(START).alias("__at"))
        # a change already folded into the current version is a replay: not again
        last = cur.select(*kcols, F.col(SEQ).alias("__cur_seq"))
        ev = (ev.join(last, on=keys, how="left")
              .where(F.col("__cur_seq").isNull() | (F.col(SEQ) > F.col("__cur_seq")))
              .drop("__cur_seq"))
        ev = cur_ev.unionByName(ev)
        by_at = Window.partitionBy(*kcols).orderBy("__at")
        if tracked:
            now = F.struct(*[F.col(q(c)) for c in tracked])
            same = now.eqNullSafe(F.lag(now).over(by_at))
        else:
            same = F.lit(True)
        prev_kind = F.lag("__kind").over(by_at)
        starts = (F.col("__kind") == "d") | prev_kind.isNull() | (prev_kind == "d") | ~same
        ev = ev.withColumn("__vid", F.sum(F.when(starts, 1).otherwise(0)).over(
            by_at.rowsBetween(Window.unboundedPreceding, Window.currentRow)))
        data = [c for c in columns if c not in keys]
        last_ev = F.struct(*[F.col(q(c)) for c in data], F.col("__kind"), F.col(SEQ))
        runs = ev.groupBy(*kcols, "__vid").agg(
            F.min("__at").alias(START), F.max_by(last_ev, "__at").alias("__last"),
            F.min(F.when(F.col("__kind") == "c", 1).otherwise(0)).alias("__only_cur"))
        nxt = F.lead(START).over(Window.partitionBy(*kcols).orderBy(START))
        runs = runs.withColumn(END, nxt)
        versions = runs.where(
            (F.col("__last.__kind") != "d")
            & ~((F.col("__only_cur") == 1) & F.col(END).isNull()))  # unchanged current
        src = versions.select(*kcols, *[F.col(f"__last.{q(c)}").alias(c) for c in data],
                              F.col(f"__last.{SEQ}").alias(SEQ), START, END)
        # computed before the MERGE starts: a MERGE whose source plan reads its own target
        # through a temp view fails to plan on Spark 4.1 with Iceberg ("No plan for
        # TableReference"), and the versions must be those of the table before this batch
        src = src.localCheckpoint(eager=True)
        on = " AND ".join([f"t.{q(k)} <=> s.{q(k)}" for k in keys] + [f"t.{START} = s.{START}"])
        sets = ", ".join([f"{q(c)} = s.{q(c)}" for c in [*data, SEQ, END]]
                         + [f"{q(c)} = NULL" for c in dropped])
        names = ", ".join(q(c) for c in [*columns, SEQ, START, END])
        values = ", ".join(f"s.{q(c)}" for c in [*columns, SEQ, START, END])
        sql = (f"MERGE INTO {self.ident} t USING {{src}} s ON {on} "
               f"WHEN MATCHED THEN UPDATE SET {sets} "
               f"WHEN NOT MATCHED THEN INSERT ({names}) VALUES ({values})")
        return src, sql


def read_lakehouse(spark: SparkSession, target: str, fmt: Format, *,
                   current_only: bool = False, version: int | None = None) -> DataFrame:
    """The rows of a Delta or Iceberg ``apply_changes`` table, without ``__seq``.

    SCD2: every version (``current_only`` keeps the open ones). ``version``
    reads the table as it was at that Delta version or Iceberg snapshot id
    (time travel; :func:`table_versions` lists them).
    """
    ident = table_ident(target, fmt)
    at = f" VERSION AS OF {int(version)}" if version is not None else ""
    df = spark.sql(f"SELECT * FROM {ident}{at}")
    if current_only and END in df.columns:
        df = df.where(F.col(END).isNull())
    return df.drop(SEQ)


def table_versions(spark: SparkSession, target: str, fmt: Format) -> list[dict[str, Any]]:
    """The table's commits, oldest first: ``version`` (Delta version or Iceberg
    snapshot id, for ``read_lakehouse(version=...)``), ``operation``, and for
    Iceberg the ``app`` and ``batch`` that wrote it (Delta keeps those in its
    log's transaction actions, not in its history)."""
    ident = table_ident(target, fmt)
    if fmt == "delta":
        rows = spark.sql(f"DESCRIBE HISTORY {ident}").orderBy("version").collect()
        return [{"version": r["version"], "operation": r["operation"], "app": None,
                 "batch": None} for r in rows]
    rows = spark.sql(f"SELECT snapshot_id, operation, summary FROM {ident}.snapshots "
                     "ORDER BY committed_at").collect()
    return [{"version": r["snapshot_id"], "operation": r["operation"],
             "app": r["summary"].get("databus.app"),
             "batch": int(r["summary"]["databus.batch"]) if "databus.batch" in r["summary"]
             else None} for r in rows]


class EvolvingQuery:
    """A streaming query that restarts from its checkpoint when its source's table changes.

    Spark fixes a stream's schema when the query starts; when the databus source
    meets a table version with columns the query lacks, the batch fails with
    "restart the query" and nothing of it is written. This wrapper then builds
    the source again (``make_source``, which reads the relay's newest schema)
    and starts the query again from the same checkpoint, so the new columns reach
    the table without the user restarting anything. Any other failure ends it.
    """

    def __init__(self, start: Callable[[], StreamingQuery], *, max_restarts: int = 100) -> None:
        self._start = start
        self.max_restarts = max_restarts
        self.restarts = 0
        self._stopped = threading.Event()
        self._error: BaseException | None = None
        self.query = start()
        self._thread = threading.Thread(target=self._watch, name="databus-evolving", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stopped.is_set():
            try:
                self.query.awaitTermination()
                return  # ended (availableNow done, or stopped)
            # broad: the watcher thread's top; whatever ended the query is kept for
            # the caller, who gets it raised
            except Exception as exc:
                if "restart the query" not in str(exc) or self.restarts >= self.max_restarts:
                    self._error = exc
                    return
                if self._stopped.is_set():
                    return
                self.restarts += 1
                log.info("apply_changes: the source's table changed: restarting the query "
                         "(restart %d)", self.restarts)
                time.sleep(0.1)
                self.query = self._start()

    def awaitTermination(self, timeout: float | None = None) -> bool:
        """Wait for the end (True) or ``timeout`` seconds (False); raises a final failure."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            return False
        if self._error is not None:
            raise self._error
        return True

    def exception(self) -> BaseException | None:
        """The failure that ended the query, if any."""
        return self._error

    @property
    def isActive(self) -> bool:
        return self._thread.is_alive()

    @property
    def recentProgress(self) -> list[dict[str, Any]]:
        return list(self.query.recentProgress)

    def processAllAvailable(self) -> None:
        self.query.processAllAvailable()

    def stop(self) -> None:
        self._stopped.set()
        self.query.stop()
        self._thread.join(60)


def initial_load(spark: SparkSession, *, target: str, format: Format,
                 store: str, source: str, keys: tuple[str, ...] | list[str],
                 stored_as_scd_type: int = 1, partitions: int = 4,
                 app_id: str = "databus-initial") -> int:
    """Load a bootstrap store's snapshot of ``source`` into a new table; returns its SCN X.

    Then start the stream with ``.option("startingPosition", X)`` and
    :func:`~databus.spark.apply_changes` into the same table: the snapshot holds
    every key as of X (a key changed after X is left out and brought by the
    stream), the stream every change after X: no gap, no duplicate.

    Exactly once across a crash: X is kept in the table's property
    ``databus.initial_scn``, set in the same commit as the load (SCD1: the table
    is created by it), else before it; a call that finds X loads the snapshot as
    of that X as one commit under ``app_id``, which the table skips when it holds
    it. So calling this again after any failure is safe and returns the X loaded.
    """
    from databus.spark.snapshot import register_snapshot, snapshot_scn
    from databus.spark.source import changes

    register_snapshot(spark)
    spec = ApplySpec(target=target, keys=tuple(keys), sequence_by="_sequence",
                     apply_as_deletes="_op = 'd'", except_column_list=("_op", "_sequence"),
                     stored_as_scd_type=stored_as_scd_type)
    applier = TableApplier(spec, format, lambda: app_id)

    def read(x: int) -> DataFrame:
        return changes(spark.read.format("databus-snapshot").option("store", store)
                       .option("sources", source).option("partitions", partitions)
                       .option("scn", x).load())

    known = applier._properties(spark).get("databus.initial_scn") if applier._exists(spark) \
        else None
    if known is None:
        x = snapshot_scn(store)
        snap = read(x)
        applier.table_properties["databus.initial_scn"] = str(x)  # SCD1: in the CTAS
        if stored_as_scd_type == 2 or applier._exists(spark):  # before the load's commit
            applier._ensure_table(spark, applier._changes(snap).schema, spec.columns(snap))
            if not applier._created:  # a table made here has X among its properties
                spark.sql(f"ALTER TABLE {applier.ident} SET TBLPROPERTIES "
                          f"('databus.initial_scn' = '{x}')")
    else:
        x = int(known)
        snap = read(x)
    if applier.apply(snap, 0):
        log.info("apply_changes: %s loaded from the snapshot as of SCN %d", applier.ident, x)
    return x
