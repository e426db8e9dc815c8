"""A dynamic client group on ZooKeeper: recorder processes join ``--group zk://...``
and share six partitions of a relay's stream while a writer commits. Members are
started and killed -9 at random ten times. At the end the union of what members
recorded is exactly what was committed (per key, in commit order, nothing lost,
repeats only of whole windows), and no partition was run by two members at once:
each recorded window carries its partition's owner and epoch, and a partition's
epochs never go back in the order windows were recorded. The members' listeners log
each assignment and revocation in the same file: no member recorded a window of a
partition it had not been told it holds."""

from __future__ import annotations

import json
import random
import signal
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tests.support.pipeline import (
    RelayPipeline,
    recorder_args,
    relay_args,
    relay_max_scn,
    replicate_args,
)
from tests.support.postgres import PostgreSQL
from tests.support.procs import free_port, spawn
from tests.support.shop import (
    TABLES,
    Change,
    Writer,
    as_text,
    create_shop,
    table_rows,
    target_rows,
    txlog_max,
)
from tests.support.writers import Repeating
from tests.support.zookeeper import ZooKeeper

PARTITIONS = 6
SOURCES = ",".join(f"main.{t}" for t in TABLES)


@dataclass
class Group(RelayPipeline):
    tmp: Path
    db: Path
    zk: ZooKeeper
    port: int = field(default_factory=free_port)

    def args(self, name: str) -> list[str]:
        if name == "relay":
            return relay_args(self.port, source=f"sqlite:///{self.db}", tables=",".join(TABLES),
                              buffer_path=self.tmp / "relay.buf")
        return recorder_args(self.url, self.record, self.tmp / "ckpt",
                             "--group", f"zk://{self.zk.hosts}/churn",
                             "--partitions", str(PARTITIONS), "--member-id", name,
                             "--sources", SOURCES)


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().split("\n")[:-1]]


