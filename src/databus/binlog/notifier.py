"""Waking a server's waiting dumps when the binlog grows: one thread per server.

The store's wait (:meth:`~databus.binlog.store.BinlogStore.wait_beyond`) blocks a thread;
dumps run on an asyncio loop. A :class:`StoreNotifier` is the one thread of a server that
waits on the store and sets an :class:`asyncio.Event` on the loop whenever the committed
end moves, so no dump needs a thread of its own. It stops with :meth:`StoreNotifier.close`
(and waits quietly once the store is closed).
"""

from __future__ import annotations

import asyncio
import threading

from databus.binlog.store import BinlogStore


class StoreNotifier:
    """One thread that waits on the store and wakes every dumper of an event loop.

    A dumper takes :attr:`changed` *before* it looks at the store's sizes, then awaits it:
    data committed between the look and the wait is never missed.
    """

    def __init__(self, store: BinlogStore, loop: asyncio.AbstractEventLoop) -> None:
        self._store = store
        self._loop = loop
        self.changed = asyncio.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="binlog-notifier", daemon=True)
        self._thread.start()

    def _pulse(self) -> None:
        old, self.changed = self.changed, asyncio.Event()
        old.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                end = self._store.end()
                moved = self._store.wait_beyond(end, 0.5)
            except Exception:  # broad: a closed store at shutdown: nothing left to wait for
                if self._stop.wait(0.5):
                    return
                continue
            if moved and not self._loop.is_closed():
                self._loop.call_soon_threadsafe(self._pulse)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
