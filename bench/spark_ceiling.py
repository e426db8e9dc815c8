"""How fast can any Python streaming data source feed apply_changes here?

The same 1,000,000 changes as ``bench.spark_apply``, applied by the same
``apply_changes`` from five inputs in one session, alternating, best of
``--repeat``:

* the Parquet baseline of ``bench.spark_apply``;
* ``pre-1`` / ``pre-4``: a trivial Python Data Source (``arrowfiles``, below)
  whose ``read()`` only yields record batches, already decoded in the
  ``envelope=flat`` shape, from memory-mapped Arrow IPC files (1 or 4 input
  partitions): no relay, no HTTP, no decoding;
* ``relay-1`` / ``relay-4``: ``format("databus")`` with ``envelope=flat``.

``pre-*`` is the ceiling of the Python Data Source path on this machine:
what is left between it and Parquet is Spark's (per-query Python process,
Python workers, Arrow to rows); between ``relay-*`` and ``pre-*`` is ours.

    .venv/bin/python -m bench.spark_ceiling [--changes 1000000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyspark.sql import DataFrame
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StructType

from bench.spark_apply import captured_changes, run, session
from databus.spark import changes
from databus.spark.source import _Plan


class FilePartition(InputPartition):
    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.path = path


class FilesReader(DataSourceStreamReader):
    """One micro-batch: every file, one input partition each."""

    def __init__(self, paths: list[str]) -> None:
        self.paths = paths

    def initialOffset(self) -> dict[str, int]:
        return {"v": 0}

    def latestOffset(self) -> dict[str, int]:
        return {"v": 1}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[InputPartition]:
        return [FilePartition(p) for p in self.paths] if start["v"] < end["v"] else []

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, FilePartition)
        with pa.memory_map(partition.path) as src:
            reader = pa.ipc.open_file(src)
            for i in range(reader.num_record_batches):
                yield reader.get_batch(i)

    def commit(self, end: dict[str, Any]) -> None:
        pass


class FilesSource(DataSource):
    """``format("arrowfiles")``: options ``n`` and ``p0``..``p{n-1}`` (Arrow IPC files)."""

    @classmethod
    def name(cls) -> str:
        return "arrowfiles"

    def schema(self) -> StructType:
        with pa.memory_map(self.options["p0"]) as src:
            result: StructType = from_arrow_schema(pa.ipc.open_file(src).schema)
            return result

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return FilesReader([self.options[f"p{i}"] for i in range(int(self.options["n"]))])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--changes", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="databus-ceiling-"))
    _db, relay = captured_changes(tmp, args.changes)
    try:
        spark = session()
        spark.dataSource.register(FilesSource)

        def relay_stream(parts: int, envelope: str = "flat") -> DataFrame:
            return changes(spark.readStream.format("databus").option("relay", relay.url)
                           .option("sources", "t").option("partitions", parts)
                           .option("envelope", envelope).load())

        q = (relay_stream(4, "full").writeStream.format("parquet")
             .option("path", str(tmp / "dump")).option("checkpointLocation", str(tmp / "ckpt"))
             .trigger(availableNow=True).start())
        q.awaitTermination()
        schema = spark.read.parquet(str(tmp / "dump")).schema
        flat = _Plan({"relay": relay.url, "sources": "t", "envelope": "flat"}).arrow_schema
        table = pq.read_table(str(tmp / "dump")).select(flat.names).cast(flat)
        files: dict[int, list[str]] = {}
        for parts in (1, 4):
            step = -(-table.num_rows // parts)
            files[parts] = [str(tmp / f"pre{parts}-{i}.arrow") for i in range(parts)]
            for i, path in enumerate(files[parts]):
                with pa.OSFile(path, "wb") as f, pa.ipc.new_file(f, flat) as w:
                    for b in table.slice(i * step, step).to_batches(max_chunksize=8192):
                        w.write_batch(b)

        def pre(parts: int) -> DataFrame:
            reader = spark.readStream.format("arrowfiles").option("n", parts)
            for i, path in enumerate(files[parts]):
                reader = reader.option(f"p{i}", path)
            return reader.load()

        def parquet() -> DataFrame:
            return spark.readStream.schema(schema).parquet(str(tmp / "dump"))

        run(spark, parquet(), tmp, "warm")
        inputs: list[tuple[str, Callable[[], DataFrame]]] = [
            ("parquet", parquet), ("pre-1", lambda: pre(1)), ("pre-4", lambda: pre(4)),
            ("relay-1", lambda: relay_stream(1)), ("relay-4", lambda: relay_stream(4))]
        times: dict[str, list[float]] = {}
        for round_ in range(args.repeat):
            for name, make in inputs:
                secs = run(spark, make(), tmp, f"{name}-{round_}")
                times.setdefault(name, []).append(secs)
                print(f"round {round_}: {name} {secs:.2f}s", flush=True)
        spark.stop()
    finally:
        relay.stop()
    base = min(times["parquet"])
    for name, ts in times.items():
        print(f"{name:<8} best {min(ts):5.2f}s  ratio {base / min(ts):.2f}  all: "
              + ", ".join(f"{t:.2f}" for t in ts))
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
