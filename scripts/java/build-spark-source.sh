#!/usr/bin/env bash
# Builds the JVM reader of the databus Spark source (java/spark-source) into
# .cache/java/spark-source/databus-spark-source.jar for the pinned Spark line (4.1), and
# into .cache/java/spark-source-<line>/ for another line (4.2: .venv-spark42, see
# scripts/spark-line.sh), under $DATABUS_JAVA_CACHE when set; the line is read from the
# spark-sql jar's version. Compiled with javac against pyspark's own jars: nothing is
# downloaded. Java sources under java/spark-source/src-<line> are compiled only for that
# line (what differs between lines: Line.java; a line without that directory is refused),
# src-changelog for the lines with Spark's changelog API (4.2 and later). Rebuilt only when the Java sources
# (or the pyspark version) change: the stamp file holds their hash.
# Usage: bash scripts/java/build-spark-source.sh [--print-hash]  (PYSPARK_JARS: pyspark's jars dir)
set -euo pipefail
cd "$(dirname "$0")/../.."

src=java/spark-source
jars=${PYSPARK_JARS:-$(.venv/bin/python -c "import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), 'jars'))")}
jars=$(cd "$jars" && pwd)
want=$( (cd "$src" && find src* resources -type f | LC_ALL=C sort | xargs sha256sum; ls "$jars" | grep '^spark-sql_') | sha256sum | cut -d' ' -f1)
if [ "${1:-}" = "--print-hash" ]; then
  echo "$want"
  exit 0
fi
sql=$(cd "$jars" && ls spark-sql_*.jar | head -1)
line=$(echo "$sql" | sed -E 's/^spark-sql_[0-9.]+-([0-9]+\.[0-9]+)\..*$/\1/')
dir=spark-source
[ "$line" = "4.1" ] || dir=spark-source-$line
out=${DATABUS_JAVA_CACHE:-.cache/java}/$dir
jar="$out/databus-spark-source.jar"
if [ ! -d "$src/src-$line" ]; then
  echo "build-spark-source: no $src/src-$line: Spark $line is not a line this reader knows" >&2
  exit 1
fi
mkdir -p "$out"
exec 9>"$out/.lock"
flock 9  # one build at a time (a test session and setup.sh may race)
if [ -f "$jar" ] && [ "$(cat "$out/stamp" 2>/dev/null)" = "$want" ]; then
  exit 0
fi
if ! command -v javac >/dev/null; then
  echo "build-spark-source: javac (a JDK 17) is required to build the JVM source" >&2
  exit 1
fi
build=$(mktemp -d)
trap 'rm -rf "$build"' EXIT
dirs=("$src/src" "$src/src-$line")
[ "$line" = "4.1" ] || dirs+=("$src/src-changelog")
javac -d "$build/classes" --release 17 -Xlint:all,-path -Werror -cp "$jars/*" \
  $(find "${dirs[@]}" -name '*.java' | LC_ALL=C sort)
cp -r "$src/resources/." "$build/classes/"
jar --create --file "$build/databus-spark-source.jar" -C "$build/classes" .
mv "$build/databus-spark-source.jar" "$jar"
echo "$want" > "$out/stamp"
echo "build-spark-source: built $jar"
