"""A static client cluster: ``databus replicate --partitions MOD:3 --member I`` as three
processes (no coordinator) share a relay's keys. Under a writer, with one member
killed -9 and restarted, the target ends equal to the source; each member kept its
own checkpoint row and applied only its bucket's keys."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from databus.core import event as ev
from databus.core.filters import key_hash
from tests.support.pipeline import ProcessPipeline
from tests.support.postgres import PostgreSQL
from tests.support.procs import DATABUS, free_port
from tests.support.shop import TABLES, Writer, as_text, create_shop, table_rows, target_rows

N = 3
SOURCES = ",".join(f"main.{t}" for t in TABLES)


class Members(ProcessPipeline):
    def __init__(self, tmp: Path, db: Path, target: str) -> None:
        self.tmp, self.db, self.target = tmp, db, target
        self.port = free_port()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def args(self, name: str) -> list[str]:
        if name == "relay":
            return [*DATABUS, "relay", "--source", f"sqlite:///{self.db}", "--tables",
                    ",".join(TABLES), "--snapshot-mode", "no_data", "--port", str(self.port),
                    "--buffer-path", str(self.tmp / "relay.buf")]
        member = name.removeprefix("member")
        return [*DATABUS, "replicate", "--relay", self.url, "--target", self.target,
                "--sources", SOURCES, "--partitions", f"MOD:{N}", "--member", member]

    def ready_url(self, name: str) -> str | None:
        return f"{self.url}/admin" if name == "relay" else None


def _checkpoints(engine: sa.Engine) -> dict[str, str]:
    try:
        with engine.connect() as con:
            return {r[0]: r[1] for r in con.execute(sa.text(
                "SELECT name, checkpoint FROM databus_checkpoint"))}
    except sa.exc.ProgrammingError:
        return {}


@pytest.mark.slow
def test_three_static_members_share_the_keys(tmp_path: Path, postgres: PostgreSQL) -> None:
    db = tmp_path / "shop.db"
    create_shop(db)
    with postgres.fresh_database("databus_static") as target, Writer(db, seed=43) as w, \
            Members(tmp_path, db, target) as p:
        engine = sa.create_engine(target)
        p.start("relay")
        w.transaction()
        p.start("member0")  # creates the target tables; then the others
        p.wait("member 0's first window", lambda: "replicate-mod3-0" in _checkpoints(engine),
               60)
        for i in range(1, N):
            p.start(f"member{i}")
        done = threading.Event()

        def write() -> None:
            while not done.is_set():
                w.transaction()
                done.wait(0.005)

        writer = threading.Thread(target=write)
        writer.start()
        try:
            time.sleep(2.0)
            p.kill("member1")
            time.sleep(1.0)
            p.start("member1")  # resumes from its own checkpoint row
            time.sleep(2.0)
        finally:
            done.set()
            writer.join(30)
        top = int(httpx.get(f"{p.url}/containerStats/buffer/max_scn", timeout=10).json())

        diff: list[str] = []

        def equal() -> bool:
            diff.clear()
            for t in TABLES:
                # the target's keys are text: compare as sets (keys are unique)
                got = set(target_rows(engine, t))
                want = {as_text(r) for r in table_rows(db, t)}
                if got != want:
                    extra, missing = got - want, want - got
                    diff.append(f"{t}: {len(got)} rows, want {len(want)}; extra"
                                f" {sorted(extra, key=str)[:3]}, missing"
                                f" {sorted(missing, key=str)[:3]}")
            return not diff

        try:
            p.wait("the target to equal the source", equal, 60, interval=1.0)
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {diff}") from None
        names = _checkpoints(engine)
        assert sorted(names) == [f"replicate-mod3-{i}" for i in range(N)], names
        # each member applied only its keys: its log says what it consumed, the filter
        # said which bucket; the relay's answer for a bucket holds only its keys
        for i in range(N):
            r = httpx.get(f"{p.url}/stream", params={
                "size": str(64 << 20), "timeout": "0", "filters": _bucket_filter(p.url, i)},
                timeout=30)
            keys = [e.key for e in ev.iter_events(r.content) if not e.is_control]
            assert keys and all(abs(key_hash(k)) % N == i for k in keys), i
        assert top > 0
        engine.dispose()
        with sqlite3.connect(db) as con:
            assert con.execute("SELECT count(*) FROM customers").fetchone()[0] > 0


def _bucket_filter(url: str, member: int) -> str:
    import json

    ids = [s["id"] for s in httpx.get(f"{url}/sources", timeout=10).json()]
    return json.dumps({str(i): {"partitionType": "MOD", "filters": [
        {"numBuckets": N, "bktRange": {"start": member, "end": member + 1}}]} for i in ids})

