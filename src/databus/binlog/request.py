"""A replica's dump request: ``COM_BINLOG_DUMP`` and ``COM_BINLOG_DUMP_GTID`` parsed.

:func:`parse_binlog_dump` and :func:`parse_binlog_dump_gtid` take a command's body (the
command byte removed) and give a :class:`DumpRequest`: where the replica starts (a file
and position, or the GTID set it has), its flags and its server id. A GTID set arrives in
the binary SID-block form and is kept in MySQL's text form (:func:`decode_gtid_set`).

Errors: a malformed packet or GTID set is a :class:`DumpError` with MySQL's errno 1835
(``ER_MALFORMED_PACKET``); :class:`DumpError` is also how every dump that cannot go on
exactly ends (1236, ``ER_MASTER_FATAL_ERROR_READING_BINLOG``, and MySQL's text).
"""

from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass

from databus.core.errors import TerminalError
from databus.core.mysqlwire import BINLOG_DUMP_NON_BLOCK, BINLOG_THROUGH_GTID

ER_MASTER_FATAL_ERROR_READING_BINLOG = 1236
ER_MALFORMED_PACKET = 1835


class DumpError(TerminalError):
    """A dump that cannot go on exactly; ``errno`` and the text are MySQL's (1236)."""

    code = "BinlogDumpError"

    def __init__(self, message: str, errno: int = ER_MASTER_FATAL_ERROR_READING_BINLOG) -> None:
        super().__init__(message)
        self.errno = errno


def decode_gtid_set(data: bytes) -> str:
    """The binary SID-block format of ``COM_BINLOG_DUMP_GTID`` (n_sids u64, then per sid:
    uuid 16 bytes, n_intervals u64, intervals as u64 start, u64 exclusive end) as MySQL's
    text form (``uuid:1-5:7``)."""
    try:
        (n_sids,) = struct.unpack_from("<Q", data, 0)
        off = 8
        parts = []
        for _ in range(n_sids):
            sid = uuid.UUID(bytes=bytes(data[off:off + 16]))
            (n,) = struct.unpack_from("<Q", data, off + 16)
            off += 24
            ivs = []
            for _ in range(n):
                start, end = struct.unpack_from("<QQ", data, off)
                off += 16
                if not 0 < start < end:
                    raise ValueError(f"interval {start}-{end}")
                ivs.append(f"{start}" if end == start + 1 else f"{start}-{end - 1}")
            if ivs:
                parts.append(f"{sid}:" + ":".join(ivs))
    except (struct.error, ValueError) as exc:
        raise DumpError(f"Malformed GTID set in COM_BINLOG_DUMP_GTID: {exc}",
                        errno=ER_MALFORMED_PACKET) from exc
    return ",".join(parts)


@dataclass(frozen=True)
class DumpRequest:
    """One parsed ``COM_BINLOG_DUMP`` / ``COM_BINLOG_DUMP_GTID`` (command byte removed)."""

    file: str
    pos: int
    flags: int
    replica_server_id: int
    gtids: str | None = None  # GTID dumps: the client's executed set (text form)

    @property
    def non_blocking(self) -> bool:
        # MySQL's two ways: the flag, or server_id 0 (mysqlbinlog -R since forever)
        return bool(self.flags & BINLOG_DUMP_NON_BLOCK) or self.replica_server_id == 0


def parse_binlog_dump(data: bytes) -> DumpRequest:
    """``COM_BINLOG_DUMP``: pos u32, flags u16, server_id u32, file name (rest)."""
    if len(data) < 10:
        raise DumpError("Malformed COM_BINLOG_DUMP packet", errno=ER_MALFORMED_PACKET)
    pos, flags, sid = struct.unpack_from("<IHI", data, 0)
    return DumpRequest(data[10:].rstrip(b"\x00").decode("utf-8", "replace"), pos, flags, sid)


def parse_binlog_dump_gtid(data: bytes) -> DumpRequest:
    """``COM_BINLOG_DUMP_GTID``: flags u16, server_id u32, name size u32, name, pos u64,
    then the data size u32 and the GTID set's SID blocks. The set is read whenever it is
    there, as MySQL's server does (``com_binlog_dump_gtid`` reads it unconditionally):
    Debezium's client (mysql-binlog-connector-java) sends it with flags 0, without
    ``BINLOG_THROUGH_GTID``; ignoring it restarted that client from the first file."""
    try:
        flags, sid, name_len = struct.unpack_from("<HII", data, 0)
        off = 10
        name = data[off:off + name_len].rstrip(b"\x00").decode("utf-8", "replace")
        off += name_len
        (pos,) = struct.unpack_from("<Q", data, off)
        off += 8
        gtids = ""
        if flags & BINLOG_THROUGH_GTID or len(data) >= off + 4:
            (size,) = struct.unpack_from("<I", data, off)
            off += 4
            gtids = decode_gtid_set(data[off:off + size])
    except struct.error as exc:
        raise DumpError("Malformed COM_BINLOG_DUMP_GTID packet", errno=ER_MALFORMED_PACKET) from exc
    return DumpRequest(name, pos, flags, sid, gtids)
