"""Whether a streaming DataFrame gives at most one row per key in each micro-batch.

``apply_changes`` (SCD1) keeps each key's newest change of a micro-batch with a window
(a shuffle and a sort of the whole batch). The JVM reader's ``newestPerKey`` already
gives one row per key of the source table per micro-batch (docs/spark.md), so the
window only costs: measured 1.12x faster without it into Delta (bench/RESULTS.md,
``bench.spark_lakehouse``). But the micro-batch that reaches ``foreachBatch`` no longer
says where its rows came from, and skipping the window on rows that do repeat a key
would make the MERGE fail or apply an older change. So the decision is made from the
DataFrame's plan when the query starts, and only when it is provably safe:

* the plan is a chain of projections, filters and aliases over exactly one stream of the
  JVM reader (``format("databus")``), read with ``newestPerKey`` true, ``envelope``
  flat and exactly one source;
* each key column of the DataFrame is the reader's own column of that name, passed
  through every projection unchanged (not recomputed, not renamed from another);
* the keys are exactly the source table's primary-key columns, in every schema version
  the relay holds.

Anything else (Spark Connect, another format, a union, a join, an aggregate, a full
envelope flattened by :func:`~databus.spark.changes`, a relay that cannot be asked)
answers False: the window runs, as it always may.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from pyspark.sql import DataFrame

from databus.core.errors import DatabusError
from databus.spark.options import parse_options
from databus.spark.reading import resolve_sources

log = logging.getLogger("databus.spark")

_PASS = ("Project", "Filter", "SubqueryAlias")  # nodes that never add a row
_JVM_TABLE = "io.databus.spark."


def one_row_per_key(df: DataFrame, keys: Sequence[str]) -> bool:
    """True when every micro-batch of ``df`` has at most one row per value of ``keys``
    (see the module docstring); False whenever that cannot be shown."""
    try:
        plan = df._jdf.queryExecution().analyzed()
    except Exception:  # broad: Spark Connect has no _jdf; any py4j failure means "unknown"
        return False
    try:
        return _check(plan, list(keys))
    except DatabusError as exc:
        log.info("apply_changes: the source's keys could not be checked (%s): the "
                 "newest-per-key window runs", exc)
        return False
    except Exception as exc:  # broad: an unexpected plan shape (py4j) means "unknown"
        log.debug("apply_changes: plan not understood (%s): the window runs", exc)
        return False


def _seq(scala_seq: Any) -> list[Any]:
    return [scala_seq.apply(i) for i in range(scala_seq.size())]


def _check(plan: Any, keys: list[str]) -> bool:
    # the key columns as the top of the plan gives them: name -> expression id
    wanted = {a.name(): a.exprId().id() for a in _seq(plan.output()) if a.name() in keys}
    if len(wanted) != len(keys):
        return False
    ids = set(wanted.values())
    node = plan
    while node.nodeName() in _PASS:
        if node.nodeName() == "Project":
            for e in _seq(node.projectList()):
                if e.exprId().id() in ids and \
                        e.getClass().getSimpleName() != "AttributeReference":
                    return False  # a key computed or renamed here, not passed through
        children = _seq(node.children())
        if len(children) != 1:
            return False
        node = children[0]
    if node.nodeName() != "StreamingRelationV2" or \
            not node.table().getClass().getName().startswith(_JVM_TABLE):
        return False
    output = {a.name(): a.exprId().id() for a in _seq(node.output())}
    if any(output.get(k) != i for k, i in wanted.items()):
        return False  # a key column is not the reader's own column of that name
    opts = parse_options(dict(node.extraOptions().asCaseSensitiveMap()))
    if not opts.newest_per_key or opts.envelope != "flat" or len(opts.sources) != 1:
        return False
    conn = opts.connection()
    try:
        (src_id, name), = resolve_sources(conn, opts.sources)
        versions = conn.register([src_id]).versions(src_id)
    finally:
        conn.close()
    if not versions or any(set(v.key_columns) != set(keys) for v in versions):
        log.info("apply_changes: keys %s are not the primary key of %s: the newest-per-key"
                 " window runs", keys, name)
        return False
    log.info("apply_changes: %s is read with newestPerKey, one row per key %s per"
             " micro-batch: no newest-per-key window", name, keys)
    return True
