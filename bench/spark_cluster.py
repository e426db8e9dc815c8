"""The same relay -> Delta SCD1 pipeline on a standalone cluster and on ``local[2]``.

N changes (bench.spark_lakehouse's workload: three SQLite tables, 1,000 changes per
transaction) captured by a relay process are applied by ``apply_changes`` (JVM reader,
``envelope=flat``, ``partitions=2``, availableNow) into a fresh Delta SCD1 table per source
table, by one ``spark-submit`` job per run: ``--master local[2]`` (the baseline) or a
standalone cluster of a master and two workers of one core each started from the venv's
pyspark (tests/support/spark_cluster.py). The job times its queries from the first start
to the last end (its session start is not timed) and checks every table against SQLite.
Rounds alternate the two; each one's best counts. No goal on a 2-core machine: the cluster
has the same two cores, plus the executors' separate JVMs and the network between them.

    flock /tmp/databus-bench.lock .venv/bin/python -m bench.spark_cluster [--changes 300000]
        [--repeat 2]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from tests.support.spark_cluster import VENV_BIN, environment, spark_cluster

from bench.spark_apply import RelayProcess
from bench.spark_lakehouse import TABLES, write_changes

JOB = textwrap.dedent('''
    import json, sqlite3, sys, time
    from pathlib import Path
    from databus.spark import apply_changes, read_lakehouse, register, session, jvm

    relay, db, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    spark = session("databus-cluster-bench", lakehouse=["delta"],
                    conf={"spark.sql.shuffle.partitions": "4", "spark.ui.enabled": "false",
                          "spark.executor.memory": "1g", "spark.driver.memory": "2g",
                          "spark.sql.session.timeZone": "UTC"})
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    t0 = time.perf_counter()
    served = set()
    for t in %(tables)r:
        src = (spark.readStream.format("databus").option("relay", relay).option("sources", t)
               .option("partitions", 2).option("envelope", "flat").load())
        q = apply_changes(target=str(out / t), format="delta", source=src, keys=["id"],
                          sequence_by="_sequence", apply_as_deletes="_op = 'd'",
                          except_column_list=["_op", "_sequence"],
                          checkpoint_location=str(out / (t + ".ckpt")),
                          trigger={"availableNow": True})
        q.awaitTermination()
        served.add(jvm.served_by(q))
    seconds = time.perf_counter() - t0
    equal = all(
        sorted(tuple(r) for r in read_lakehouse(spark, str(out / t), "delta")
               .select("id", "a", "b", "c").collect())
        == sorted(sqlite3.connect(db).execute(f"SELECT * FROM {t}").fetchall())
        for t in %(tables)r)
    (out / "result.json").write_text(json.dumps({"seconds": seconds, "equal": equal,
                                                 "served": sorted(map(str, served))}))
    spark.stop()
''') % {"tables": TABLES}


def run(master: str, job: Path, relay: str, db: Path, out: Path) -> dict[str, object]:
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    done = subprocess.run([str(VENV_BIN / "spark-submit"), "--master", master, "--conf",
                           "spark.cores.max=2", str(job), relay, str(db), str(out)],
                          env=environment(), capture_output=True, text=True, timeout=3600,
                          check=False)
    if done.returncode != 0:
        raise SystemExit(f"the job on {master} failed:\n{done.stderr[-4000:]}")
    result: dict[str, object] = json.loads((out / "result.json").read_text())
    if not result["equal"] or result["served"] != ["jvm"]:
        raise SystemExit(f"the job on {master}: {result}")
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--changes", type=int, default=300_000)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="databus-clusterbench-"))
    db = tmp / "src.db"
    con = sqlite3.connect(db)
    for t in TABLES:
        con.execute(f"CREATE TABLE {t} (id INTEGER PRIMARY KEY, a INTEGER, b REAL, c TEXT)")
    con.close()
    job = tmp / "job.py"
    job.write_text(JOB)
    relay = RelayProcess(db, tmp, TABLES)
    try:
        t0 = time.perf_counter()
        write_changes(db, args.changes)
        top = sqlite3.connect(db).execute("SELECT max(scn) FROM _databus_txlog").fetchone()[0]
        while relay.max_scn() < top:
            time.sleep(0.1)
        print(f"setup: {args.changes} changes captured in {time.perf_counter() - t0:.1f}s",
              flush=True)
        best: dict[str, float] = {}
        with spark_cluster(tmp / "cluster", workers=2, cores=1, memory="2g") as cluster:
            for r in range(args.repeat):
                order = [("local[2]", "local[2]"), ("standalone", cluster.master)]
                for name, master in order if r % 2 == 0 else order[::-1]:
                    res = run(master, job, relay.url, db, tmp / "out")
                    secs = float(str(res["seconds"]))
                    best[name] = min(best.get(name, secs), secs)
                    print(f"round {r + 1} {name:10s} {secs:7.1f}s "
                          f"{args.changes / secs:9.0f} changes/s", flush=True)
        print(f"\nbest of {args.repeat}: local[2] {best['local[2]']:.1f}s "
              f"({args.changes / best['local[2]']:.0f} changes/s), standalone 2x1 core "
              f"{best['standalone']:.1f}s ({args.changes / best['standalone']:.0f} changes/s); "
              f"ratio standalone/local[2] throughput "
              f"{best['local[2]'] / best['standalone']:.2f}", flush=True)
    finally:
        relay.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
