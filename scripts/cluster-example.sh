#!/usr/bin/env bash
# docs/cluster.md's example on one machine: a private ZooKeeper, a three-relay cluster
# on a SQLite shop, and a two-member `replicate --group` into one SQLite replica (each
# member applies its own partitions, with their checkpoint rows, into the same file). It writes for
# a while, kills the leader with -9, writes on, then checks the replica equals the
# source and prints the cluster's status. Needs `bash scripts/setup.sh` with
# DATABUS_SETUP_SERVERS=1 first (Java and the pinned ZooKeeper jars).
# Usage: bash scripts/cluster-example.sh [WORKDIR]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
WORK=${1:-$(mktemp -d /tmp/databus-cluster-XXXXXX)}
mkdir -p "$WORK"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
port() { $PY -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# 1. ZooKeeper (standalone, private data dir)
ZK=$(port)
java -cp "$($PY -c 'from databus.javadeps import classpath; print(classpath("zookeeper"))')" \
  org.apache.zookeeper.server.ZooKeeperServerMain "$ZK" "$WORK/zk" >"$WORK/zk.log" 2>&1 &
pids+=($!)
CLUSTER="zk://127.0.0.1:$ZK/shop"

# 2. a SQLite shop and a writer
$PY - "$WORK/shop.db" <<'EOF'
import sqlite3, sys
con = sqlite3.connect(sys.argv[1])
con.executescript("""
CREATE TABLE IF NOT EXISTS customers (id INTEGER PRIMARY KEY, name TEXT, balance REAL);
CREATE TABLE IF NOT EXISTS orders (id INTEGER PRIMARY KEY, customer_id INTEGER, amount REAL);
""")
con.commit()
EOF
write() {  # write N: N transactions, each a customer and an order
  $PY - "$WORK/shop.db" "$1" <<'EOF'
import random, sqlite3, sys, time
con = sqlite3.connect(sys.argv[1])
start = con.execute("SELECT coalesce(max(id), 0) FROM customers").fetchone()[0] + 1
for i in range(start, start + int(sys.argv[2])):
    with con:
        con.execute("INSERT INTO customers VALUES (?, ?, ?)", (i, f"c{i}", 0.0))
        con.execute("INSERT INTO orders VALUES (?, ?, ?)", (i, i, random.random() * 100))
        if i > 3:
            con.execute("UPDATE customers SET balance = balance + 1 WHERE id = ?", (i - 3,))
    time.sleep(0.002)
EOF
}
write 200

# 3. three relays in one cluster (the elected leader captures, the others follow it)
declare -A RELAY_PORT
for m in r1 r2 r3; do
  RELAY_PORT[$m]=$(port)
  $PY -m databus relay --cluster "$CLUSTER" --member-id "$m" \
    --source "sqlite:///$WORK/shop.db" --tables customers,orders \
    --buffer-path "$WORK/$m.buf" --port "${RELAY_PORT[$m]}" >"$WORK/$m.log" 2>&1 &
  pids+=($!)
  eval "PID_$m=$!"
done

# 4. a two-member client group sharing 8 partitions, reading the cluster address
for c in a b; do
  $PY -m databus replicate --relay "$CLUSTER" --target "sqlite:///$WORK/replica.db" \
    --sources main.customers,main.orders \
    --group "zk://127.0.0.1:$ZK/replicas" --group-partitions 8 --member-id "$c" \
    >"$WORK/replicate-$c.log" 2>&1 &
  pids+=($!)
done

leader() {
  $PY -m databus cluster status "$CLUSTER" --json 2>/dev/null \
    | $PY -c 'import json,sys; print((json.load(sys.stdin).get("leader") or {}).get("id",""))' \
    2>/dev/null || true
}
for _ in $(seq 120); do L=$(leader); [ -n "$L" ] && break; sleep 0.5; done
echo "leader: $L"
write 300

# 5. the leader dies; another member leads; the writer goes on
eval "victim=\$PID_$L"
kill -9 "$victim"
wait "$victim" 2>/dev/null || true  # reaped quietly (bash would report "Killed")
echo "killed $L with -9"
for _ in $(seq 120); do N=$(leader); [ -n "$N" ] && [ "$N" != "$L" ] && break; sleep 0.5; done
echo "new leader: $N"
write 300

# 6. the replica converges to the source
$PY - "$WORK/shop.db" "$WORK/replica.db" <<'EOF'
import sqlite3, sys, time
def rows(path, table):
    try:
        con = sqlite3.connect(path)
        return sorted(tuple(str(v) for v in r) for r in con.execute(f"SELECT * FROM {table}"))
    except sqlite3.OperationalError:
        return None
for _ in range(240):
    if all(rows(sys.argv[1], t) == rows(sys.argv[2], t) for t in ("customers", "orders")):
        print("replica equals the source:",
              {t: len(rows(sys.argv[1], t)) for t in ("customers", "orders")})
        break
    time.sleep(0.5)
else:
    sys.exit("the replica did not converge; logs in " + sys.argv[1].rsplit("/", 1)[0])
EOF
$PY -m databus cluster status "$CLUSTER"
echo "logs in $WORK"
