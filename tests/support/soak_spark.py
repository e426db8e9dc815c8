"""The soak's Spark query (``bench.soak --full``): a Structured Streaming query reading a
relay with the ``databus`` source (the JVM reader) into a Parquet file sink with a
checkpoint, run as its own driver process, and what that sink holds, as windows for the
checker (``tests/support/soak_check.py``).

**The driver** (``python -m tests.support.soak_spark``, :func:`driver_args`): one
session, ``local[1]``, one shuffle partition, the suite's lean JVM settings, 1 GiB of
driver memory (the machine has 2 cores); one input partition, so ``sequence.index`` is
the change's place in its window; columns ``scn``, ``idx`` (``sequence.index``),
``tbl``, ``gtid`` (``source.gtid``), ``op``, ``key``; a micro-batch every 2 seconds.
It runs in a session of its own (:func:`start_driver`), so that :func:`kill_driver`
kill -9s the whole application (the Python driver, the JVM, its Python workers); a new
driver on the same checkpoint resumes (docs/spark.md, "Offsets, restarts").

**What is checked.** Spark's file sink is exactly once: a batch's files count only once
the batch's entry is in the sink's log (``<out>/_spark_metadata``), and a batch run
again after a crash writes new files and one entry. docs/spark.md: a micro-batch holds
whole windows, and reading a batch again reads the same windows (a persistent relay
buffer). So the files the log lists must hold every committed change of the tables
read once, in order, windows whole. :class:`SparkHistory` reads the files the log lists
(pyarrow, not Spark: the check must not depend on what it checks), in the log's order,
each file's rows in file order; consecutive rows of one SCN are one window (ordered by
``idx``). A window read again is a second copy (``duplicated`` or ``torn`` for the
checker; for Spark either is a failure); one split between files is ``torn``. Files
of the output directory the log does not list (a batch killed before its entry) are
counted in :attr:`SparkHistory.uncommitted` and not read.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from tests.support.procs import ROOT
from tests.support.soak_check import Window, rows_text

COLUMNS = ("scn", "idx", "tbl", "gtid", "op", "key")


def driver_args(relay: str, sources: Sequence[str], out: Path, checkpoint: Path) -> list[str]:
    return [sys.executable, "-m", "tests.support.soak_spark", "--relay", relay,
            "--sources", ",".join(sources), "--out", str(out),
            "--checkpoint", str(checkpoint)]


def start_driver(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    """The driver in a process group of its own (see :func:`kill_driver`)."""
    path = [str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in path if p),
               PYSPARK_PYTHON=sys.executable)
    with log.open("ab") as fh:
        return subprocess.Popen(args, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                                start_new_session=True)


def kill_driver(proc: subprocess.Popen[bytes]) -> None:
    """kill -9 of the driver's whole process group (the JVM and Python workers too)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(60)


def first_batch_committed(checkpoint: Path) -> bool:
    """Whether the query committed a batch (its batch 0 first): Spark cannot restart a
    query killed inside its very first batch ("offsets should be empty on batch 0", see
    tests/spark/test_restart.py), which is Spark's limit, not the source's. Any commit
    file counts: Spark deletes the oldest ones (it keeps 100 batches), ``0`` among them."""
    commits = checkpoint / "commits"
    return commits.is_dir() and any(p.name.isdigit() for p in commits.iterdir())


