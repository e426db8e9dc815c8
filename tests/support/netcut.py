"""A TCP forwarder a test can cut: the network between a component and a real server
failing, without stopping a server other tests share.

``with Cuttable(port) as link:`` forwards ``127.0.0.1:link.port`` to ``port``;
``link.cut()`` resets every open connection and refuses new ones (accepted, then
closed at once, as a dead peer or a firewall reset looks to the client);
``link.restore()`` forwards again.
"""

from __future__ import annotations

import socket
import struct
import threading
from contextlib import suppress


class Cuttable:
    """A forwarder from a free local port to ``127.0.0.1:target`` (threads, one pair
    per connection)."""

    def __init__(self, target: int) -> None:
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        self._cut = False
        self._closed = False
        self._thread = threading.Thread(target=self._accept, name="netcut", daemon=True)

    def __enter__(self) -> Cuttable:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._closed = True
        self.cut()
        self._listener.close()
        self._thread.join(5)

    def cut(self) -> None:
        """Reset every forwarded connection; refuse new ones until :meth:`restore`."""
        with self._lock:
            self._cut = True
            conns, self._open = self._open, []
        for s in conns:
            _reset(s)

    def restore(self) -> None:
        with self._lock:
            self._cut = False

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                cut = self._cut
            if cut:
                _reset(client)
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target), timeout=5)
            except OSError:
                _reset(client)
                continue
            upstream.settimeout(None)
            with self._lock:
                self._open += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pump, args=(a, b), daemon=True).start()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    with suppress(OSError):
        while chunk := src.recv(1 << 16):
            dst.sendall(chunk)
    with suppress(OSError):
        dst.shutdown(socket.SHUT_WR)


def _reset(s: socket.socket) -> None:
    """Close with RST (linger 0), so the peer sees the connection fail, not end."""
    with suppress(OSError):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with suppress(OSError):
        s.shutdown(socket.SHUT_RD)  # wakes a thread blocked in recv; sends nothing
    s.close()
