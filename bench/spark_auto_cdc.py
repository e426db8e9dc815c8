"""Spark's AUTO CDC flow beside ``apply_changes``, both reading the relay, on Spark 4.2 or 4.3.

Runs on a line with ``pyspark.pipelines``: 4.2 (``.venv-spark42``, ``bash
scripts/spark-line.sh 4.2``; SCD1, ``apply_changes`` into Delta) or 4.3 (``.venv-spark43``,
``bash scripts/spark-line.sh 4.3``; SCD1 or SCD2 with ``--scd 2``, ``apply_changes`` into
Parquet: no Delta exists for 4.3). N changes (mixed inserts, updates and deletes, the
workload of ``bench.spark_lakehouse``) are committed to three SQLite tables captured by a
relay process; one table's share (N/3 changes) is then applied into a new table of the
``--scd`` type three ways, rounds alternating, each checked equal to the SQLite table (SCD2:
its open versions):

* ``apply_changes``: ``databus.spark.apply_changes`` into Delta (4.4.0; Parquet on 4.3) reading the relay
  through the JVM reader (``envelope=flat``, ``partitions=2``), an availableNow query in a
  ``local[2]`` session that has run three before (warm): seconds from its start to its end;
* ``apply_changes-cold``: the same, the first query of a new session in a new process (the
  session's start-up not counted), as a pipeline run's flow is the first of its server;
* ``auto-cdc``: ``spark-pipelines run`` of a pipeline whose AUTO CDC flow
  (``create_auto_cdc_flow``, the same SCD type, no column mapping) reads the same relay the same way,
  on the local Spark Connect server ``spark-pipelines`` starts (``local[*]``: a master cannot
  be set beside its ``--remote``; the same two cores on the benchmark machine): seconds from the flow's STARTING event to
  its COMPLETED event (the events' own timestamps, to the millisecond: the CLI is run
  through a wrapper that prints them so). The run's start-up (the server, the graph) is
  not counted.

**The targets differ**, so the ratio is a report, not a goal: AUTO CDC refuses every Delta
table on 4.2 (``AUTOCDC_TARGET_DOES_NOT_SUPPORT_MERGE``; docs/spark.md, "Spark lines"), and
its only target on open-source Spark 4.2 is Spark's in-memory table with row-level
operations (Spark's test jar, the catalog of ``tests/spark/java``, built by
``scripts/spark-line.sh``): no files, no commit log. A materialized view copies it into
Delta (Parquet on 4.3) after the flow (not timed) to be checked.

    .venv-spark42/bin/python -m bench.spark_auto_cdc [--changes 1000000] [--repeat 3]
    .venv-spark43/bin/python -m bench.spark_auto_cdc --scd 2 [--changes 1000000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from tests.support.sparkline import (
    AUTO_CDC_CATALOG,
    auto_cdc_target_jars,
    environment,
    pipeline_project,
    venv,
    write_defaults,
)

from bench.spark_apply import RelayProcess
from bench.spark_lakehouse import COLS, FLAT, TABLES, write_changes
from databus.spark import apply_changes, lines, read_table, session

ROOT = Path(__file__).resolve().parents[1]
TABLE = TABLES[0]
LINE = lines.current()
# the line's table format: Delta where it exists, else apply_changes' own Parquet tables
FORMAT = "delta" if "delta" in lines.formats(LINE) else "parquet"
# the CLI of pyspark.pipelines with its events' timestamps to the millisecond
CLI = """\
import pyspark.pipelines.spark_connect_pipeline as scp
from pyspark.pipelines import cli

def log(message, dt):
    print(f"{dt.isoformat(timespec='milliseconds')}: {message}", flush=True)

