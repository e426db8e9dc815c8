#!/usr/bin/env bash
# The Spark tests of a newer Spark line (docs/spark.md "Spark lines"; the whole tests/spark
# runs on the pinned 4.1 in scripts/test.sh):
# * 4.2 (.venv-spark42), the default: both readers (the JVM one as rows, as columnar batches
#   and newest per key), apply_changes, the relay -> Spark -> table pipelines, the progress
#   metrics, Spark's changelog API (the catalog only the newer lines' JVM reader has), the
#   lines and the properties file, and the Delta half of the lakehouse tests (Iceberg has no
#   runtime for 4.2: those are skipped, saying so);
# * 4.3 (.venv-spark43): a smaller set, the JVM reader built for it, its progress metrics,
#   the changelog API and the lines (no Delta or Iceberg exists for 4.3; its AUTO CDC SCD2
#   flows run from the main suite, tests/spark/test_spark_scd2.py).
# Skipped with a note when the line's venv is missing (bash scripts/spark-line.sh LINE makes it).
# Usage: bash scripts/test-spark-line.sh [LINE] [extra pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
line=4.2
if [[ "${1:-}" =~ ^4\.[0-9]+$ ]]; then line=$1; shift; fi
case "$line" in
  4.2) tests=(tests/spark/test_jvm_source.py tests/spark/test_apply.py tests/spark/test_pipeline.py
              tests/spark/test_source.py tests/spark/test_lakehouse.py tests/spark/test_progress.py
              tests/spark/test_lines.py tests/spark/test_changelog.py tests/spark/test_columnar.py
              tests/spark/test_newest_per_key.py) ;;
  4.3) tests=(tests/spark/test_jvm_source.py tests/spark/test_progress.py tests/spark/test_lines.py
              tests/spark/test_changelog.py) ;;
  *) echo "test-spark-line: unknown Spark line '$line' (known: 4.2, 4.3)" >&2; exit 1 ;;
esac
venv=.venv-spark${line/./}
if [ ! -x "$venv/bin/python" ]; then
  echo "test-spark-line: no $venv (bash scripts/spark-line.sh $line sets it up): skipped"
  exit 0
fi
# one process: every test here shares one Spark session (tests/spark/conftest.py)
exec "$venv/bin/python" -m pytest -q "$@" "${tests[@]}"
