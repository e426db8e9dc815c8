#!/usr/bin/env bash
# Sets up a virtualenv for a newer Spark line (4.2, 4.3) beside the pinned one
# (.venv keeps pyspark 4.1, the line Iceberg's runtime supports; see docs/spark.md,
# "Spark lines"). The venv gets databus (editable, this checkout) with every runtime and
# test dependency of the `dev` extra except pyspark, which is the line's own; then the
# line's Java bundles (scripts/java/<bundle>-<line>.pom.xml, pinned by their .sha256) and
# the JVM reader compiled against that pyspark's jars into .cache/java/spark-source-<line>.
# Everything comes from PyPI and Maven Central once; the tests run offline after.
# Idempotent: a second run with nothing changed installs and fetches nothing.
# Usage: bash scripts/spark-line.sh [LINE]        (LINE: 4.2, the default, or 4.3)
set -euo pipefail
cd "$(dirname "$0")/.."

line=${1:-4.2}
case "$line" in
  4.2) pyspark_pin="pyspark==4.2.1"; bundles=(delta-4.2 spark-test-4.2) ;;
  # no Delta or Iceberg for 4.3 (docs/spark.md, "Spark lines"): its pipelines only
  4.3) pyspark_pin="pyspark==4.3.0"; bundles=(spark-test-4.3) ;;
  *) echo "spark-line: unknown Spark line '$line' (known: 4.2, 4.3)" >&2; exit 1 ;;
esac
venv=.venv-spark${line/./}
PY=${PYTHON:-python3}

if [ ! -x "$venv/bin/python" ]; then
  "$PY" -m venv "$venv"
fi
stamp="$venv/.databus-installed"
want=$( (cat pyproject.toml setup.py; echo "$pyspark_pin") | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  # the dev extra's requirements with the pinned pyspark replaced by the line's; Spark
  # Connect's client libraries (pipelines run on Spark Connect) come with pyspark[connect]
  reqs=$("$PY" - "$pyspark_pin" <<'EOF'
import sys, tomllib
meta = tomllib.load(open("pyproject.toml", "rb"))["project"]
extras = meta["optional-dependencies"]
out, seen = list(meta["dependencies"]), set()
def walk(name):
    if name in seen:
        return
    seen.add(name)
    for req in extras[name]:
        if req.startswith("databus["):
            walk(req[len("databus["):-1])
        elif not req.startswith("pyspark"):
            out.append(req)
walk("dev")
out.append(sys.argv[1].replace("pyspark", "pyspark[connect,pipelines]", 1))
print("\n".join(out))
EOF
)
  "$venv/bin/python" -m pip install -q --upgrade pip >/dev/null
  printf '%s\n' "$reqs" > "$venv/requirements.txt"
  "$venv/bin/python" -m pip install -q -r "$venv/requirements.txt"
  "$venv/bin/python" -m pip install -q --no-deps -e .
  echo "$want" > "$stamp"
fi
# the C accelerators: the ones built in place for .venv serve this venv too (same Python)
bash scripts/java/fetch.sh "${bundles[@]}"
if command -v javac >/dev/null; then
  jars=$("$venv/bin/python" -c "import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), 'jars'))")
  PYSPARK_JARS=$jars bash scripts/java/build-spark-source.sh
  # the suite's in-memory AUTO CDC target (tests/spark/test_spark_pipelines.py), rebuilt
  # when its source or the jars it is compiled against change (-overrides: the parent's
  # Scala varargs methods warn under javac)
  out=${DATABUS_JAVA_CACHE:-.cache/java}/spark-test-catalog-$line
  testjar=${DATABUS_JAVA_CACHE:-.cache/java}/spark-test-$line
  want=$( (find tests/spark/java -type f | LC_ALL=C sort | xargs sha256sum; ls "$jars" "$testjar") \
         | sha256sum | cut -d' ' -f1)
  if [ ! -f "$out/databus-test-catalog.jar" ] || [ "$(cat "$out/stamp" 2>/dev/null)" != "$want" ]; then
    build=$(mktemp -d)
    javac -d "$build" --release 17 -Xlint:all,-path,-overrides -Werror -cp "$jars/*:$testjar/*" \
      $(find tests/spark/java -name '*.java' | LC_ALL=C sort)
    mkdir -p "$out"
    jar --create --file "$out/databus-test-catalog.jar" -C "$build" .
    rm -rf "$build"
    echo "$want" > "$out/stamp"
    echo "spark-line: built $out/databus-test-catalog.jar"
  fi
fi
