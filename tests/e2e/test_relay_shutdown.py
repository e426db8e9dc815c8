"""SIGTERM stops a ``databus relay`` cleanly while a consumer's long poll is open
(issue 13, "also found"): the poll is answered, no traceback, exit status 0."""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import httpx

from tests.support.procs import DATABUS, free_port, kill9, spawn, wait_http
from tests.support.shop import TABLES


def test_sigterm_with_a_long_poll_open_exits_0_without_a_traceback(shop_db: Path,
                                                                   tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "relay.log"
    proc = spawn([*DATABUS, "relay", "--source", f"sqlite:///{shop_db}", "--tables",
                  ",".join(TABLES), "--snapshot-mode", "no_data", "--port", str(port)], log)
    try:
        wait_http(f"{url}/admin", proc)
        answers: list[int | str] = []

        def long_poll() -> None:
            cp = json.dumps({"windowScn": -1, "windowOffset": -1})
            try:
                r = httpx.get(f"{url}/stream", params={"checkPoint": cp, "timeout": "30"},
                              timeout=40)
                answers.append(r.status_code)
            except httpx.HTTPError as exc:
                answers.append(type(exc).__name__)

        poller = threading.Thread(target=long_poll)
        poller.start()
        time.sleep(1.0)  # the poll is waiting at the relay
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
        poller.join(15)
        assert time.monotonic() - started < 5, "the long poll held the shutdown up"
        assert answers == [200]
    finally:
        if proc.poll() is None:
            kill9(proc)
    out = log.read_text()
    assert "Traceback" not in out and "ERROR" not in out, out


def test_a_port_in_use_is_one_line_naming_it(shop_db: Path, tmp_path: Path) -> None:
    import socket
    import subprocess

    from tests.support.procs import ROOT

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = subprocess.run(
            [*DATABUS, "relay", "--source", f"sqlite:///{shop_db}", "--tables",
             ",".join(TABLES), "--port", str(port)],
            capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode != 0 and "Traceback" not in out.stderr
    errors = [x for x in out.stderr.splitlines() if x.startswith("databus:")]
    assert errors == [f"databus: ConfigError: relay cannot listen on 127.0.0.1:{port}:"
                      " Address already in use"], out.stderr
