"""A relay restarted without its history never answers an old checkpoint across a gap
(issue 13, item 1), and one that recorded its position resumes from it.

MariaDB source, ``databus relay`` processes with the default memory buffer: a consumer
reads to SCN S and stops; the relay stops; rows are deleted and updated; the relay
starts again with the same command on the same port; the consumer asks ``/stream``
from S.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from databus.client import ClientConfig, Consumer, DatabusClient, MemoryCheckpointStore
from databus.core.checkpoint import Checkpoint
from databus.core.errors import ScnNotFoundError
from tests.support.mariadb import MariaDB
from tests.support.procs import DATABUS, free_port, spawn, stop, wait_http
from tests.support.wait import wait_until


def _stream(url: str, scn: int | None) -> httpx.Response:
    params = {"output": "json", "size": str(8 << 20), "timeout": "0"}
    if scn is not None:
        params["checkPoint"] = json.dumps({"windowScn": scn, "windowOffset": -1,
                                           "consumption_mode": "ONLINE_CONSUMPTION"})
    return httpx.get(f"{url}/stream", params=params, timeout=30)


def _read_all(url: str, scn: int | None = None) -> tuple[list[dict[str, object]], int]:
    """Every envelope the relay holds after ``scn`` (None: from its oldest window) and
    the last window SCN read."""
    out: list[dict[str, object]] = []
    cp = scn
    while True:
        r = _stream(url, cp)
        assert r.status_code == 200, r.text
        if not r.text:
            return out, -1 if cp is None else cp
        lines = [json.loads(x) for x in r.text.splitlines()]
        out += [e for e in lines if "op" in e]  # data events, not the eop lines
        cp = int(r.headers["X-Databus-Last-Window-Scn"])


class _Relay:
    def __init__(self, args: list[str], url: str, log: Path) -> None:
        self.args, self.url, self.log = args, url, log
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> _Relay:
        self.proc = spawn(self.args, self.log)
        wait_http(f"{self.url}/admin", self.proc)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.proc is not None
        stop(self.proc)


@pytest.fixture
def schema(mariadb: MariaDB) -> Iterator[str]:
    name = f"gap_{uuid.uuid4().hex[:8]}"
    mariadb.execute(f"CREATE DATABASE {name}",
                    f"CREATE TABLE {name}.t (id INT PRIMARY KEY, v VARCHAR(20))",
                    f"INSERT INTO {name}.t SELECT seq, 'v0' FROM {name}.seq_1_to_20")
    yield name
    mariadb.execute(f"DROP DATABASE {name}")


def _consume_then_change(mariadb: MariaDB, schema: str, relay: _Relay) -> int:
    """Reads the snapshot, then three updates; returns the last window SCN read."""
    def count(op: str, n: int) -> bool:
        return sum(1 for e in _read_all(relay.url)[0] if e["op"] == op) == n

    wait_until(lambda: count("r", 20), 60, "the relay's snapshot of 20 rows")
    mariadb.execute(f"UPDATE {schema}.t SET v = 'v1' WHERE id <= 3")
    wait_until(lambda: count("u", 3), 60, "three updates at the relay")
    return _read_all(relay.url)[1]


def _change_while_down(mariadb: MariaDB, schema: str) -> None:
    mariadb.execute(f"DELETE FROM {schema}.t WHERE id > 15",
                    f"UPDATE {schema}.t SET v = 'gap' WHERE id BETWEEN 6 AND 10")


def test_restarted_memory_relay_refuses_an_old_checkpoint(mariadb: MariaDB, schema: str,
                                                          tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    args = [*DATABUS, "relay", "--source", mariadb.url, "--tables", rf"{schema}\..*",
            "--port", str(port)]
    with _Relay(args, url, tmp_path / "relay1.log") as relay:
        s = _consume_then_change(mariadb, schema, relay)
    _change_while_down(mariadb, schema)
    with _Relay(args, url, tmp_path / "relay2.log") as relay:
        # the new relay snapshots again; once it holds windows it must refuse S
        wait_until(lambda: _read_all(relay.url)[0], 60, "the restarted relay's snapshot")
        r = _stream(relay.url, s)
        assert r.status_code == 410, r.text
        body = r.json()
        assert body["error"] == "ScnNotFound" and str(s) in body["message"]
        admin = httpx.get(f"{relay.url}/admin", timeout=10).json()
        assert "without a recorded position" in json.dumps(admin)
        # the client library fails loudly (no bootstrap configured), never jumps
        store = MemoryCheckpointStore()
        store.save(Checkpoint.after(s))
        got: list[object] = []

        class Recorder(Consumer):
            def on_data_event(self, event: object) -> None:
                got.append(event)

        client = DatabusClient(ClientConfig(relay=relay.url), Recorder(), store)
        with pytest.raises(ScnNotFoundError):
            client.run()
        assert got == []


def test_relay_with_recorded_position_resumes_and_delivers_the_gap(
        mariadb: MariaDB, schema: str, tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cfg = tmp_path / "relay.yaml"
    cfg.write_text(yaml.safe_dump({
        "source": {"url": mariadb.url, "tables": [rf"{schema}\..*"]},
        "http": {"port": port}, "state_dir": str(tmp_path / "state"),
        "buffer": {"flush_interval": 0.2}}))
    args = [*DATABUS, "relay", "--config", str(cfg)]
    with _Relay(args, url, tmp_path / "relay1.log") as relay:
        s = _consume_then_change(mariadb, schema, relay)
    _change_while_down(mariadb, schema)
    with _Relay(args, url, tmp_path / "relay2.log") as relay:
        def the_gap() -> list[dict[str, object]]:
            r = _stream(relay.url, s)
            if r.status_code == 409 and r.json()["error"] == "ScnAhead":
                return []  # still re-reading up to S: a transient answer, never a jump
            assert r.status_code == 200, r.text  # the relay proves continuity from S
            events = [e for e in map(json.loads, r.text.splitlines()) if "op" in e]
            return events if sum(1 for e in events if e["op"] in ("d", "u")) >= 10 else []

        events = wait_until(the_gap, 60, "the deletes and updates made while the relay was down")
    # first what changed while the relay was down, in commit order; the relay resumed
    # after its floor (the first window of its snapshot), so the snapshot it had not
    # finished proving may follow again (at least once), never a jump over the gap
    gap = [(e["op"], (e["after"] or e["before"])["id"], (e["after"] or {}).get("v"))  # type: ignore[index,union-attr]
           for e in events[:10]]
    assert gap == [("d", i, None) for i in range(16, 21)] + [("u", i, "gap") for i in range(6, 11)]