class SparkHistory:
    """See the module docstring: the windows in the Parquet sink at ``out``."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.windows: list[Window] = []
        self.problems: list[str] = []
        self.uncommitted = 0
        self._done: set[str] = set()
        self._top = -1
        self._copies = 0

    def _committed_files(self) -> list[str]:
        """The sink log's files in batch order: the newest ``N.compact`` (every batch up
        to N, in order), then the batches after N one file each. Batch files up to N
        that Spark has not deleted yet are left out: listed by name before the compact
        file, their data would come before the batches they followed (a 30-minute soak
        read batches 66-68 ahead of 0-65 so, and counted every later window reordered)."""
        log = self.out / "_spark_metadata"
        if not log.is_dir():
            return []

        def batch(p: Path) -> int:
            return int(p.name.split(".")[0])

        while True:
            logged = sorted((p for p in log.iterdir() if p.name.split(".")[0].isdigit()
                             and not p.name.endswith(".tmp")), key=batch)
            compacts = [p for p in logged if p.name.endswith(".compact")]
            upto = batch(compacts[-1]) if compacts else -1
            chosen = compacts[-1:] + [p for p in logged if batch(p) > upto]
            out: list[str] = []
            seen: set[str] = set()
            try:
                for f in chosen:
                    for line in f.read_text().splitlines()[1:]:  # the first: the version
                        entry = json.loads(line)
                        path = unquote(urlparse(entry["path"]).path)
                        if entry.get("action", "add") == "add" and path not in seen:
                            seen.add(path)
                            out.append(path)
            except FileNotFoundError:
                continue  # compacted away while listed: a newer compact file holds it
            return out

    def read(self, final: bool = False) -> list[Window]:
        """The windows of the files committed since the last call (``final``: the same;
        every file holds whole windows, nothing waits)."""
        import pyarrow.parquet as pq

        files = self._committed_files()
        for path in files:
            if path in self._done:
                continue
            self._done.add(path)
            table = pq.read_table(path, columns=list(COLUMNS)).to_pydict()
            rows: list[tuple[Any, ...]] = list(zip(*(table[c] for c in COLUMNS), strict=True))
            i = 0
            while i < len(rows):
                j = i
                while j < len(rows) and rows[j][0] == rows[i][0]:
                    j += 1
                self._window(sorted(rows[i:j], key=lambda r: r[1]))
                i = j
        if final:
            listed = set(files)
            self.uncommitted = sum(1 for p in self.out.glob("*.parquet")
                                   if str(p) not in listed)
        return self.windows

    def _window(self, rows: list[tuple[Any, ...]]) -> None:
        scn = int(rows[0][0])
        if scn <= self._top:
            self._copies += 1
        gtids: list[str] = []
        events = []
        for _, _, tbl, gtid, op, key in rows:
            if not gtids or gtids[-1] != gtid:
                gtids.append(str(gtid))
            events.append([str(tbl), str(op), str(key)])
        self.windows.append((scn, tuple(gtids), rows_text(events)))
        self._top = max(self._top, scn)

    @property
    def copies(self) -> int:
        """Windows read again at or below an SCN already read."""
        return self._copies


def main() -> None:
    ap = argparse.ArgumentParser(description="the soak's Spark query (see the docstring)")
    ap.add_argument("--relay", required=True)
    ap.add_argument("--sources", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--checkpoint", required=True)
    args = ap.parse_args()
    from pyspark.sql import functions as F

    from databus.spark import register, session
    from tests.support.sparkrelay import LEAN_JVM

    spark = session("databus-soak", master="local[1]", lakehouse=[], conf={
        "spark.sql.shuffle.partitions": "1", "spark.ui.enabled": "false",
        "spark.driver.memory": "1g", **LEAN_JVM})
    spark.sparkContext.setLogLevel("WARN")
    register(spark)
    changes = (spark.readStream.format("databus").option("relay", args.relay)
               .option("sources", args.sources).option("valueFormat", "json")
               .option("relayRetrySeconds", 300).option("consumerName", "soak-spark")
               .load())
    q = (changes.select(F.col("scn"), F.col("sequence.index").alias("idx"),
                        F.col("source.table").alias("tbl"), F.col("source.gtid").alias("gtid"),
                        F.col("op"), F.col("key"))
         .writeStream.format("parquet").option("path", args.out)
         .option("checkpointLocation", args.checkpoint)
         .trigger(processingTime="2 seconds").start())
    print("started", flush=True)
    q.awaitTermination()


if __name__ == "__main__":
    main()
