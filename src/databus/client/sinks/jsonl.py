"""A sink that prints every data event as one JSON envelope line (``databus tail``)."""

from __future__ import annotations

from typing import TextIO

from databus.client.consumer import Consumer, DataEvent, Result
from databus.core.envelope import dumps


class JsonLinesSink(Consumer):
    """Writes ``dumps(event.envelope())`` + newline per data event to ``stream``.

    The envelope is documented in ``docs/json.md``. The stream is flushed at
    the end of each window, so a reader sees whole windows; delivery is the
    client's at-least-once (a replayed window is printed again).
    """

    def __init__(self, stream: TextIO, *, eop_lines: bool = False) -> None:
        self.stream = stream
        self.eop_lines = eop_lines
        self.lines = 0

    def on_data_event(self, event: DataEvent) -> Result:
        self.stream.write(dumps(event.envelope()) + "\n")
        self.lines += 1
        return None

    def on_bootstrap_event(self, event: DataEvent) -> Result:
        """Bootstrap rows and catch-up events print like data events (snapshot
        rows have ``op`` ``r`` and ``source.snapshot`` true)."""
        return self.on_data_event(event)

    def on_end_bootstrap_sequence(self, scn: int) -> Result:
        self.stream.flush()
        return None

    def on_end_data_event_sequence(self, scn: int) -> Result:
        if self.eop_lines:
            self.stream.write(dumps({"type": "eop", "scn": scn}) + "\n")
        self.stream.flush()
        return None
