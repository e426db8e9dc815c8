"""databus.client: consume a relay's change stream.

Quick start::

    from databus.client import ClientConfig, Consumer, DatabusClient, FileCheckpointStore

    class Printer(Consumer):
        def on_data_event(self, event):
            print(event.source, event.op.letter, event.after)

    DatabusClient(ClientConfig(relay_url="http://127.0.0.1:11115", sources=["main.orders"]),
                  Printer(), FileCheckpointStore("orders.ckpt")).run()

Modules: :mod:`~databus.client.consumer` (callbacks, results, DataEvent),
:mod:`~databus.client.client` (pull loop, delivery guarantees),
:mod:`~databus.client.checkpoints` (stores), :mod:`~databus.client.group`
(N threads), :mod:`~databus.client.relay` (HTTP), :mod:`~databus.client.sinks`.
"""

from databus.client.checkpoints import (
    CheckpointStore,
    FileCheckpointStore,
    MemoryCheckpointStore,
    SqlCheckpointStore,
)
from databus.client.client import ClientStats, DatabusClient
from databus.client.config import ClientConfig
from databus.client.consumer import Consumer, ConsumerResult, DataEvent
from databus.client.group import ConsumerGroup
from databus.client.relay import RelayConnection
from databus.client.sinks import JsonLinesSink, ReplicateSink
from databus.core.errors import CheckpointStoreError, RelayProtocolError, SinkUnavailableError

__all__ = [
    "CheckpointStore",
    "CheckpointStoreError",
    "ClientConfig",
    "ClientStats",
    "Consumer",
    "ConsumerGroup",
    "ConsumerResult",
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
]
