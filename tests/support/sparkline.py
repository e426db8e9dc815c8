"""Processes of the newer Spark lines (4.2: ``.venv-spark42``, 4.3: ``.venv-spark43``;
``scripts/spark-line.sh <line>``), 4.2 unless a function is given ``line``.

A ``spark-pipelines`` run or a Spark Connect server starts its JVM before any user code
runs, so it takes its Spark settings from ``$SPARK_CONF_DIR/spark-defaults.conf``, as a user
sets it up: the line's properties from ``python -m databus.spark.properties`` plus the run's
own lines. :func:`environment` is such a process's environment (nothing of the caller's
Spark 4.1), :func:`write_defaults` its properties file, :func:`pipeline_project` a
``spark-pipelines`` project of one definitions file, :func:`run_pipeline` its run (on a
Connect server of its own, or on one :func:`connect_server` started on a cluster).

:func:`auto_cdc_target_jars`: the suite's AUTO CDC target, Spark's in-memory table with
row-level operations behind the catalog of ``tests/spark/java`` (the one target open-source
Spark 4.2 and 4.3 take; docs/spark.md), named ``mem`` by ``AUTO_CDC_CATALOG``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import textwrap
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path

from databus.javadeps import cache_dir
from tests.support.procs import free_port
from tests.support.wait import wait_until

ROOT = Path(__file__).resolve().parents[2]


def venv(line: str = "4.2") -> Path:
    """The ``bin`` directory of ``line``'s venv (it may not exist: tests skip then)."""
    return ROOT / f".venv-spark{line.replace('.', '')}" / "bin"


VENV = venv("4.2")
AUTO_CDC_CATALOG = "spark.sql.catalog.mem io.databus.sparktest.SharedRowLevelCatalog"


def environment(conf: Path, *, line: str = "4.2") -> dict[str, str]:
    """The environment of a process of ``line``, reading its settings from ``conf``."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYSPARK_", "SPARK_")) and k != "PYTHONPATH"}
    env.update(PATH=f"{venv(line)}:{os.environ['PATH']}", PYTHONPATH=str(ROOT / "src"),
               PYSPARK_PYTHON=str(venv(line) / "python"), SPARK_CONF_DIR=str(conf))
    return env


def auto_cdc_target_jars(line: str = "4.2") -> list[str]:
    """The AUTO CDC target's jars on ``line``; ``AssertionError`` saying how to make them if
    missing."""
    dirs = [cache_dir() / f"{b}-{line}" for b in ("spark-test", "spark-test-catalog")]
    assert all(any(d.glob("*.jar")) for d in dirs), \
        f"no jar in one of {dirs}: run `bash scripts/spark-line.sh {line}`"
    return [str(j) for d in dirs for j in sorted(d.glob("*.jar"))]


def write_defaults(env: dict[str, str], *, jars: Sequence[str] = (),
                   lines: Sequence[str] = (), line: str = "4.2") -> None:
    """``spark-defaults.conf`` in ``env``'s ``SPARK_CONF_DIR``: ``line``'s properties,
    ``jars`` added to ``spark.jars``, then ``lines``."""
    defaults = Path(env["SPARK_CONF_DIR"]) / "spark-defaults.conf"
    made = subprocess.run([str(venv(line) / "python"), "-m", "databus.spark.properties",
                           "--out", str(defaults)],
                          env=env, capture_output=True, text=True, timeout=300, check=False)
    assert made.returncode == 0, made.stderr
    out = [line + ("," + ",".join(jars) if jars and line.startswith("spark.jars ") else "")
           for line in defaults.read_text().splitlines()]
    defaults.write_text("\n".join([*out, *lines]) + "\n")


def pipeline_project(proj: Path, name: str, definitions: str) -> Path:
    """A ``spark-pipelines`` project in ``proj`` whose one library file holds
    ``definitions``; returns its spec file."""
    (proj / "transformations").mkdir(parents=True)
    spec = proj / "spark-pipeline.yml"
    spec.write_text(textwrap.dedent(f"""\
        name: {name}
        storage: file://{proj}/storage
        libraries:
          - glob:
              include: transformations/**
        """))
    (proj / "transformations" / "cdc.py").write_text(definitions)
    return spec


def pipeline_settings(warehouse: Path, relay_url: str) -> list[str]:
    """The pipeline runs' Spark settings beside the line's properties: the warehouse, the
    relay as a catalog (Spark's changelog API, the JVM reader's for 4.2) and the AUTO CDC
    target's catalog."""
    return [f"spark.sql.warehouse.dir {warehouse}", "spark.driver.memory 1g",
            "spark.sql.shuffle.partitions 2", "spark.ui.enabled false",
            "spark.sql.catalog.databus io.databus.spark.DatabusCatalog",
            f"spark.sql.catalog.databus.relay {relay_url}",
            "spark.sql.catalog.databus.partitions 2", AUTO_CDC_CATALOG]


def run_pipeline(tmp: Path, relay_url: str, definitions: str, *, remote: str | None = None,
                 line: str = "4.2", **fields: str) -> subprocess.CompletedProcess[str]:
    """``spark-pipelines run`` of a project in ``tmp / "pipeline"`` whose definitions are
    ``definitions`` with ``relay`` and ``fields`` filled in.

    Without ``remote``, what a user does on one machine: the line's properties and
    :func:`pipeline_settings` (warehouse ``tmp / "warehouse"``) as spark-defaults.conf, read
    by the Connect server ``spark-pipelines`` starts before any definition runs. With
    ``remote`` (``sc://...``), a client of that server, which holds the settings. ``line``:
    the Spark line whose venv runs it."""
    proj, conf = tmp / "pipeline", tmp / "conf"
    spec = pipeline_project(proj, "databus_cdc", definitions.format(relay=relay_url, **fields))
    env = environment(conf, line=line)
    if remote is None:
        write_defaults(env, jars=auto_cdc_target_jars(line), line=line,
                       lines=pipeline_settings(tmp / "warehouse", relay_url))
    return subprocess.run([str(venv(line) / "spark-pipelines"),
                           *(["--remote", remote] if remote else []), "run", "--spec", str(spec)],
                          cwd=proj, env=env, capture_output=True, text=True, timeout=420,
                          check=False)


@contextmanager
def connect_server(env: dict[str, str], master: str, log: Path) -> Iterator[str]:
    """A Spark Connect server of the line on ``master`` (``spark-submit --class
    ...SparkConnectServer``, settings from ``env``'s spark-defaults.conf), as a user runs
    one for a cluster; yields its ``sc://`` URL, stopped (its process group) after."""
    port = free_port()
    with log.open("ab") as fh:
        proc = subprocess.Popen(
            [str(VENV / "spark-submit"), "--master", master, "--class",
             "org.apache.spark.sql.connect.service.SparkConnectServer",
             "--conf", f"spark.connect.grpc.binding.port={port}"],
            env=env, stdout=fh, stderr=subprocess.STDOUT, cwd=log.parent,
            start_new_session=True)

    def listening() -> bool:
        assert proc.poll() is None, f"the Connect server exited: see {log}"
        with socket.socket() as sock:
            return sock.connect_ex(("127.0.0.1", port)) == 0

    try:
        wait_until(listening, 180, "the Spark Connect server to listen", interval=0.5)
        yield f"sc://127.0.0.1:{port}"
    finally:
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
