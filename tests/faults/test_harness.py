"""The fault harness itself (``tests.support.faults``): a cut drops packets silently
(no reset: a connect times out instead of being refused, a send fills the buffer and
waits), heals at the block's end, touches nothing but its own table's loopback rules;
a small disk fills (``ENOSPC``) and its space returns."""

from __future__ import annotations

import errno
import os
import re
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.support import faults
from tests.support.procs import free_port


def _nft_or_skip() -> None:
    reason = faults.nft_unavailable()
    if reason is not None:
        pytest.skip(reason)


def _mount_or_skip() -> None:
    reason = faults.mount_unavailable()
    if reason is not None:
        pytest.skip(reason)


def _echo_server() -> socket.socket:
    return socket.create_server(("127.0.0.1", free_port()))


def test_a_cut_port_drops_connects_silently_and_heals() -> None:
    _nft_or_skip()
    with _echo_server() as server:
        port = server.getsockname()[1]
        with faults.cut(port, "to"):
            t0 = time.monotonic()
            with pytest.raises(TimeoutError):  # not ConnectionRefusedError: no reset
                socket.create_connection(("127.0.0.1", port), timeout=1.5)
            assert time.monotonic() - t0 >= 1.4
        # healed: the same port connects at once
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    # a port nobody listens on is refused at once when not cut (the difference a
    # silent cut makes)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", free_port()), timeout=2)


@pytest.mark.parametrize("direction", ["both", "from"])
def test_a_connected_socket_waits_while_cut_and_continues_after(direction: str) -> None:
    _nft_or_skip()
    with _echo_server() as server:
        port = server.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port), timeout=2)
        peer, _ = server.accept()
        with client, peer:
            client.sendall(b"before")
            assert peer.recv(100) == b"before"
            with faults.cut(port, direction):  # type: ignore[arg-type]
                client.settimeout(1.0)
                peer.settimeout(1.0)
                with pytest.raises(TimeoutError):  # nothing arrives, nothing fails
                    client.recv(100)
                # the server's answers are dropped: the client's send buffer (or the
                # server's) fills, then a send waits
                with pytest.raises(TimeoutError):
                    for _ in range(10_000):
                        peer.sendall(b"x" * 65536)
            # healed: the connection was never reset; what waited arrives
            client.settimeout(30)
            assert client.recv(65536).startswith(b"x")


def test_cuts_are_loopback_rules_in_this_process_table_only() -> None:
    _nft_or_skip()
    with faults.cut(12345, "both"):
        listed = faults.rules()
    assert f"table inet {faults.TABLE}" in listed
    drops = [line for line in listed.splitlines() if "drop" in line]
    assert len(drops) == 2, listed
    assert all("ip daddr 127.0.0.1" in d for d in drops), listed
    assert {re.search(r"tcp (\w+) 12345", d).group(1) for d in drops} == {"dport", "sport"}  # type: ignore[union-attr]
    assert "drop" not in faults.rules()  # healed: no rule left


def test_a_stale_table_of_a_dead_process_is_removed() -> None:
    _nft_or_skip()
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = f"{faults.PREFIX}{dead.pid}"
    subprocess.run(["nft", "add", "table", "inet", stale], check=True)
    faults._remove_stale()
    tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True,
                            check=True).stdout
    assert stale not in tables and faults.TABLE in tables


def test_a_small_disk_fills_and_frees() -> None:
    _mount_or_skip()
    with faults.small_disk(4 << 20) as disk:
        assert faults.free_bytes(disk) <= 4 << 20
        with faults.filled(disk, leave=64 << 10):
            assert faults.free_bytes(disk) <= 64 << 10
            with pytest.raises(OSError) as full:
                (disk / "big").write_bytes(b"y" * (1 << 20))
            assert full.value.errno == errno.ENOSPC
            (disk / "big").unlink()
        assert faults.free_bytes(disk) > 3 << 20  # the space returned
        (disk / "big").write_bytes(b"y" * (1 << 20))
        mounted = disk
    assert not Path(mounted).exists() or not os.path.ismount(mounted)
