"""Reassembling whole windows from ``/stream`` bodies.

A body holds whole windows (data events then the EOP), except that a window
larger than the requested size arrives in pieces: a body ends with a prefix of
it (no EOP) and the next request asks for the rest with
``checkpoint.within(scn, events received so far)``. The
:class:`WindowAssembler` keeps those pieces until the EOP arrives, so the
dispatcher only ever sees whole windows, and it tracks ``position``: the
checkpoint to send with the next request.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from databus.client.wiredecode import scan
from databus.core import event as ev
from databus.core.checkpoint import Checkpoint
from databus.core.errors import DatabusError, RelayProtocolError, error_from_code


@dataclass(slots=True)
class DecodedWindow:
    """A whole window as the client received it: its data events decoded, in commit
    order, without the EOP (the encoded form sources produce is
    :class:`databus.core.window.Window`).

    ``first_offset`` is the number of the window's events consumed before
    (non-zero only when consumption resumed from a checkpoint inside a window).
    """

    scn: int
    events: list[ev.Event] = field(default_factory=list)
    timestamp_ns: int = 0
    first_offset: int = 0


def _control_error(event: ev.Event) -> DatabusError:
    """The error an error control event (-4..-50) carries."""
    try:
        body = json.loads(event.payload)
        fields = body.get("fields")
        return error_from_code(str(body["error"]), str(body.get("message", "")),
                               fields if isinstance(fields, dict) else None)
    except (ValueError, KeyError, TypeError):
        return RelayProtocolError(f"relay sent error event {event.src_id} at scn {event.scn}")


class WindowAssembler:
    """Turns bodies into whole windows; not thread-safe (the pull thread owns it)."""

    def __init__(self, checkpoint: Checkpoint, *, verify: bool = True) -> None:
        self.verify = verify
        self.reset(checkpoint)

    def reset(self, checkpoint: Checkpoint) -> None:
        """Forget buffered pieces and fetch from ``checkpoint`` again."""
        self.position = checkpoint
        self._pending: list[ev.Event] = []
        self._pending_scn = checkpoint.window_scn if checkpoint.in_window else -1
        self._offset = checkpoint.window_offset if checkpoint.in_window else 0

    @property
    def pending_events(self) -> int:
        """Events of an unfinished window held in memory."""
        return len(self._pending)

    def feed(self, data: bytes | memoryview) -> list[DecodedWindow]:
        """The windows that ``data`` completes, in order.

        The whole body is decoded in one call (:func:`databus.client.wiredecode.scan`,
        both CRCs unless ``verify`` is off) before any window is formed.

        All-or-nothing: when the body is corrupt
        (:class:`~databus.core.errors.CorruptEventError`) or breaks the
        protocol (:class:`RelayProtocolError`), the assembler is unchanged and
        the same request can be repeated.
        """
        position = self.position
        pending = list(self._pending)
        pending_scn = self._pending_scn
        offset = self._offset
        out: list[DecodedWindow] = []
        last_done = -1 if position.is_flexible or position.in_window else position.window_scn
        for e in scan(data, verify=self.verify):
            if e.src_id == ev.SRC_EOP:
                if pending_scn not in (-1, e.scn):
                    raise RelayProtocolError(
                        f"window {pending_scn} was not finished when the EOP of {e.scn} arrived")
                if e.scn <= last_done:
                    raise RelayProtocolError(f"window {e.scn} arrived after window {last_done}")
                out.append(DecodedWindow(e.scn, pending, e.timestamp_ns, offset))
                last_done = e.scn
                pending, pending_scn, offset = [], -1, 0
            elif e.is_control:
                if e.src_id <= ev.SRC_ERROR_FIRST:
                    raise _control_error(e)
                continue  # checkpoint and unknown control events carry nothing for us
            else:
                if pending_scn == -1:
                    if e.scn <= last_done:
                        raise RelayProtocolError(
                            f"event of window {e.scn} arrived after window {last_done}")
                    pending_scn = e.scn
                elif e.scn != pending_scn:
                    raise RelayProtocolError(
                        f"window {e.scn} started before window {pending_scn} ended")
                pending.append(e)
        if out:  # as window_done of each window in turn, with two copies per body
            if len(out) > 1:
                position = position.window_done(out[-2].scn)
            position = position.window_done(out[-1].scn)
        if pending_scn != -1 and pending:
            position = position.within(pending_scn, offset + len(pending))
        self.position = position
        self._pending, self._pending_scn, self._offset = pending, pending_scn, offset
        return out
