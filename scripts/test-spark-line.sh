#!/usr/bin/env bash
# The Spark tests of the second Spark line (4.2, .venv-spark42; docs/spark.md "Spark lines"):
# a smaller set than the pinned line's (the whole tests/spark runs on 4.1 in scripts/test.sh):
# both readers (the JVM one as rows, as columnar batches and newest per key), apply_changes, the relay -> Spark -> table pipelines, the progress metrics,
# Spark's changelog API (the catalog only this line's JVM reader has),
# the lines and the properties file, and the Delta half of
# the lakehouse tests (Iceberg has no runtime for 4.2: those are skipped, saying so).
# Skipped with a note when .venv-spark42 is missing (bash scripts/spark-line.sh makes it).
# Usage: bash scripts/test-spark-line.sh [extra pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv-spark42
if [ ! -x "$venv/bin/python" ]; then
  echo "test-spark-line: no $venv (bash scripts/spark-line.sh sets it up): skipped"
  exit 0
fi
# one process: every test here shares one Spark session (tests/spark/conftest.py)
exec "$venv/bin/python" -m pytest -q "$@" \
  tests/spark/test_jvm_source.py tests/spark/test_apply.py tests/spark/test_pipeline.py \
  tests/spark/test_source.py tests/spark/test_lakehouse.py tests/spark/test_progress.py \
  tests/spark/test_lines.py tests/spark/test_changelog.py tests/spark/test_columnar.py \
  tests/spark/test_newest_per_key.py
