"""``databus relay --config FILE`` with options, as a user runs it: the options win over
the file (the issue's exact case: ``--port`` and ``--buffer-path`` were dropped), an
option that does not fit the file's source is refused, and SIGHUP's reload keeps the
options."""

from __future__ import annotations

import signal
import sqlite3
from pathlib import Path

import httpx
import yaml

from tests.support.procs import DATABUS, free_port, running, stop, wait_http
from tests.support.shop import create_shop
from tests.support.wait import wait_until


def test_options_given_with_a_config_file_win_and_are_kept_on_reload(tmp_path: Path) -> None:
    db = tmp_path / "shop.db"
    create_shop(db)
    file_port, port = free_port(), free_port()
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump({
        "source": {"url": f"sqlite:///{db}", "tables": ["customers"], "poll_interval": 0.02},
        "http": {"port": file_port}}))
    buf = tmp_path / "cfg.buf"
    with running([*DATABUS, "relay", "--config", str(cfg), "--port", str(port),
                  "--buffer-path", str(buf), "--tables", "customers,orders"],
                 tmp_path / "relay.log") as relay:
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/health", relay)
        assert buf.exists(), "--buffer-path dropped: the buffer is in memory"
        try:  # nobody listens on the file's port
            httpx.get(f"http://127.0.0.1:{file_port}/health", timeout=2)
            raise AssertionError("the relay listens on the file's port")
        except httpx.ConnectError:
            pass
        names = {s["name"] for s in httpx.get(f"{url}/sources", timeout=10).json()}
        assert names == {"main.customers", "main.orders"}  # --tables, not the file's
        # SIGHUP reads the file again, with the options over it: orders stays captured
        relay.send_signal(signal.SIGHUP)
        log = tmp_path / "relay.log"
        wait_until(lambda: "config read again" in log.read_text()
                   or "config not reloaded" in log.read_text(), 30, "the reload")
        assert "the source's is unchanged" in log.read_text()
        with sqlite3.connect(db) as con:
            con.execute("INSERT INTO orders (id, customer_id, tx) VALUES (1, 1, 0)")
        wait_until(lambda: httpx.get(f"{url}/containerStats/buffer/max_scn",
                                     timeout=10).json() >= 1, 30, "the order captured")
        stop(relay)
        assert relay.returncode == 0
        # every state file is named after this relay's derived name, none 'relay.*'
        state = sorted(p.name for p in tmp_path.glob("*.json"))
        assert state and all(n.startswith("cfg-") for n in state), state
        assert "config not reloaded" not in (tmp_path / "relay.log").read_text()


def test_an_option_that_does_not_fit_the_files_source_is_refused(tmp_path: Path) -> None:
    import subprocess

    db = tmp_path / "shop.db"
    create_shop(db)
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump({"source": {"url": f"sqlite:///{db}"}}))
    done = subprocess.run([*DATABUS, "relay", "--config", str(cfg), "--slot", "s1"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    assert done.stderr.startswith("databus: ConfigError:")
    assert "slot is a setting of PostgreSQL sources only" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
