"""What a relay cluster member needs of its relay, and the source it has between roles.

:class:`Member` is the part of :class:`databus.relay.relay.Relay` that
:mod:`databus.relay.cluster` drives: it switches the relay's source as the member's
role changes (database as leader or co-leader, a chain source as follower), resets
the buffer when it diverged, and reads what the relay holds.

:func:`idle_source` is the source of a member between roles: it reads nothing, and it
keeps the schema versions of the source it replaced, so ``/register`` keeps listing
every version of the windows the buffer still serves.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from databus.core.schema import SchemaRegistry
from databus.sources.base import Source, SourceInfo

if TYPE_CHECKING:
    from pathlib import Path

    from databus.buffer import EventBuffer
    from databus.core.window import Window
    from databus.relay.config import RelayConfig
    from databus.relay.fetcher import Fetcher
    from databus.sources.base import Capturer
    from databus.sources.config import AnySourceConfig


class Member(Protocol):
    """What a cluster member needs of its relay (:class:`databus.relay.relay.Relay`)."""

    config: RelayConfig
    source: Source
    buffer: EventBuffer
    fetcher: Fetcher
    state_dir: Path | None
    capturer: Capturer

    @property
    def url(self) -> str: ...

    def open_source(self, config: AnySourceConfig) -> Source: ...

    def capture_status(self) -> dict[str, Any]: ...

    def switch_source(self, source: Source, *, guard: Callable[[], bool] | None = None,
                      ack_limit: Callable[[], int] | None = None) -> None: ...

    def reset_buffer(self) -> None: ...

    def wake(self) -> None: ...


class _Idle(Source):
    """See :func:`idle_source`."""

    def __init__(self, registry: SchemaRegistry | None = None) -> None:
        self._registry = registry if registry is not None else SchemaRegistry()

    def sources(self) -> list[SourceInfo]:
        return []

    def registry(self) -> SchemaRegistry:
        return self._registry

    def read(self, after_scn: int, stop: threading.Event, timeout: float) -> list[Window]:
        stop.wait(timeout)
        return []


def idle_source(registry: SchemaRegistry | None = None) -> Source:
    """A source that reads nothing and lists ``registry``'s schema versions."""
    return _Idle(registry)


def is_idle(source: Source) -> bool:
    """Whether ``source`` is a member's between roles (it reads nothing)."""
    return isinstance(source, _Idle)