def _windows(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [rec for rec in lines if "scn" in rec]


def _check_callbacks(lines: list[dict[str, Any]]) -> int:
    """Every window a member recorded is of a partition it had been told was assigned
    to it and not yet revoked (the listener's lines share the file, in time order)."""
    held: dict[str, set[int]] = defaultdict(set)
    told = 0
    for rec in lines:
        if "joined" in rec:
            held[rec["member"]] = set()
        elif "assigned" in rec:
            held[rec["member"]] |= set(rec["assigned"])
            told += 1
        elif "revoked" in rec:
            held[rec["member"]] -= set(rec["revoked"])
            told += 1
        else:
            assert rec["p"] in held[rec["owner"]], \
                f"{rec['owner']} recorded partition {rec['p']} without holding it: {rec}"
    return told


def _check(lines: list[dict[str, Any]], committed: list[list[Change]]) -> dict[str, int]:
    told = _check_callbacks(lines)
    by_p: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for rec in _windows(lines):
        by_p[rec["p"]].append(rec)
    got: dict[Change, list[str]] = defaultdict(list)
    key_part: dict[tuple[str, str], int] = {}
    repeats = owners = 0
    for p, recs in by_p.items():
        epochs = [r["epoch"] for r in recs]
        assert epochs == sorted(epochs), f"partition {p}: an old owner recorded after a new one"
        owners += len({(r["owner"], r["epoch"]) for r in recs})
        first: dict[int, list[Any]] = {}
        for r in recs:
            if r["scn"] in first:
                assert first[r["scn"]] == r["events"], f"partition {p}: window {r['scn']} differs"
                repeats += 1
                continue
            assert not first or r["scn"] > max(first), f"partition {p}: {r['scn']} out of order"
            first[r["scn"]] = r["events"]
            for table, op, key in r["events"]:
                assert key_part.setdefault((table, key), p) == p, "a key in two partitions"
                got[(table, "", key)].append(op)
    want: dict[Change, list[str]] = defaultdict(list)
    for tx in committed:
        for table, op, key in tx:
            want[(table, "", key)].append(op)
    assert got == want, "the members' union differs from what was committed"
    return {"partitions": len(by_p), "owner_epochs": owners, "repeated_windows": repeats,
            "callbacks": told}


@pytest.mark.slow
def test_group_churn_ten_times_under_writes(tmp_path: Path, zookeeper: ZooKeeper) -> None:
    db = tmp_path / "shop.db"
    create_shop(db)
    rng = random.Random(11)
    with Writer(db, seed=47, rollback_ratio=0.1) as w, Group(tmp_path, db, zookeeper) as g:
        g.start("relay")
        names = ["a", "b", "c"]
        for n in names:
            g.start(n)
        next_name = 0
        with Repeating(w.transaction, 0.01):
            for _ in range(10):
                time.sleep(rng.uniform(0.5, 2.0))
                live = [n for n in g.procs if n != "relay"]
                if len(live) > 1 and rng.random() < 0.6:
                    victim = rng.choice(live)
                    g.kill(victim)
                    del g.procs[victim]
                else:
                    next_name += 1
                    g.start(f"n{next_name}")
            time.sleep(1.0)
        last = txlog_max(db)
        top = g.wait("the relay to hold the last commit",
                     lambda: (t := relay_max_scn(g.url)) >= last and t, 60)

        def recorded_all() -> bool:
            scns = defaultdict(int)
            for rec in _windows(_lines(g.record)):
                scns[rec["p"]] = max(scns[rec["p"]], rec["scn"])
            return len(scns) == PARTITIONS and min(scns.values()) >= top

        g.wait("every partition to record the last window", recorded_all, 120, interval=0.5)
        stats = _check(_lines(g.record), w.committed)
        print(f"group churn: {stats}")
        assert stats["owner_epochs"] > PARTITIONS  # ownership moved
        # every member that started was told its partitions; rebalances revoked some
        assert stats["callbacks"] > len(names) + next_name, stats


@pytest.mark.slow
def test_replicate_group_into_postgresql(tmp_path: Path, zookeeper: ZooKeeper,
                                         postgres: PostgreSQL) -> None:
    """``databus replicate --group``: two members, one killed -9 and a third started
    under writes; the target ends equal to the source, one checkpoint row per
    partition."""
    db = tmp_path / "shop.db"
    create_shop(db)
    with postgres.fresh_database("databus_group") as target, Writer(db, seed=53) as w, \
            Group(tmp_path, db, zookeeper) as g:
        engine = sa.create_engine(target)

        def member(name: str) -> list[str]:
            return replicate_args(g.url, target, "--sources", SOURCES,
                                  "--group", f"zk://{zookeeper.hosts}/rg",
                                  "--group-partitions", "4", "--member-id", name)

        g.start("relay")
        w.transaction()
        g.procs["r1"] = spawn(member("r1"), g.log("r1"))
        g.wait("the first member to create the tables", lambda: all(
            sa.inspect(engine).has_table(t) for t in TABLES), 60)
        g.procs["r2"] = spawn(member("r2"), g.log("r2"))

        def runs(name: str) -> bool:
            return "runs partitions" in g.log(name).read_text()

        with Repeating(w.transaction, 0.005):
            g.wait("the second member to run partitions", lambda: runs("r2"), 60)
            g.kill("r1")
            del g.procs["r1"]
            g.procs["r3"] = spawn(member("r3"), g.log("r3"))
            g.wait("the third member to run partitions", lambda: runs("r3"), 60)

        def equal() -> bool:
            return all(set(target_rows(engine, t)) == {as_text(r) for r in table_rows(db, t)}
                       for t in TABLES)

        g.wait("the target to equal the source", equal, 120, interval=1.0)
        with engine.connect() as con:
            names = sorted(r[0] for r in con.execute(sa.text(
                "SELECT name FROM databus_checkpoint")))
        assert names == [f"replicate-rg-p{p}" for p in range(4)], names
        engine.dispose()


def test_a_member_stops_on_sigterm_while_zookeeper_is_gone(tmp_path: Path) -> None:
    """Its owner nodes are ephemeral: with ZooKeeper unreachable a member asked to stop
    lets them go with its session instead of waiting to delete them (it used to wait
    for ever)."""
    db = tmp_path / "shop.db"
    create_shop(db)
    with ZooKeeper() as zk, Writer(db, seed=3) as w, \
            Group(tmp_path, db, zk) as g:
        g.start("relay")
        w.transaction()
        replica = tmp_path / "replica.db"
        log = g.log("member")
        g.procs["member"] = spawn(
            replicate_args(g.url, f"sqlite:///{replica}", "--sources", SOURCES,
                           "--group", f"zk://{zk.hosts}/stopping", "--group-partitions", "4",
                           "--member-id", "m"), log)
        g.wait("the member to run its partitions", lambda: "runs partitions" in
               log.read_text(), 60)
        zk.stop()
        time.sleep(1.0)
        proc = g.procs.pop("member")
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
        assert code == 0, log.read_text()[-2000:]
        assert time.monotonic() - t0 < 30
