"""``databus.spark.session()`` keeps what the process's Spark is started with.

Each case is its own Python process (jars and the master reach a JVM only when it
starts; the suite's shared session is already running here): a master and jars from
``PYSPARK_SUBMIT_ARGS`` plus ``conf={"spark.jars": ...}``, and a session somebody else
started before ``session()`` is called.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from databus.spark import jvm
from tests.support.procs import ROOT

pytestmark = pytest.mark.skipif(jvm.jar() is None, reason="no JDK here to build the JVM reader")

PROBE = """
import json, logging, sys
logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
from pyspark.sql import SparkSession
from databus.spark import jvm, session

def state(spark):
    gw = spark.sparkContext._jvm
    loader = gw.java.lang.Thread.currentThread().getContextClassLoader()
    return {"master": spark.sparkContext.master, "jars": spark.conf.get("spark.jars", ""),
            "extensions": spark.conf.get("spark.sql.extensions", ""),
            "app": spark.sparkContext.appName,
            "memory": spark.conf.get("spark.driver.memory", ""),
            "jvm": jvm.active(spark),
            "marks": [m for m in ("mark-a.txt", "mark-b.txt")
                      if loader.getResource(m) is not None]}
"""


def jar_with(where: Path, name: str) -> Path:
    """A user's jar holding one resource ``mark-<name>.txt``."""
    res = where / f"res-{name}"
    res.mkdir()
    (res / f"mark-{name}.txt").write_text(name)
    jar = where / f"{name}.jar"
    subprocess.run(["jar", "--create", "--file", str(jar), "-C", str(res), "."], check=True)
    return jar


def probe(code: str, tmp: Path, **env: str) -> dict[str, Any]:
    script = tmp / "probe.py"
    script.write_text(PROBE + textwrap.dedent(code))
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=180, cwd=tmp,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src"), "PYSPARK_PYTHON": sys.executable,
             **env}, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    out: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    out["stderr"] = done.stderr
    return out


def test_the_master_and_jars_it_is_started_with_are_kept_and_conf_jars_added(
        tmp_path: Path) -> None:
    a, b = jar_with(tmp_path, "a"), jar_with(tmp_path, "b")
    got = probe(f"""
        spark = session(lakehouse=["delta"], conf={{"spark.jars": {str(b)!r},
                        "spark.driver.memory": "700m", "spark.ui.enabled": "false"}})
        print(json.dumps(state(spark)))
        spark.stop()
        """, tmp_path,
        PYSPARK_SUBMIT_ARGS=f"--master local[1] --name started-as --jars {a} pyspark-shell")
    assert got["master"] == "local[1]" and got["app"] == "started-as"
    jars = got["jars"].split(",")
    assert [j for j in jars if j.endswith(("a.jar", "b.jar"))] == [f"file://{a}", str(b)]
    assert sum(j.endswith("databus-spark-source.jar") for j in jars) == 1
    assert any("delta-spark" in j for j in jars)
    assert got["marks"] == ["mark-a.txt", "mark-b.txt"]  # both users' jars load on the driver
    assert got["jvm"], "the JVM reader serves format('databus')"
    assert "io.delta.sql.DeltaSparkSessionExtension" in got["extensions"]
    assert got["memory"] == "700m"  # a launch setting of conf= reached the JVM


def test_a_session_already_running_is_kept_and_gets_the_jvm_reader(tmp_path: Path) -> None:
    got = probe("""
        first = (SparkSession.builder.master("local[1]").appName("theirs")
                 .config("spark.ui.enabled", "false").getOrCreate())
        before = jvm.active(first)
        spark = session(lakehouse=["delta"])
        print(json.dumps({**state(spark), "same": spark is first, "before": before}))
        spark.stop()
        """, tmp_path)
    assert got["same"] and got["master"] == "local[1]" and got["app"] == "theirs"
    assert not got["before"] and got["jvm"]
    # what cannot be added to a running session is said, not skipped silently
    assert "started without delta's extension" in got["stderr"]


def test_pysparks_jars_are_found_from_its_zip_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    import pyspark

    real = Path(pyspark.__file__).resolve().parent
    monkeypatch.delenv("SPARK_HOME", raising=False)
    # as spark-submit and executors import it: <pyspark>/python/lib/pyspark.zip/pyspark
    monkeypatch.setattr(pyspark, "__file__",
                        str(real / "python" / "lib" / "pyspark.zip" / "pyspark" / "__init__.py"))
    assert jvm.spark_jars_dir() == real / "jars"
    monkeypatch.setenv("SPARK_HOME", str(real))
    assert jvm.spark_jars_dir() == real / "jars"


def test_a_jvm_reader_that_cannot_be_had_is_a_warning_naming_why(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    import pyspark

    monkeypatch.setenv("DATABUS_JAVA_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(jvm, "_BUILD", tmp_path / "no-such-build.sh")  # an installed package
    with caplog.at_level(logging.WARNING, logger="databus.spark"):
        assert jvm.jar() is None
    assert "has no java/spark-source to build it from" in caplog.text
    caplog.clear()
    monkeypatch.undo()
    monkeypatch.setenv("DATABUS_JAVA_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("SPARK_HOME", raising=False)
    monkeypatch.setattr(pyspark, "__file__", str(tmp_path / "elsewhere" / "pyspark" / "x.py"))
    with caplog.at_level(logging.WARNING, logger="databus.spark"):
        assert jvm.jar() is None
    assert "pyspark's jars/ directory was not found" in caplog.text
