#!/usr/bin/env bash
# Fetches the pinned Java bundles (scripts/java/<bundle>.pom.xml) into the ignored
# cache .cache/java/<bundle>/ with Maven, once: a bundle whose jars are all present
# and match scripts/java/<bundle>.sha256 is left alone (nothing is fetched).
# Tests and databus find the jars through databus.javadeps.classpath(bundle)
# (spark-kafka: put on spark.jars by tests/support/kafka.spark_kafka_jars);
# nothing downloads at test time. Adding a bundle: a new <bundle>.pom.xml with
# pinned versions; the first fetch writes its .sha256 (commit it).
# Usage: bash scripts/java/fetch.sh [bundle ...]   (default: every bundle)
set -euo pipefail
cd "$(dirname "$0")"
here=$PWD
cache=${DATABUS_JAVA_CACHE:-$(cd ../.. && pwd)/.cache/java}
mkdir -p "$cache"
bundles=("$@")
if [ ${#bundles[@]} -eq 0 ]; then
  for pom in *.pom.xml; do bundles+=("${pom%.pom.xml}"); done
fi

for b in "${bundles[@]}"; do
  lock="$here/$b.sha256"
  dest="$cache/$b"
  if [ -f "$lock" ] && [ -d "$dest" ] \
      && [ "$(ls "$dest" | sort)" = "$(awk '{print $2}' "$lock" | sort)" ] \
      && (cd "$dest" && sha256sum --quiet -c "$lock" >/dev/null 2>&1); then
    continue  # cached and verified
  fi
  command -v mvn >/dev/null || { echo "setup: Maven (mvn) is needed to fetch $b" >&2; exit 1; }
  echo "setup: fetching Java bundle $b (Maven Central)"
  tmp=$(mktemp -d "$cache/.$b.XXXXXX")
  mvn -q -B -f "$here/$b.pom.xml" \
    org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy-dependencies \
    -DoutputDirectory="$tmp" -DincludeScope=runtime
  if [ -f "$lock" ]; then
    if ! (cd "$tmp" && [ "$(ls | sort)" = "$(awk '{print $2}' "$lock" | sort)" ] \
          && sha256sum --quiet -c "$lock"); then
      echo "setup: Java bundle $b does not match $lock (refusing it)" >&2
      rm -rf "$tmp"
      exit 1
    fi
  else
    (cd "$tmp" && sha256sum -- * | sed 's/\*//') > "$lock"
    echo "setup: pinned $b: wrote $lock (commit it)"
  fi
  rm -rf "$dest"
  mv "$tmp" "$dest"
done
