"""databus.client: consume a relay's change stream.

Quick start::

    from databus.client import ClientConfig, Consumer, DatabusClient, FileCheckpointStore

    class Printer(Consumer):
        def on_data_event(self, event):
            print(event.source, event.op.letter, event.after)

    DatabusClient(ClientConfig(relay="http://127.0.0.1:11115", sources=["main.orders"]),
                  Printer(), FileCheckpointStore("orders.ckpt")).run()

Modules: :mod:`~databus.client.consumer` (callbacks, results, DataEvent),
:mod:`~databus.client.client` (pull loop, delivery guarantees),
:mod:`~databus.client.checkpoints` (stores), :mod:`~databus.client.group`
(N threads), :mod:`~databus.client.relay` (HTTP), :mod:`~databus.client.sinks`.

Its names are handed on lazily (:mod:`databus.core.lazy`): importing one module
(e.g. :mod:`databus.client.relay` in a Spark worker) must not load SQLAlchemy, the
sinks and the rest of the client, which doubles the cost of the import (0.34 s
against 0.79 s for the whole client, best of seven starts).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from databus.core.lazy import lazy_names

if TYPE_CHECKING:
    from databus.client.checkpoints import (
        CheckpointStore,
        FileCheckpointStore,
        MemoryCheckpointStore,
        SqlCheckpointStore,
    )
    from databus.client.client import DatabusClient
    from databus.client.config import ClientConfig
    from databus.client.consumer import (
        Consumer,
        ConsumerResult,
        DataBatch,
        DataEvent,
        WindowBatch,
    )
    from databus.client.group import ConsumerGroup
    from databus.client.metrics import ConsumerMetrics
    from databus.client.relay import RelayConnection
    from databus.client.sinks import JsonLinesSink, ReplicateSink
    from databus.client.stats import ClientStats
    from databus.core.errors import CheckpointStoreError, RelayProtocolError, SinkUnavailableError

__all__ = [
    "CheckpointStore",
    "CheckpointStoreError",
    "ClientConfig",
    "ClientStats",
    "Consumer",
    "ConsumerGroup",
    "ConsumerMetrics",
    "ConsumerResult",
    "DataBatch",
    "DataEvent",
    "DatabusClient",
    "FileCheckpointStore",
    "JsonLinesSink",
    "MemoryCheckpointStore",
    "RelayConnection",
    "RelayProtocolError",
    "ReplicateSink",
    "SinkUnavailableError",
    "SqlCheckpointStore",
    "WindowBatch",
]

__getattr__ = lazy_names(__name__, {
    "databus.client.checkpoints": ["CheckpointStore", "FileCheckpointStore",
                                   "MemoryCheckpointStore", "SqlCheckpointStore"],
    "databus.client.client": ["DatabusClient"],
    "databus.client.config": ["ClientConfig"],
    "databus.client.consumer": ["Consumer", "ConsumerResult", "DataBatch", "DataEvent",
                                "WindowBatch"],
    "databus.client.group": ["ConsumerGroup"],
    "databus.client.metrics": ["ConsumerMetrics"],
    "databus.client.relay": ["RelayConnection"],
    "databus.client.sinks": ["JsonLinesSink", "ReplicateSink"],
    "databus.client.stats": ["ClientStats"],
    "databus.core.errors": ["CheckpointStoreError", "RelayProtocolError", "SinkUnavailableError"],
})
