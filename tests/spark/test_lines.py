"""The Spark lines databus knows (databus.spark.lines) and the properties file for
applications Python does not start (python -m databus.spark.properties)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from databus.core.errors import ConfigError
from databus.spark import jvm, lines
from tests.spark.lines import needs


def test_each_line_names_its_bundles_and_refuses_what_it_lacks() -> None:
    assert lines.line_of("4.1.4").name == "4.1"
    assert lines.formats(lines.line_of("4.1.0")) == ("delta", "iceberg")
    four_two = lines.line_of("4.2.1")
    assert lines.formats(four_two) == ("delta",)
    assert lines.bundle(four_two, "delta") == "delta-4.2"
    with pytest.raises(ConfigError, match=r"iceberg is not available on Spark 4\.2: no Iceberg "
                                          r"runtime"):
        lines.bundle(four_two, "iceberg")
    four_three = lines.line_of("4.3.0")
    assert (four_three.name, four_three.auto_cdc, four_three.changelog) == ("4.3", True, True)
    assert lines.formats(four_three) == ()
    with pytest.raises(ConfigError, match=r"delta is not available on Spark 4\.3: no Delta is "
                                          r"built for Spark 4\.3.*; use Spark 4\.1 or 4\.2 for "
                                          r"delta"):
        lines.bundle(four_three, "delta")
    with pytest.raises(ConfigError, match=r"; use Spark 4\.1 for iceberg"):
        lines.bundle(four_three, "iceberg")
    with pytest.raises(ConfigError, match=r"pyspark 4\.4\.0 is not a supported Spark line"):
        lines.line_of("4.4.0")
    with pytest.raises(ConfigError, match="unknown lakehouse format 'hudi'"):
        lines.bundle(four_two, "hudi")


@needs("delta")
def test_the_properties_file_holds_the_lines_jars_and_extensions(tmp_path: Path) -> None:
    out = tmp_path / "conf" / "spark-defaults.conf"
    done = subprocess.run([sys.executable, "-m", "databus.spark.properties", "--out", str(out),
                           "--lakehouse", "delta", "--warehouse", str(tmp_path / "w")],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    props = dict(line.split(" ", 1) for line in out.read_text().splitlines())
    line = lines.current()
    jars = props["spark.jars"].split(",")
    assert all(Path(j).is_file() for j in jars)
    assert any(f"delta-spark_{line.name}_2.13" in j for j in jars)
    assert any(j.endswith(f"{line.reader_dir}/databus-spark-source.jar") for j in jars)
    assert props["spark.sql.extensions"] == "io.delta.sql.DeltaSparkSessionExtension"
    assert props["spark.sql.catalog.spark_catalog"].endswith("DeltaCatalog")
    bad = subprocess.run([sys.executable, "-m", "databus.spark.properties", "--lakehouse",
                          "hudi"], capture_output=True, text=True, timeout=300, check=False)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        "databus.spark.properties: unknown lakehouse formats "
        "['hudi'] (known: delta, iceberg)"]


@pytest.mark.skipif(jvm.jar() is None, reason="no JDK here to build the JVM reader")
def test_only_a_line_with_the_changelog_api_has_the_databus_catalog() -> None:
    # Spark 4.1 has no Changelog interface: its jar is built without src-changelog's catalog
    jar = jvm.jar()
    assert jar is not None
    with zipfile.ZipFile(jar) as z:
        names = set(z.namelist())
    has = {"io/databus/spark/DatabusCatalog.class",
           "io/databus/spark/DatabusChangelog.class"} <= names
    assert has == lines.current().changelog
    assert "io/databus/spark/DatabusProvider.class" in names
