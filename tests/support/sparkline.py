"""Processes of the second Spark line (``.venv-spark42``, ``scripts/spark-line.sh``).

A ``spark-pipelines`` run or a Spark Connect server starts its JVM before any user code
runs, so it takes its Spark settings from ``$SPARK_CONF_DIR/spark-defaults.conf``, as a user
sets it up: the line's properties from ``python -m databus.spark.properties`` plus the run's
own lines. :func:`environment` is such a process's environment (nothing of the caller's
Spark 4.1), :func:`write_defaults` its properties file, :func:`pipeline_project` a
``spark-pipelines`` project of one definitions file, :func:`run_pipeline` its run (on a
Connect server of its own, or on one :func:`connect_server` started on a cluster).

``AUTO_CDC_TARGET``: the bundles of the suite's AUTO CDC target, Spark's in-memory table with
row-level operations behind the catalog of ``tests/spark/java`` (the one target open-source
Spark 4.2 takes; docs/spark.md), and the catalog line that names it ``mem``.
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
VENV = ROOT / ".venv-spark42" / "bin"
AUTO_CDC_TARGET = ("spark-test-4.2", "spark-test-catalog-4.2")
AUTO_CDC_CATALOG = "spark.sql.catalog.mem io.databus.sparktest.SharedRowLevelCatalog"


def environment(conf: Path) -> dict[str, str]:
    """The environment of a process of the line, reading its settings from ``conf``."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYSPARK_", "SPARK_")) and k != "PYTHONPATH"}
    env.update(PATH=f"{VENV}:{os.environ['PATH']}", PYTHONPATH=str(ROOT / "src"),
               PYSPARK_PYTHON=str(VENV / "python"), SPARK_CONF_DIR=str(conf))
    return env


def auto_cdc_target_jars() -> list[str]:
    """The AUTO CDC target's jars; ``AssertionError`` saying how to make them if missing."""
    dirs = [cache_dir() / b for b in AUTO_CDC_TARGET]
    assert all(any(d.glob("*.jar")) for d in dirs), \
        f"no jar in one of {dirs}: run `bash scripts/spark-line.sh`"
    return [str(j) for d in dirs for j in sorted(d.glob("*.jar"))]


def write_defaults(env: dict[str, str], *, jars: Sequence[str] = (),
                   lines: Sequence[str] = ()) -> None:
    """``spark-defaults.conf`` in ``env``'s ``SPARK_CONF_DIR``: the line's properties,
    ``jars`` added to ``spark.jars``, then ``lines``."""
    defaults = Path(env["SPARK_CONF_DIR"]) / "spark-defaults.conf"
    made = subprocess.run([str(VENV / "python"), "-m", "databus.spark.properties",
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
                 **fields: str) -> subprocess.CompletedProcess[str]:
    """``spark-pipelines run`` of a project in ``tmp / "pipeline"`` whose definitions are
    ``definitions`` with ``relay`` and ``fields`` filled in.

    Without ``remote``, what a user does on one machine: the line's properties and
    :func:`pipeline_settings` (warehouse ``tmp / "warehouse"``) as spark-defaults.conf, read
    by the Connect server ``spark-pipelines`` starts before any definition runs. With
    ``remote`` (``sc://...``), a client of that server, which holds the settings."""
    proj, conf = tmp / "pipeline", tmp / "conf"
    spec = pipeline_project(proj, "databus_cdc", definitions.format(relay=relay_url, **fields))
    env = environment(conf)
    if remote is None:
        write_defaults(env, jars=auto_cdc_target_jars(),
                       lines=pipeline_settings(tmp / "warehouse", relay_url))
    return subprocess.run([str(VENV / "spark-pipelines"),
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
