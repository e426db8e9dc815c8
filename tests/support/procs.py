"""Starting and killing databus processes for end-to-end tests."""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.support.wait import wait_until

ROOT = Path(__file__).resolve().parents[2]
DATABUS = [sys.executable, "-m", "databus"]


# Ports handed out by this process: the kernel's bind(0) may give one port twice in a
# row (two servers of one test then collide), and its ephemeral range is also where
# outgoing connections take their local ports, so a port picked there can be taken
# before the server binds it. Picks come from below that range, never twice.
# under pytest-xdist each worker process takes ports from its own slice, so two
# workers never pick the same port between one's probe and its server's bind
_WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:] or 0)
_WORKERS = max(1, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
_SPAN = (32_000 - 20_000) // _WORKERS
_PORT_RANGE = (20_000 + _WORKER * _SPAN, 20_000 + (_WORKER + 1) * _SPAN)
_given: set[int] = set()
_pick = random.Random(os.getpid() ^ time.time_ns())


def free_port() -> int:
    """A loopback TCP port nobody listens on now and that this process never handed out."""
    for _ in range(1000):
        port = _pick.randrange(*_PORT_RANGE)
        if port in _given:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _given.add(port)
        return port
    raise RuntimeError(f"no free port in {_PORT_RANGE} after 1000 tries")


def spawn(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    """Start a process whose output goes to ``log`` (appended, kept for post-mortems)."""
    # this checkout's src/ first, so a second checkout (a git worktree) runs its own code
    # and not the editable install's
    path = [str(ROOT / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in path if p))
    with log.open("ab") as fh:
        return subprocess.Popen(args, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=ROOT)


@contextmanager
def running(args: list[str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """:func:`spawn`, stopped (SIGTERM, then SIGKILL) at exit."""
    proc = spawn(args, log)
    try:
        yield proc
    finally:
        stop(proc)


def wait_http(url: str, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    def serving() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"process exited with {proc.returncode} before serving {url}")
        try:
            httpx.get(url, timeout=1.0)
            return True
        except httpx.TransportError:
            return False

    wait_until(serving, timeout, f"{url} to serve")


def kill9(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait(30)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            kill9(proc)


def served_lines(url: str) -> Iterator[str]:
    """The relay's whole buffer as its JSON output (``output=json``), one event a line,
    read page by page from the oldest window (each page asserted served)."""
    scn = None
    while True:
        params = {"output": "json", "size": str(32 << 20), "timeout": "0"}
        if scn is not None:
            params["checkPoint"] = json.dumps({"windowScn": scn, "windowOffset": -1,
                                               "consumption_mode": "ONLINE_CONSUMPTION"})
        r = httpx.get(f"{url}/stream", params=params, timeout=60)
        assert r.status_code == 200, r.text
        if not r.text:
            return
        yield from r.text.splitlines()
        scn = int(r.headers["X-Databus-Last-Window-Scn"])


def snapshot_reads(url: str) -> int:
    """``r`` events in the relay's whole buffer."""
    return sum(1 for x in served_lines(url) if '"op":"r"' in x)
