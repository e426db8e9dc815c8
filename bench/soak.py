"""The randomized soak at full speed (issue 35): ``--minutes`` of faults picked at random
while sysbench's ``oltp_write_only`` writes a private MariaDB as fast as it goes and a
paced writer writes a private PostgreSQL; then the checker of ``tests/support/soak.py``
(the topology, the faults and what "committed" is read from are described there).

Printed and appended to ``bench/results/soak.md`` (``--out``) as a dated section: the seed, the faults
injected per kind (and each one's log line), the transactions committed and checked,
and for each recorder the windows, lost, torn, reordered, phantom and duplicated
(whole windows replayed after a restart from a checkpoint) counts; for each replicate
whether every table equals its source.

The full mix (the default; ``--no-full`` leaves it out): a private Kafka broker with
``databus publish`` of the relay cluster into it, and a Spark query (the ``databus``
source on the chain relay into a Parquet sink with a checkpoint, its own driver
process), with the faults ``kill_publish`` and ``kill_spark``; both must hold every
committed transaction exactly once (``tests/support/soak_kafka.py``,
``tests/support/soak_spark.py``). The suite's paced run (``tests/faults/test_soak.py``)
has neither.

    flock /tmp/databus-bench.lock .venv/bin/python -m bench.soak --minutes 30 [--seed N]

The last line is machine-readable (``RESULT {...}``); the exit status is 1 when the
checker found anything.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.support.soak import Settings, run_soak, unavailable

ROOT = Path(__file__).resolve().parents[1]


HEADER = """# The randomized soak (`bench.soak`, issue 35)

Faults picked at random (seeded) while sysbench writes MariaDB and a paced writer writes
PostgreSQL; then every recorder's history is checked against what the databases
committed and every replica against its source. The topology, the faults and the
checks: `tests/support/soak.py` and docs/guarantees.md ("Soak"). One section per run,
newest last.
"""


def markdown(report: dict[str, Any], args: argparse.Namespace, started: str) -> str:
    rec = report["recorders"]
    lines = [
        f"## Run of {started} UTC, seed {report['seed']}:"
        f" {'PASS' if report['ok'] else 'FAIL'}", "",
        f"Command: `flock /tmp/databus-bench.lock .venv/bin/python -m bench.soak"
        f" {' '.join(sys.argv[1:])}` (seed {report['seed']}); sysbench `oltp_write_only`"
        f" {args.tables} tables x {args.table_size} rows, {args.threads} threads,"
        f" rate {args.rate or 'unpaced'}; PostgreSQL writer {args.pg_rate:g} tx/s;"
        f" {'full mix (publish into Kafka, a Spark query)' if args.full else 'without Kafka and Spark (--no-full)'}."
        f" Wall {report['wall_s']:.0f} s. Result: **{'PASS' if report['ok'] else 'FAIL'}**.",
        "", "### Faults injected", "", "| kind | count |", "|---|---|",
        *[f"| {k} | {n} |" for k, n in report["faults"].items()],
        f"| total | {sum(report['faults'].values())} |", "",
        f"sysbench was started {report['sysbench_starts']} times (a MariaDB restart ends it);"
        f" the PostgreSQL writer met {report['pg_writer_errors']} errors;"
        f" {report['pg_fast_shutdown_hangs']} PostgreSQL fast shutdowns were still waiting"
        " after 5 s (the relay acknowledges its buffer's trim point, not its newest window:"
        " docs/postgresql.md) and were finished as immediate ones.", "",
        f"Transactions checked: {sum(report['committed'].values())}"
        f" ({report['committed']['my']} MariaDB, {report['committed']['pg']} PostgreSQL),"
        f" each against every recorder of its source.", "",
        "### Histories", "",
        f"Committed: {report['committed']['my']} MariaDB transactions (binlog),"
        f" {report['committed']['pg']} PostgreSQL transactions (`marks`).", "",
        "(`publish` and `spark` are exactly once: a duplicated window is a failure there;"
        " for the recorders, whole windows replayed after a restart.)", "",
        "| recorder | windows | lines | lost | torn | reordered | phantom | duplicated |",
        "|---|---|---|---|---|---|---|---|",
        *[f"| {n} | {r['windows']} | {r['windows_recorded']} | {r['lost']} | {r['torn']} |"
          f" {r['reordered']} | {r['phantom']} | {r['duplicated']} |" for n, r in rec.items()],
        "", "| replicate | every table equals its source |", "|---|---|",
        *[f"| {n} | {r['equal']} {r['tables_differing'] or ''} |"
          for n, r in report["replicates"].items()], "",
    ]
    problems = [f"- {n}: {p}" for n, r in rec.items() for p in r["problems"]]
    problems += [f"- {n} died: {why}" for n, why in report["died"].items()]
    if problems:
        lines += ["### Problems found", "", *problems, ""]
    lines += ["### Fault log", "", "```", *report["fault_log"], "```", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--seed", type=int, default=None, help="default: a random one (printed)")
    ap.add_argument("--tables", type=int, default=4)
    ap.add_argument("--table-size", type=int, default=10_000)
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--rate", type=int, default=0, help="sysbench --rate (0: unpaced)")
    ap.add_argument("--pg-rate", type=float, default=50.0)
    ap.add_argument("--buffer-mb", type=int, default=512)
    ap.add_argument("--catch-up", type=float, default=900.0)
    ap.add_argument("--full", action=argparse.BooleanOptionalAction, default=True,
                    help="publish into Kafka and a Spark query too (default: on)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "soak.md")
    ap.add_argument("--keep", action="store_true", help="keep the run's directory (logs)")
    args = ap.parse_args()
    reason = unavailable()
    if reason is not None:
        raise SystemExit(f"cannot run the soak: {reason}")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
    started = time.strftime("%Y-%m-%d %H:%M", time.gmtime())
    tmp = Path(tempfile.mkdtemp(prefix="databus-soak-"))
    print(f"soak: seed {seed}, logs in {tmp}", flush=True)
    report = run_soak(tmp, Settings(
        seed=seed, seconds=args.minutes * 60, tables=args.tables, table_size=args.table_size,
        threads=args.threads, rate=args.rate, pg_rate=args.pg_rate,
        buffer_mb=args.buffer_mb, catch_up=args.catch_up, full=args.full),
        say=lambda line: print(line, flush=True))
    text = markdown(report, args, started)
    if not args.out.exists():
        args.out.write_text(HEADER)
    with args.out.open("a") as f:  # each run a dated section at the end
        f.write("\n" + text)
    print(text)
    if report["ok"] and not args.keep:
        shutil.rmtree(tmp, ignore_errors=True)
    print("RESULT " + json.dumps({k: v for k, v in report.items() if k != "fault_log"}))
    sys.exit(0 if report["ok"] else 1)


if __name__ == "__main__":
    main()
