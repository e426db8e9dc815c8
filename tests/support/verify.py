"""Compare what consumers received with what the database committed."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

from tests.support.shop import Change

Windows = list[tuple[int, list[Change]]]

_read: dict[Path, tuple[int, int, Windows]] = {}  # path -> (inode, bytes parsed, windows)
_read_lock = threading.Lock()
_KEEP = 8  # files remembered: a test polls one or two recorders at a time


def read_windows(path: Path) -> Windows:
    """Whole lines of a recorder file (a trailing cut line is ignored).

    Recorders only append, so each call parses only the lines added since the last call
    for the same file: a wait that polls a recorder of 50,000 windows every second costs
    what the new lines cost, not a parse of the whole file each time. A file replaced or
    shortened is read again from its start."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return []
    with _read_lock:
        ino, offset, windows = _read.pop(path, (st.st_ino, 0, []))
        if ino != st.st_ino or st.st_size < offset:
            offset, windows = 0, []
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
        whole = data.rfind(b"\n") + 1
        for line in data[:whole].split(b"\n")[:-1]:
            rec = json.loads(line)
            windows.append((rec["scn"], [tuple(e) for e in rec["events"]]))  # type: ignore[misc]
        _read[path] = (st.st_ino, offset + whole, windows)
        while len(_read) > _KEEP:
            del _read[next(iter(_read))]
        return list(windows)


def check_delivery(windows: list[tuple[int, list[Change]]], committed: list[list[Change]],
                   rolled_back: list[list[Change]]) -> dict[str, int]:
    """Assert the recorded windows deliver exactly the committed transactions.

    * a window seen again must be identical to its first delivery (only whole
      windows repeat), and a repeat only goes back in time (replay);
    * taking each SCN once, in order, the events are exactly the committed
      changes in commit order (nothing lost, nothing rolled back, nothing extra);
    * every transaction lies inside one window.
    """
    first: dict[int, list[Change]] = {}
    order: list[int] = []
    repeats = 0
    for scn, events in windows:
        if scn in first:
            assert first[scn] == events, f"window {scn} repeated with different content"
            repeats += 1
            continue
        assert not order or scn > order[-1], f"window {scn} after {order[-1]}: out of order"
        first[scn] = events
        order.append(scn)
    stream = [e for scn in order for e in first[scn]]
    expected = [c for t in committed for c in t]
    assert len(stream) == len(expected), (
        f"consumer got {len(stream)} changes, database committed {len(expected)}")
    for i, (got, want) in enumerate(zip(stream, expected, strict=True)):
        assert got == want, f"change #{i}: got {got}, committed {want}"
    # transaction atomicity: boundaries of windows fall on transaction boundaries
    tx_ends = set()
    pos = 0
    for t in committed:
        pos += len(t)
        tx_ends.add(pos)
    pos = 0
    for scn in order:
        pos += len(first[scn])
        assert pos in tx_ends or pos == 0, f"window {scn} ends inside a transaction"
    return {"windows": len(order), "repeated_windows": repeats, "changes": len(stream),
            "rolled_back_transactions": len(rolled_back)}
