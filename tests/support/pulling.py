"""A client library consumer pulling from a relay on a thread of its own, whose callback
can be held (a consumer stalled in its callback, as the operator's view must show)."""

from __future__ import annotations

import threading

from databus.client import ClientConfig, Consumer, DatabusClient, DataEvent
from databus.client.checkpoints import MemoryCheckpointStore


class Gate(Consumer):
    """Counts data events; blocks in the callback while ``open`` is clear (``waiting``
    is set once it blocked)."""

    def __init__(self) -> None:
        self.open = threading.Event()
        self.open.set()
        self.events = 0
        self.waiting = threading.Event()

    def on_data_event(self, event: DataEvent) -> None:
        if not self.open.is_set():
            self.waiting.set()
            self.open.wait(60)
        self.events += 1


class Pulling:
    """A :class:`DatabusClient` named ``name`` (its ``X-Databus-Consumer``) pulling from
    ``url`` through a :class:`Gate`, from ``__enter__`` until ``__exit__`` (which
    opens the gate and stops it)."""

    def __init__(self, url: str, name: str) -> None:
        self.gate = Gate()
        cfg = ClientConfig(relay=url, poll_timeout=0.3, consumer_name=name,
                           backoff_initial=0.05, backoff_max=0.2)
        self.client = DatabusClient(cfg, self.gate, MemoryCheckpointStore())
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.client.run, kwargs={"stop": self.stop},
                                       daemon=True)

    def __enter__(self) -> Pulling:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.gate.open.set()
        self.stop.set()
        self.thread.join(30)
