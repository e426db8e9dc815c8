"""WindowAssembler: whole windows out of bodies, split windows, protocol errors."""

from __future__ import annotations

import pytest

from databus.client.window import WindowAssembler
from databus.core import event as ev
from databus.core.checkpoint import Checkpoint
from databus.core.errors import CorruptEventError, RelayProtocolError, ScnNotFoundError


def _data(scn: int, key: int) -> bytes:
    return ev.encode(scn=scn, src_id=1, key=key, payload=b"x", schema_id=b"s", op=ev.Op.INSERT)


def _window(scn: int, n: int) -> list[bytes]:
    return [_data(scn, i) for i in range(n)] + [ev.encode_eop(scn)]


def test_whole_windows_and_position() -> None:
    asm = WindowAssembler(Checkpoint.flexible())
    out = asm.feed(b"".join(_window(5, 2) + _window(7, 0) + _window(9, 1)))
    assert [(w.scn, len(w.events)) for w in out] == [(5, 2), (7, 0), (9, 1)]
    assert asm.position.window_scn == 9 and asm.position.window_offset == -1
    assert asm.position.prev_scn == 7
    assert asm.feed(b"") == []


def test_split_window_is_held_until_its_eop() -> None:
    asm = WindowAssembler(Checkpoint.after(1))
    parts = _window(5, 5)
    assert asm.feed(b"".join(parts[:2])) == []
    assert asm.position.window_scn == 5 and asm.position.window_offset == 2
    assert asm.pending_events == 2
    assert asm.feed(b"".join(parts[2:4])) == []
    assert asm.position.window_offset == 4 and asm.position.prev_scn == 1
    out = asm.feed(b"".join(parts[4:] + _window(6, 1)))
    assert [(w.scn, [e.key for e in w.events]) for w in out] == [(5, [0, 1, 2, 3, 4]), (6, [0])]
    assert asm.position == asm.position.model_copy(update={"window_scn": 6, "prev_scn": 5})


def test_resume_inside_a_window() -> None:
    asm = WindowAssembler(Checkpoint.after(1).within(5, 3))
    out = asm.feed(b"".join(_window(5, 2)))
    assert len(out) == 1 and out[0].first_offset == 3 and len(out[0].events) == 2


@pytest.mark.parametrize("body", [
    _window(5, 1)[:1] + _window(6, 1),  # window 6 begins before 5 ended
    _window(3, 1),  # goes backwards
    _window(4, 0),  # the same window again
])
def test_protocol_errors_leave_the_assembler_unchanged(body: list[bytes]) -> None:
    asm = WindowAssembler(Checkpoint.after(4))
    with pytest.raises(RelayProtocolError):
        asm.feed(b"".join(body))
    assert asm.position == Checkpoint.after(4).model_copy(
        update={"ts_nsecs": asm.position.ts_nsecs})
    assert asm.pending_events == 0


def test_corrupt_body_leaves_the_assembler_unchanged() -> None:
    asm = WindowAssembler(Checkpoint.after(1))
    asm.feed(_window(5, 3)[0])
    good = b"".join(_window(5, 3)[1:])
    bad = good[:-3] + bytes([good[-3] ^ 0xFF]) + good[-2:]
    with pytest.raises(CorruptEventError):
        asm.feed(bad)
    assert asm.pending_events == 1 and asm.position.window_offset == 1
    assert len(asm.feed(good)) == 1


def test_error_control_event_raises_its_error() -> None:
    asm = WindowAssembler(Checkpoint.flexible())
    body = ev.encode_control(5, -4, b'{"error": "ScnNotFound", "message": "gone"}')
    with pytest.raises(ScnNotFoundError, match="gone"):
        asm.feed(body)
    # checkpoint control events are ignored
    assert asm.feed(ev.encode_control(5, ev.SRC_CHECKPOINT, b"{}") + _window(5, 0)[0])[0].scn == 5
