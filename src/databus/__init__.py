"""Databus for Python: change data capture with relays, bootstrap and consumers."""

from databus.core.checkpoint import Checkpoint, ConsumptionMode
from databus.core.errors import (
    ConfigError,
    DatabusError,
    InvalidCheckpointError,
    InvalidFilterError,
    InvalidRequestError,
    RelayUnavailableError,
    ScnNotFoundError,
    SourceUnavailableError,
    TerminalError,
    TransientError,
    UnknownSourceError,
)
from databus.core.event import Event, Op
from databus.core.filters import ServerFilter
from databus.core.schema import SchemaRegistry, TableSchema

__version__ = "0.1.0"

__all__ = [
    "Checkpoint",
    "ConfigError",
    "ConsumptionMode",
    "DatabusError",
    "Event",
    "InvalidCheckpointError",
    "InvalidFilterError",
    "InvalidRequestError",
    "Op",
    "RelayUnavailableError",
    "SchemaRegistry",
    "ScnNotFoundError",
    "ServerFilter",
    "SourceUnavailableError",
    "TableSchema",
    "TerminalError",
    "TransientError",
    "UnknownSourceError",
    "__version__",
]
