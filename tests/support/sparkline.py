"""Processes of the second Spark line (``.venv-spark42``, ``scripts/spark-line.sh``).

A ``spark-pipelines`` run or a Spark Connect server starts its JVM before any user code
runs, so it takes its Spark settings from ``$SPARK_CONF_DIR/spark-defaults.conf``, as a user
sets it up: the line's properties from ``python -m databus.spark.properties`` plus the run's
own lines. :func:`environment` is such a process's environment (nothing of the caller's
Spark 4.1), :func:`write_defaults` its properties file, :func:`pipeline_project` a
``spark-pipelines`` project of one definitions file.

``AUTO_CDC_TARGET``: the bundles of the suite's AUTO CDC target, Spark's in-memory table with
row-level operations behind the catalog of ``tests/spark/java`` (the one target open-source
Spark 4.2 takes; docs/spark.md), and the catalog line that names it ``mem``.
"""

from __future__ import annotations

import os
import subprocess
import textwrap
from collections.abc import Sequence
from pathlib import Path

from databus.javadeps import cache_dir

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
