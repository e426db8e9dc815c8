"""The command line: relay without a config file, tail, and clear errors."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import httpx

from tests.support.procs import DATABUS, ROOT, free_port, running, wait_http
from tests.support.shop import Writer, create_shop
from tests.support.wait import wait_until


def _run(args: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*DATABUS, *args], capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT, check=False)


def _wait_snapshot_done(url: str, timeout: float = 30.0) -> None:
    """Until the relay's initial snapshot (the default mode) completed: later
    writes then arrive as changes, not as snapshot rows."""
    wait_until(lambda: "\ndatabus_relay_source_snapshot_completed_total 1.0"
               in httpx.get(f"{url}/metrics", timeout=10).text, timeout,
               "the initial snapshot to complete")


def test_relay_from_flags_and_tail_prints_envelopes(tmp_path: Path) -> None:
    db = tmp_path / "shop.db"
    create_shop(db)
    port = free_port()
    with running([*DATABUS, "relay", "--source", f"sqlite:///{db}", "--tables",
                   "customers,orders", "--port", str(port)], tmp_path / "relay.log") as relay:
        wait_http(f"http://127.0.0.1:{port}/admin", relay)
        _wait_snapshot_done(f"http://127.0.0.1:{port}")
        w = Writer(db, seed=2, rollback_ratio=0.0)
        for _ in range(5):
            w.transaction()
        w.close()
        want = [c for t in w.committed for c in t if c[0] != "items"]
        out = _run(["tail", "--relay", f"http://127.0.0.1:{port}", "--from-start",
                    "--max-windows", "1"])
        assert out.returncode == 0, out.stderr
        lines = [json.loads(x) for x in out.stdout.splitlines()]
        assert lines, "tail printed nothing"
        assert {x["source"]["table"] for x in lines} <= {"customers", "orders"}
        assert [(x["source"]["table"], x["op"]) for x in lines] == [
            (t, op) for t, op, _ in want[: len(lines)]]
        assert all(x["transaction"]["total_order"] >= 1 for x in lines)


def test_bad_config_and_unknown_table_fail_clearly(tmp_path: Path) -> None:
    bad = tmp_path / "relay.yaml"
    bad.write_text("source:\n  url: sqlite:///x.db\nbuffer:\n  capacity_bytes: 10\nbogus: 1\n")
    out = _run(["relay", "--config", str(bad)])
    assert out.returncode == 2
    assert "buffer.capacity_bytes" in out.stderr and "bogus" in out.stderr
    db = tmp_path / "shop.db"
    create_shop(db)
    out = _run(["relay", "--source", f"sqlite:///{db}", "--tables", "nope", "--port", "0"])
    assert out.returncode == 2 and "nope" in out.stderr
    out = _run(["tail", "--relay", "h:1", "--max-windows", "1"])  # a client config error
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.startswith("databus: ConfigError:") and "relay.url" in out.stderr
    out = _run(["tail", "--relay", "http://127.0.0.1:9", "--max-windows", "1", "--sources",
                "x"], timeout=120)
    assert out.returncode == 2, out.stderr  # gave up after its retries: terminal
    assert "RetriesExhausted" in out.stderr and "unreachable" in out.stderr


def test_demo_checks_the_replica(tmp_path: Path) -> None:
    out = _run(["demo", "--transactions", "40", "--quiet", "--workdir", str(tmp_path / "d")],
               timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "replica equals source" in out.stdout