scp.log_with_provided_timestamp = log
cli.main()
"""
DEFINITIONS = '''
from pyspark import pipelines as dp
from pyspark.sql import SparkSession, functions as F
spark = SparkSession.active()

@dp.temporary_view(name="feed")
def feed():
    return (spark.readStream.format("databus").option("relay", {relay!r})
            .option("sources", {table!r}).option("partitions", "2")
            .option("envelope", "flat").load())

dp.create_streaming_table("mem.db.scd")
dp.create_auto_cdc_flow(target="mem.db.scd", source="feed", keys=["id"],
                        sequence_by="_sequence", apply_as_deletes=F.expr("_op = 'd'"),
                        except_column_list=["_op", "_sequence"], stored_as_scd_type={scd})

@dp.materialized_view(name="scd_copy", format={fmt!r})
def scd_copy():
    return spark.read.table("mem.db.scd")
'''
EVENT = re.compile(r"^(\S+): Flow mem\.db\.scd (?:is STARTING|has COMPLETED)")


def auto_cdc(tmp: Path, relay_url: str, name: str, scd: int) -> tuple[float, Path]:
    """One ``spark-pipelines run``: the AUTO CDC flow's seconds, and its copy's path."""
    proj, conf = tmp / name, tmp / f"{name}-conf"
    spec = pipeline_project(proj, name, DEFINITIONS.format(relay=relay_url, table=TABLE,
                                                           scd=scd, fmt=FORMAT))
    (tmp / "cli.py").write_text(CLI)
    env = environment(conf, line=LINE.name)
    write_defaults(env, jars=auto_cdc_target_jars(LINE.name), line=LINE.name, lines=[
        f"spark.sql.warehouse.dir {tmp / f'{name}-warehouse'}", "spark.driver.memory 4g",
        "spark.sql.shuffle.partitions 4", "spark.ui.enabled false",
        "spark.ui.showConsoleProgress false", AUTO_CDC_CATALOG])
    home = subprocess.run([str(venv(LINE.name) / "python"), "-c", "import pyspark, os; "
                           "print(os.path.dirname(pyspark.__file__))"],
                          env=env, capture_output=True, text=True, check=True).stdout.strip()
    done = subprocess.run([f"{home}/bin/spark-class", "org.apache.spark.deploy.SparkPipelines",
                           str(tmp / "cli.py"), "run", "--spec", str(spec)],
                          cwd=proj, env=env, capture_output=True, text=True, timeout=1800,
                          check=False)
    stamps = [datetime.fromisoformat(m.group(1)) for m in map(EVENT.match, done.stdout.splitlines())
              if m]
    if done.returncode != 0 or len(stamps) != 2:
        raise SystemExit(f"the AUTO CDC run failed:\n{(done.stdout + done.stderr)[-4000:]}")
    return (stamps[1] - stamps[0]).total_seconds(), tmp / f"{name}-warehouse" / "scd_copy"


def bench_session(app: str) -> SparkSession:
    """A ``local[2]`` session with the line's table format."""
    spark = session(app, master="local[2]", lakehouse=[FORMAT] if FORMAT != "parquet" else [],
                    conf={"spark.sql.shuffle.partitions": "4", "spark.ui.enabled": "false",
                          "spark.driver.memory": "4g", "spark.ui.showConsoleProgress": "false"})
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def current_rows(spark: SparkSession, path: Path, scd: int, *, applied: bool) -> DataFrame:
    """The live rows of a table this benchmark made (SCD2: its open versions): an
    ``apply_changes`` table (``applied``) or a pipeline's copy."""
    if applied and FORMAT == "parquet":
        return read_table(spark, str(path), current_only=True)
    df = spark.read.format(FORMAT).load(str(path))
    return df.where("__END_AT IS NULL") if scd == 2 else df


