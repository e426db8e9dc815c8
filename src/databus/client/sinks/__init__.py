"""Ready-made consumers: JSON lines output and SQL replication."""

from databus.client.sinks.jsonl import JsonLinesSink
from databus.client.sinks.replicate import ReplicateSink

__all__ = ["JsonLinesSink", "ReplicateSink"]
