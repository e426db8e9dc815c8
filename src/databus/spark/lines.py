"""The Spark lines databus runs on, and which Java bundles each one takes.

A *line* is a Spark minor version (4.1, 4.2, 4.3): the lakehouse jars and the JVM reader are
built per line (Scala binary and Spark's internal APIs change between minors). The line is
the one of the pyspark this process imports; nothing is chosen by hand.

* 4.1 (the pinned line, ``.venv``): Delta (``delta``) and Iceberg (``iceberg``).
* 4.2 (``.venv-spark42``, made by ``scripts/spark-line.sh``): Delta (``delta-4.2``) and
  Spark Declarative Pipelines (``pyspark.pipelines``, whose AUTO CDC flow Spark 4.2.1 runs
  only into a table with DSv2 row-level operations, which neither Delta 4.4.0 nor Parquet
  has), and Spark's changelog API (``TableCatalog.loadChangelog``: the JVM reader's
  ``io.databus.spark.DatabusCatalog``, built only for this line); no Iceberg runtime
  exists for it (checked on Maven Central,
  2026-11-28: ``iceberg-spark-runtime-4.1_2.13:1.12.0`` is the newest Spark line Iceberg
  builds, and it fails on 4.2 with ``IncompatibleClassChangeError``).
* 4.3 (``.venv-spark43``, ``scripts/spark-line.sh 4.3``): what 4.2 has, and AUTO CDC flows
  with SCD2 (``stored_as_scd_type=2``, not in 4.2.1); no lakehouse format: neither Delta
  nor Iceberg is built for 4.3 (checked on Maven Central, 2026-11-30), so its tables are
  Spark's own (Parquet) and its AUTO CDC targets are tables with row-level operations.

A lakehouse format the line has no bundle for is a :class:`~databus.core.errors.ConfigError`
naming the line and why; a line databus does not know (4.0, 4.4) is one too, at
:func:`current`.
"""

from __future__ import annotations

from dataclasses import dataclass

from databus.core.errors import ConfigError

PINNED = "4.1"


@dataclass(frozen=True)
class Line:
    """One Spark line: its Java bundles per lakehouse format (None: none exists), the
    cache directory of the JVM reader built for it, and what it can do."""

    name: str
    bundles: dict[str, str | None]
    reader_dir: str
    auto_cdc: bool      # Spark has pyspark.pipelines.create_auto_cdc_flow
    changelog: bool     # Spark has TableCatalog.loadChangelog / DataStreamReader.changes
    why_not: dict[str, str]


LINES: dict[str, Line] = {
    "4.1": Line("4.1", {"delta": "delta", "iceberg": "iceberg"}, "spark-source",
                auto_cdc=False, changelog=False, why_not={}),
    "4.2": Line("4.2", {"delta": "delta-4.2", "iceberg": None}, "spark-source-4.2",
                auto_cdc=True, changelog=True,
                why_not={"iceberg": "no Iceberg runtime is built for Spark 4.2 (the newest, "
                                    "iceberg-spark-runtime-4.1_2.13:1.12.0, fails on 4.2 with "
                                    "IncompatibleClassChangeError: SparkView)"}),
    "4.3": Line("4.3", {"delta": None, "iceberg": None}, "spark-source-4.3",
                auto_cdc=True, changelog=True,
                why_not={"delta": "no Delta is built for Spark 4.3 (no delta-spark_4.3_2.13; "
                                  "delta-spark_4.2_2.13:4.4.0 fails on 4.3 with "
                                  "NoSuchMethodError: LogicalRDD.<init>)",
                         "iceberg": "no Iceberg runtime is built for Spark 4.3 (the newest, "
                                    "iceberg-spark-runtime-4.1_2.13:1.12.0, fails on 4.3 with "
                                    "IncompatibleClassChangeError: SparkView)"}),
}


def line_of(version: str) -> Line:
    """The line of a pyspark ``version`` such as ``4.2.1``; ConfigError for another one."""
    minor = ".".join(version.split(".")[:2])
    found = LINES.get(minor)
    if found is None:
        raise ConfigError(f"databus.spark: pyspark {version} is not a supported Spark line "
                          f"(supported: {', '.join(sorted(LINES))}; see docs/spark.md, "
                          "'Spark lines')")
    return found


def current() -> Line:
    """The line of the pyspark this process imports."""
    import pyspark

    return line_of(pyspark.__version__)


def formats(line: Line) -> tuple[str, ...]:
    """The lakehouse formats ``line`` has jars for, in the order databus names them."""
    return tuple(f for f, b in line.bundles.items() if b is not None)


def bundle(line: Line, fmt: str) -> str:
    """The Java bundle of ``fmt`` on ``line``; ConfigError when the line has none."""
    if fmt not in line.bundles:
        raise ConfigError(f"databus.spark: unknown lakehouse format {fmt!r} "
                          f"(known: {', '.join(line.bundles)})")
    name = line.bundles[fmt]
    if name is None:
        having = [n for n, other in LINES.items() if other.bundles.get(fmt)]
        raise ConfigError(f"databus.spark: {fmt} is not available on Spark {line.name}: "
                          f"{line.why_not.get(fmt, 'no jars for this line')}; use Spark "
                          f"{' or '.join(having)} for {fmt} (docs/spark.md, 'Spark lines')")
    return name