def apply_once(target: Path, relay_url: str, scd: int) -> None:
    """One round's ``apply_changes``, the first query of a new session: prints its seconds."""
    spark = bench_session("databus-autocdc-apply")
    start = time.perf_counter()
    qq = apply_changes(
        target=str(target), keys=["id"], format=FORMAT, stored_as_scd_type=scd,
        source=(spark.readStream.format("databus").option("relay", relay_url)
                .option("sources", TABLE).option("partitions", 2)
                .option("envelope", "flat").load()),
        checkpoint_location=f"{target}.ckpt", trigger={"availableNow": True},
        **FLAT)  # type: ignore[arg-type]
    qq.awaitTermination()
    secs = time.perf_counter() - start
    if qq.exception() is not None:
        raise SystemExit(f"apply_changes failed: {qq.exception()}")
    print(f"SECONDS {secs:.3f}", flush=True)
    spark.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--changes", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--scd", type=int, choices=(1, 2), default=1,
                    help="the tables' SCD type (2: Spark 4.3, the first line whose AUTO CDC "
                         "flow has it)")
    ap.add_argument("--apply-once", help=argparse.SUPPRESS)  # a round's apply_changes process
    ap.add_argument("--relay", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.apply_once:
        apply_once(Path(args.apply_once), args.relay, args.scd)
        return
    if args.scd == 2 and LINE.name == "4.2":
        raise SystemExit("--scd 2: Spark 4.2.1's AUTO CDC flow has SCD1 only; run this with "
                         ".venv-spark43/bin/python (bash scripts/spark-line.sh 4.3)")
    tmp = Path(tempfile.mkdtemp(prefix="databus-autocdc-"))
    db = tmp / "src.db"
    con = sqlite3.connect(db)
    for t in TABLES:
        con.execute(f"CREATE TABLE {t} (id INTEGER PRIMARY KEY, a INTEGER, b REAL, c TEXT)")
    con.close()
    relay = RelayProcess(db, tmp, TABLES)
    try:
        write_changes(db, args.changes)
        top = sqlite3.connect(db).execute("SELECT max(scn) FROM _databus_txlog").fetchone()[0]
        while relay.max_scn() < top:
            time.sleep(0.1)
        want = sorted(sqlite3.connect(db).execute(f"SELECT * FROM {TABLE}").fetchall())
        n = -(-args.changes // len(TABLES))  # write_changes deals changes round the tables
        spark = bench_session("databus-autocdc-bench")
        print(f"setup: {args.changes} changes on {len(TABLES)} tables, {n} of them on "
              f"{TABLE}; Spark {spark.version}; SCD{args.scd}, apply_changes into {FORMAT}",
              flush=True)

        def check(path: Path, what: str, *, applied: bool = True) -> None:
            got = sorted(tuple(r) for r in current_rows(spark, path, args.scd, applied=applied)
                         .select(*COLS).collect())
            assert got == want, f"{what}: the table differs from the source"

        def apply(name: str) -> float:
            start = time.perf_counter()
            qq = apply_changes(
                target=str(tmp / name), keys=["id"], format=FORMAT, stored_as_scd_type=args.scd,
                source=(spark.readStream.format("databus").option("relay", relay.url)
                        .option("sources", TABLE).option("partitions", 2)
                        .option("envelope", "flat").load()),
                checkpoint_location=str(tmp / f"{name}.ckpt"),
                trigger={"availableNow": True}, **FLAT)  # type: ignore[arg-type]
            qq.awaitTermination()
            secs = time.perf_counter() - start
            if qq.exception() is not None:
                raise SystemExit(f"apply_changes failed: {qq.exception()}")
            check(tmp / name, name)
            return secs

        def apply_cold(name: str) -> float:
            done = subprocess.run([sys.executable, "-m", "bench.spark_auto_cdc", "--apply-once",
                                   str(tmp / name), "--relay", relay.url,
                                   "--scd", str(args.scd)], cwd=ROOT,
                                  capture_output=True, text=True, timeout=1800, check=False)
            secs = [line.split()[1] for line in done.stdout.splitlines()
                    if line.startswith("SECONDS ")]
            if done.returncode != 0 or not secs:
                raise SystemExit(f"apply_changes failed:\n{done.stderr[-4000:]}")
            check(tmp / name, name)
            return float(secs[0])

        for w in range(3):  # JIT, the source's first reads: not timed (after one warm-up
            apply(f"warm{w}")  # query the next three still got faster, 2.0 -> 1.3 s)
        results: dict[str, list[float]] = {"apply_changes": [], "apply_changes-cold": [],
                                           "auto-cdc": []}
        for r in range(args.repeat):
            results["apply_changes"].append(apply(f"apply{r}"))
            results["apply_changes-cold"].append(apply_cold(f"cold{r}"))
            secs, copy = auto_cdc(tmp, relay.url, f"auto{r}", args.scd)
            check(copy, f"auto{r}", applied=False)
            results["auto-cdc"].append(secs)
            print(f"round {r}: " + ", ".join(f"{k} {v[-1]:.2f}s" for k, v in results.items())
                  + f" (load average {os.getloadavg()[0]:.1f})", flush=True)
        print(f"\n{'way':<18} | {'target':<24} | {'best s':>7} | {'changes/s':>10} | all runs (s)")
        mine = "Delta 4.4.0" if FORMAT == "delta" else "Parquet (apply_changes')"
        for way, target in (("apply_changes", mine), ("apply_changes-cold", mine),
                            ("auto-cdc", "Spark's in-memory table")):
            times = results[way]
            print(f"{way:<18} | {target:<24} | {min(times):>7.2f} | {n / min(times):>10,.0f} | "
                  + ", ".join(f"{s:.2f}" for s in times))
        b = results["auto-cdc"]
        for base in ("apply_changes", "apply_changes-cold"):
            a = results[base]
            print(f"auto-cdc / {base} (time): {min(b) / min(a):.2f}x best, "
                  f"{statistics.median(y / x for x, y in zip(a, b, strict=True)):.2f}x median "
                  "of rounds (report, no goal: the targets differ)")
    finally:
        relay.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
