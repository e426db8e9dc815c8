#!/usr/bin/env bash
# Sets up the project's virtualenv (.venv) with databus and its dev tools.
# Idempotent: reinstalls only when pyproject.toml changed. Installs Debian
# packages the tests need when they are missing (needs root or sudo).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
if ! command -v "$PY" >/dev/null; then
  echo "setup: python3 is required (apt-get install python3 python3-venv)" >&2
  exit 1
fi

apt_install() {
  local missing=()
  for pkg in "$@"; do
    dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  echo "setup: installing Debian packages: ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${missing[@]}" >/dev/null
}

if ! "$PY" -c "import venv, ensurepip" >/dev/null 2>&1; then
  apt_install python3-venv
fi
# a C compiler, Python's and zlib's headers build the C accelerators (optional:
# without them databus installs with the slower pure-Python paths)
if ! "$PY" -c "import os, sysconfig; raise SystemExit(not os.path.exists(os.path.join(sysconfig.get_paths()['include'], 'Python.h')))" \
    || ! command -v gcc >/dev/null || [ ! -f /usr/include/zlib.h ]; then
  command -v dpkg >/dev/null && apt_install gcc python3-dev zlib1g-dev || true
fi
if [ "${DATABUS_SETUP_SERVERS:-0}" = "1" ] && command -v dpkg >/dev/null; then
  # real database servers for the integration tests (started privately by fixtures)
  apt_install sqlite3 mariadb-server postgresql
  apt_install nftables  # silent packet drops in the fault tests (tests/support/faults.py)
  apt_install chromium  # the page in a real browser (tests/e2e/test_ui_page.py; Playwright drives it)
  dpkg -s prometheus >/dev/null 2>&1 || { [ "$(id -u)" -eq 0 ] || S=sudo; ${S:-} apt-get update -qq; DEBIAN_FRONTEND=noninteractive ${S:-} apt-get install -y -qq --no-install-recommends prometheus >/dev/null; }  # promtool + a private Prometheus: tests/integration/test_deploy_rules.py
fi
if [ "${DATABUS_SETUP_BENCH:-0}" = "1" ] && command -v dpkg >/dev/null; then
  # what only the benchmarks run: sysbench's oltp_write_only (bench/replicate_sysbench.py)
  apt_install sysbench
fi

if ! command -v java >/dev/null && command -v dpkg >/dev/null; then
  # the Spark tests (tests/spark, the `spark` extra) run PySpark, which needs Java 17
  apt_install openjdk-17-jre-headless
fi
if [ "${DATABUS_SETUP_SERVERS:-0}" = "1" ]; then
  # pinned Java bundles, every scripts/java/*.pom.xml (ZooKeeper, Kafka, Debezium, Delta,
  # Iceberg, spark-kafka: Spark's Kafka source for tests/spark/test_kafka_source.py):
  # fetched once into .cache/java, checked against scripts/java/*.sha256; a second run
  # fetches nothing
  if ! command -v mvn >/dev/null && command -v dpkg >/dev/null; then
    apt_install maven
  fi
  bash scripts/java/fetch.sh
fi

if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.databus-installed
# the C accelerators are rebuilt when their sources change
want=$(cat pyproject.toml setup.py src/databus/sources/mysql/_rowcodec.c src/databus/sources/mysql/_snaptext.c src/databus/sources/mysql/_binlogframes.c src/databus/buffer/_select.c src/databus/buffer/_newest.c src/databus/client/_wiredecode.c src/databus/sources/postgres/_pgcodec.c src/databus/core/_cenc.h | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
  .venv/bin/python -m pip install -q -e '.[dev]'
  echo "$want" > "$stamp"
fi
# the JVM reader of the Spark source (java/spark-source): javac against pyspark's jars,
# rebuilt when its sources change; without a JDK the Python source serves format("databus")
if command -v javac >/dev/null; then
  bash scripts/java/build-spark-source.sh
fi
if [ "${DATABUS_SETUP_SERVERS:-0}" = "1" ]; then
  # the newer Spark lines in venvs of their own: 4.2 (pyspark 4.2.1, Delta for 4.2, the JVM
  # reader built for it), .venv-spark42, and 4.3 (pyspark 4.3.0, no lakehouse format, the JVM
  # reader built for it), .venv-spark43: scripts/test-spark-line.sh,
  # tests/spark/test_spark_pipelines.py (4.2) and tests/spark/test_spark_scd2.py (4.3)
  bash scripts/spark-line.sh 4.2
  bash scripts/spark-line.sh 4.3
fi
