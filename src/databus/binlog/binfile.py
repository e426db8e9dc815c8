"""What one binlog file holds, as bytes: its header, its transactions, and reading them back.

Every file starts with the magic ``\\xfebin``, a Format_description (server version
:data:`SERVER_VERSION`, ``LOG_EVENT_BINLOG_IN_USE_F`` set while the file is the current
one and cleared when it is rotated away, as MySQL does) and a Previous_gtids event holding
the GTID set executed before the file (:func:`header_events`). Then whole transactions
(:func:`encode_transaction`): a GTID event (the data directory's server UUID, GNO = the
transaction's order from 1, the file's logical clock), then either ``Query BEGIN``,
Table_map and rows events, ``Xid`` (xid = the relay SCN of the window), or one DDL
``Query``. A file that reached its size limit ends with a Rotate event naming the next
file (written by the store).

Reading back: :func:`read_transactions` gives where each transaction is (the SCN <->
position <-> GTID map: the Xid of a row transaction is its SCN), :func:`ends_whole`
whether bytes end with a whole event whose CRC32 holds, :func:`is_ours` whether a file
was written by a databus binlog service (the store deletes only such files).

Pure functions over bytes (:func:`is_ours` reads a file's head); the store does the I/O.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from databus.binlog import events as ev
from databus.core.mysqlwire import (
    BIN_LOG_HEADER_SIZE,
    BINLOG_MAGIC,
    CHECKSUM_LEN,
    HEADER_LEN,
    LOG_EVENT_BINLOG_IN_USE_F,
    LOG_EVENT_IGNORABLE_F,
    LOG_EVENT_SUPPRESS_USE_F,
    TYPE_OFFSET,
    EventType,
)

SERVER_VERSION = "8.0.36-databus"
"""What the Format_description and ``SELECT @@version`` say."""
SERVER_VERSION_ID = 80036


@dataclass(frozen=True)
class Transaction:
    """One binlog transaction without its GTID event: ``events`` are ``(type code,
    header flags, body)``. ``ddl=False``: the store wraps them in ``Query BEGIN`` ...
    ``Xid(xid)``; ``ddl=True``: ``events`` is the single DDL Query event."""

    events: Sequence[tuple[int, int, bytes]]
    ddl: bool = False


@dataclass(frozen=True)
class Window:
    """One relay window as binlog transactions (none: an empty or filtered-out window,
    which still moves the map's SCN). ``timestamp_us``: the commit time."""

    scn: int
    timestamp_us: int
    transactions: Sequence[Transaction]


@dataclass(frozen=True)
class TransactionInfo:
    """Where one transaction is: its GTID event's position, the end of its last event,
    its GNO and (for a row transaction) its Xid = relay SCN (``-1`` for DDL)."""

    file: str
    pos: int
    end: int
    gno: int
    scn: int


def header_events(*, server_id: int, server_uuid: str, first_gno: int, timestamp: int) -> bytes:
    """A new file's first bytes: the magic, the Format_description (in use) and the
    Previous_gtids of the ``first_gno - 1`` transactions before it."""
    out = bytearray(BINLOG_MAGIC)
    out += ev.frame(EventType.FORMAT_DESCRIPTION, ev.format_description(SERVER_VERSION),
                    timestamp=timestamp, server_id=server_id, start=len(out),
                    flags=LOG_EVENT_BINLOG_IN_USE_F)
    prev = [(server_uuid, [(1, first_gno - 1)])] if first_gno > 1 else []
    out += ev.frame(EventType.PREVIOUS_GTIDS, ev.previous_gtids(prev), timestamp=timestamp,
                    server_id=server_id, start=len(out), flags=LOG_EVENT_IGNORABLE_F)
    return bytes(out)


def encode_transaction(txn: Transaction, window: Window, *, server_id: int, server_uuid: str,
                       gno: int, seq: int, start: int) -> bytes:
    """One transaction of ``window`` as it is written at file offset ``start``: its GTID
    event (``gno``; logical clock ``seq``, the transaction's number in its file), then
    its events (a row transaction wrapped in ``Query BEGIN`` ... ``Xid`` = the window's
    SCN)."""
    ts = int(window.timestamp_us // 1_000_000)
    if txn.ddl:
        parts = list(txn.events)
    else:
        parts = [(EventType.QUERY, LOG_EVENT_SUPPRESS_USE_F, ev.query("BEGIN")), *txn.events,
                 (EventType.XID, 0, ev.xid(window.scn))]
    rest = sum(HEADER_LEN + len(b) + CHECKSUM_LEN for _t, _f, b in parts)
    gsize = ev.gtid_event_size(rest)
    body = ev.gtid(server_uuid, gno, last_committed=seq - 1, sequence_number=seq,
                   commit_us=window.timestamp_us, transaction_length=gsize + rest,
                   server_version=SERVER_VERSION_ID)
    out = bytearray(ev.frame(EventType.MYSQL_GTID, body, timestamp=ts, server_id=server_id,
                             start=start))
    assert len(out) == gsize
    for tc, flags, b in parts:
        out += ev.frame(tc, b, timestamp=ts, server_id=server_id, start=start + len(out),
                        flags=flags)
    return bytes(out)


def read_transactions(data: bytes, name: str, start: int) -> Iterator[TransactionInfo]:
    """The whole transactions in ``data`` (file ``name``'s bytes) from ``start`` (a
    transaction boundary, at least the first event's offset)."""
    cur: list[int] = []  # [pos, gno]
    for h in ev.iter_headers(data, max(start, BIN_LOG_HEADER_SIZE)):
        if h.type_code == EventType.MYSQL_GTID:
            gno = int.from_bytes(data[h.pos + HEADER_LEN + 17:h.pos + HEADER_LEN + 25],
                                 "little")
            cur = [h.pos, gno]
        elif cur and h.type_code == EventType.XID:
            scn = int.from_bytes(data[h.pos + HEADER_LEN:h.pos + HEADER_LEN + 8], "little")
            yield TransactionInfo(name, cur[0], h.pos + h.size, cur[1], scn)
            cur = []
        elif cur and h.type_code == EventType.QUERY and _is_ddl(data, h):
            yield TransactionInfo(name, cur[0], h.pos + h.size, cur[1], -1)
            cur = []


def _is_ddl(data: bytes, h: ev.EventHeader) -> bool:
    body = h.pos + HEADER_LEN
    db_len = data[body + 8]
    status_len = int.from_bytes(data[body + 11:body + 13], "little")
    q = body + 13 + status_len + db_len + 1
    text = data[q:h.pos + h.size - CHECKSUM_LEN]
    return text not in (b"BEGIN", b"COMMIT")


def ends_whole(data: bytes, end: int) -> bool:
    """Whether ``data`` (a file's first ``end`` bytes) starts with the magic and its last
    event ends exactly at ``end`` with its CRC32 holding."""
    last = None
    for h in ev.iter_headers(data, BIN_LOG_HEADER_SIZE):
        last = h
    return (data[:BIN_LOG_HEADER_SIZE] == BINLOG_MAGIC and last is not None
            and last.pos + last.size == end
            and ev.check_crc(data[last.pos:last.pos + last.size]))


def is_ours(path: Path) -> bool:
    """Whether the file at ``path`` is a binlog file a databus binlog service wrote (its
    Format_description names :data:`SERVER_VERSION`)."""
    size = BIN_LOG_HEADER_SIZE + HEADER_LEN + 2 + 50
    try:
        with open(path, "rb") as fh:
            head = fh.read(size)
    except OSError:
        return False
    return (head[:BIN_LOG_HEADER_SIZE] == BINLOG_MAGIC and len(head) == size
            and head[BIN_LOG_HEADER_SIZE + TYPE_OFFSET] == EventType.FORMAT_DESCRIPTION
            and head[BIN_LOG_HEADER_SIZE + HEADER_LEN + 2:].rstrip(b"\0")
            == SERVER_VERSION.encode())
