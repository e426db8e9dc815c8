"""Bootstrap service helpers for tests: an in-process bootstrap service on a SQLite store,
preloaded shop rows, a consumer that replicates, and replica checks.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

from databus.bootstrap.config import parse_config
from databus.bootstrap.service import BootstrapService
from databus.client import ClientConfig, DatabusClient
from databus.client.sinks import ReplicateSink
from databus.core.checkpoint import ConsumptionMode
from databus.relay.relay import Relay
from tests.support.shop import TABLES, table_rows
from tests.support.wait import wait_until


def rows(path: Path, table: str) -> list[tuple[object, ...]]:
    """A table's rows; a table the replica never needed (no rows yet) counts as empty."""
    try:
        return table_rows(path, table)
    except sqlite3.OperationalError as exc:
        if "no such table" in str(exc):
            return []
        raise


def replica_equal(db: Path, replica: Path) -> bool:
    if not replica.exists():
        return False
    return all(rows(db, t) == rows(replica, t) for t in TABLES)


def bootstrap_config(db: Path, tmp: Path, relay: Relay, initial: bool = True,
                     store_url: str | None = None, token_file: Path | None = None,
                     relay_token_file: Path | None = None) -> dict[str, object]:
    """The config mapping of :func:`make_bootstrap` (to change fields before building)."""
    http: dict[str, object] = {"port": 0}
    if token_file is not None:
        http["token_file"] = str(token_file)
    raw: dict[str, object] = {
        "relay": relay.url, "store": {"url": store_url or f"sqlite:///{tmp / 'bs.db'}"},
        "http": http, "poll_timeout": 0.5, "apply_interval": 0.05,
        "progress_interval": 0.5}
    if relay_token_file is not None:
        raw["relay"] = {"url": relay.url, "token_file": str(relay_token_file)}
    if initial:
        raw["initial_load"] = {"url": f"sqlite:///{db}", "tables": TABLES}
    return raw


def make_bootstrap(db: Path, tmp: Path, relay: Relay, initial: bool = True,
                   store_url: str | None = None,
                   token_file: Path | None = None,
                   relay_token_file: Path | None = None) -> BootstrapService:
    """A bootstrap service (not started) of ``relay``; with ``token_file`` its server
    needs tokens; ``relay_token_file``: the producer's token for the relay."""
    return BootstrapService(parse_config(bootstrap_config(
        db, tmp, relay, initial, store_url, token_file, relay_token_file)))


class Consumer:
    """A replicate sink on its own thread."""

    def __init__(self, relay: Relay, bs: BootstrapService | None, replica: Path,
                 batch: int = 1000) -> None:
        self.sink = ReplicateSink(f"sqlite:///{replica}")
        cfg = ClientConfig(relay=relay.url, poll_timeout=0.3, backoff_initial=0.05,
                           backoff_max=0.5, bootstrap_batch_size=batch,
                           bootstrap_url=bs.url if bs is not None else None)
        self.client = DatabusClient(cfg, self.sink, self.sink)
        self.error: BaseException | None = None
        # a daemon: a failed test must not keep the interpreter alive
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.client.run()
        except BaseException as exc:
            self.error = exc

    def stop(self) -> None:
        self.client.stop()
        self.thread.join(30)
        self.sink.close()


def wait_equal(db: Path, replica: Path, consumers: list[Consumer], timeout: float = 120) -> None:
    def equal_and_online() -> bool:
        for c in consumers:
            assert c.error is None, f"consumer failed: {c.error!r}"
        # equal first, then online (a new consumer's flexible checkpoint is online too,
        # before its bootstrap starts)
        return replica_equal(db, replica) and all(
            c.client.persisted.consumption_mode == ConsumptionMode.ONLINE_CONSUMPTION
            and not c.client.persisted.is_flexible for c in consumers)

    wait_until(equal_and_online, timeout, "the replica to equal the source", interval=0.2)


def preload(db: Path, n: int) -> None:
    con = sqlite3.connect(db)
    con.executemany("INSERT INTO customers VALUES (?,?,?,?)",
                    [(i, f"old-{i}", i * 0.5, 0) for i in range(1, n + 1)])
    con.executemany("INSERT INTO items VALUES (?,?,?,?,?)",
                    [(i, 1, f"old-sku-{i}", i % 7, 0) for i in range(1, n // 2)])
    con.commit()
    con.close()
