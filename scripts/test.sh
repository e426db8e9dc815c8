#!/usr/bin/env bash
# One command: set up and run the whole test suite (lint, types, tests).
# Usage: bash scripts/test.sh [extra pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
DATABUS_SETUP_SERVERS=1 bash scripts/setup.sh
echo "== ruff"
.venv/bin/ruff check src tests bench
echo "== mypy (strict, src/)"
.venv/bin/mypy
echo "== the suite's measures (tests/support/measures.py)"
.venv/bin/python -m tests.support.measures
echo "== pytest"
# DATABUS_TEST_WORKERS (default 4) pytest-xdist workers: the suite mostly waits (servers,
# processes, polls), so more workers than the 2 cores pay. Every test that needs the
# Spark session runs on one worker, first, and the tests marked slow start next
# (tests/conftest.py's scheduler); 0 runs everything in one process.
workers=${DATABUS_TEST_WORKERS:-4}
start=$SECONDS
status=0
if [ "$workers" = "0" ]; then
  .venv/bin/python -m pytest -q "$@" || status=$?
else
  .venv/bin/python -m pytest -q -n "$workers" "$@" || status=$?
fi
for line in 4.2 4.3; do
  echo "== pytest on the Spark line $line (scripts/test-spark-line.sh $line)"
  line_start=$SECONDS
  bash scripts/test-spark-line.sh "$line" || status=$?
  echo "== the Spark line $line took $((SECONDS - line_start)) s"
done
echo "== pytest took $((SECONDS - start)) s of wall time with $workers workers;" \
  "CPU time (user, system) of this script, then of all it ran:"
times
exit "$status"
