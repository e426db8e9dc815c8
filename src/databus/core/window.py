"""The window: the unit a source produces, the buffer stores and a relay serves.

A window is the set of events with one SCN: one or more whole source
transactions, never a part of one (docs/architecture.md). In this form its data
events are already encoded (:mod:`databus.core.event`), ready to be appended
to a buffer as bytes; the EOP that ends it on the wire is not included (the
buffer writes it). Consumers see windows decoded, as
:class:`databus.client.window.DecodedWindow`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Window:
    """A consistency window ready for the buffer (EOP not included).

    ``events`` is the concatenation of ``count`` encoded data events, all with
    sequence ``scn``. ``timestamp_ns`` is the commit time where the source
    knows it.
    """

    scn: int
    events: bytes
    count: int
    timestamp_ns: int
