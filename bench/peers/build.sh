#!/usr/bin/env bash
# Compiles the Debezium harness (bench/peers/DebeziumHarness.java) against the pinned
# bundle scripts/java/debezium.pom.xml into .cache/peers/classes. Fetches the bundle
# first (bash scripts/java/fetch.sh debezium: nothing is fetched when it is cached).
# Prints the classpath to run it with:
#   java -cp "$(bash bench/peers/build.sh)" DebeziumHarness --port P ...
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bash "$root/scripts/java/fetch.sh" debezium >&2
jars="${DATABUS_JAVA_CACHE:-$root/.cache/java}/debezium"
out="$root/.cache/peers/classes"
src="$root/bench/peers/DebeziumHarness.java"
cp="$jars/*"
if [ ! -f "$out/DebeziumHarness.class" ] || [ "$src" -nt "$out/DebeziumHarness.class" ]; then
  mkdir -p "$out"
  javac -nowarn --release 17 -cp "$cp" -d "$out" "$src" >&2
fi
echo "$out:$cp"
