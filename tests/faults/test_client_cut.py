"""A client cut off silently from the relay it reads, one member of its URL list.

Two ``databus relay`` processes capture one MariaDB (the same binlog: the same windows
under the same SCNs); a client reads ``--relay URL1,URL2`` while a workload commits.
Every packet to and from URL1's port is dropped (no reset) while the client waits on
it, or those of one direction only (``to``: the requests; ``from``: the answers): the client gives up on it within its deadline (``poll_timeout + http_timeout``),
moves to URL2 with its checkpoint, and its history stays whole: exactly the committed
transactions, in order, each whole, at most the window in flight delivered again.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pymysql
import pytest
from pymysql.constants import CLIENT

from databus.client import ClientConfig, DatabusClient, FileCheckpointStore
from tests.support import faults
from tests.support.mariadb import MariaDB
from tests.support.mysql_workload import SCHEMA, Workload
from tests.support.pipeline import ProcessPipeline, http_url, relay_args
from tests.support.procs import free_port
from tests.support.recorder import Recorder
from tests.support.relay_cluster import writing
from tests.support.verify import check_delivery, read_windows

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("nft")]

POLL, HTTP = 1.0, 3.0  # the client's long poll and its HTTP deadline beyond it
MOVED = POLL + HTTP + 6.0  # seconds to read from the other relay: deadline plus slack



@dataclass
class TwoRelays(ProcessPipeline):
    tmp: Path
    server: MariaDB
    ports: tuple[int, int]

    def args(self, name: str) -> list[str]:
        port = self.ports[int(name[-1]) - 1]
        (self.tmp / name).mkdir(exist_ok=True)
        return relay_args(port, source=self.server.url, tables=r"shop\..*",
                          buffer_path=self.tmp / name / "relay.buf")

    def ready_url(self, name: str) -> str | None:
        return f"{http_url(self.ports[int(name[-1]) - 1])}/admin"


def _writer(server: MariaDB) -> Any:
    return pymysql.connect(unix_socket=str(server.socket), user="root", password="",
                           database="shop", charset="utf8mb4", autocommit=True,
                           client_flag=CLIENT.MULTI_STATEMENTS, connect_timeout=10)


# one asymmetric cut here (the relay's requests dropped), the other in test_mariadb_cut:
# each case costs about 20 s
@pytest.mark.parametrize("direction", ["both", "to"])
def test_a_client_cut_off_from_one_relay_moves_to_the_other(
        tmp_path: Path, direction: faults.Direction) -> None:
    server = MariaDB(tmp_path / "db")
    record = tmp_path / "recorded.jsonl"
    with server, TwoRelays(tmp_path, server, (free_port(), free_port())) as p:
        server.execute(*SCHEMA)
        p.start("r1")
        p.start("r2")
        p.wait("both relays' binlog dumps", lambda: server.binlog_dumps() >= 2, 60)
        url1, url2 = (http_url(port) for port in p.ports)
        client = DatabusClient(
            ClientConfig(relay=f"{url1},{url2}", poll_timeout=POLL, http_timeout=HTTP),
            Recorder(str(record)), FileCheckpointStore(tmp_path / "client.ckpt"))
        stop, errors = threading.Event(), []

        def consume() -> None:
            try:
                client.run(stop)
            except BaseException as exc:  # the thread's top: raised again below
                errors.append(exc)

        reader = threading.Thread(target=consume, daemon=True)
        reader.start()
        try:
            w = Workload(_writer(server), seed=83)
            with writing(w):
                p.wait("the client to read from the first relay",
                       lambda: len(read_windows(record)) >= 50, 60)
                with faults.cut(p.ports[0], direction):
                    t0 = time.monotonic()
                    seen = len(read_windows(record))
                    errors_before = client.stats.relay_errors
                    # the window being dispatched at the cut may still land: then more
                    p.wait("the client to read from the other relay",
                           lambda: len(read_windows(record)) > seen + 20, MOVED,
                           interval=0.05)
                    moved = time.monotonic() - t0
                    assert client.stats.relay_errors > errors_before  # it saw URL1 fail
                    time.sleep(2.0)  # reading from URL2 while URL1 stays cut
            total = sum(len(t) for t in w.committed)

            def delivered() -> bool:
                assert not errors, errors
                return sum(len(ev) for _, ev in {s: e for s, e in read_windows(record)}
                           .items()) >= total

            p.wait("the client to hold every committed change", delivered, 120,
                   interval=0.5)
        finally:
            stop.set()
            reader.join(HTTP + POLL + 10)
        assert not errors, errors
        stats = check_delivery(read_windows(record), w.committed, w.rolled_back)
        assert stats["repeated_windows"] <= 1, stats  # at most the window in flight
        print(f"client moved to the other relay {moved:.1f}s after a silent cut ({direction}) "
              f"(deadline {POLL + HTTP:g}s); {stats}")
