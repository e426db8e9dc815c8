"""MySQL's binlog and replication wire constants, defined once.

Two parts of databus speak MySQL's binlog format from opposite ends: the MySQL source
(``databus.sources.mysql``) reads a server's binlog as a replica, and the binlog service
(``databus.binlog``) writes binlog files and serves them to replicas. Neither may import
the other (tests/unit/test_imports.py), so the numbers both use live here, in core: the
event type codes, the common event header's layout and flags, the replication commands,
and the column type codes of Table_map events.

Contract: only constants, taken from MySQL 8.0's ``libbinlogevents`` and MariaDB's
``log_event.h`` (named after them where a name is free); no encoder or decoder. Each
package keeps its own reader or writer and names what it uses from here. A value is
added here when a second package needs it, never copied.
"""

from __future__ import annotations

import struct
from enum import IntEnum


class EventType(IntEnum):
    """Binlog event type codes (MySQL's ``Log_event_type``, MariaDB's above 159).

    MySQL's GTID event is ``MYSQL_GTID``: MariaDB has its own (``MARIADB_GTID``)."""

    QUERY = 2
    STOP = 3
    ROTATE = 4
    FORMAT_DESCRIPTION = 15
    XID = 16
    TABLE_MAP = 19
    WRITE_ROWS_V1 = 23
    UPDATE_ROWS_V1 = 24
    DELETE_ROWS_V1 = 25
    HEARTBEAT = 27
    ROWS_QUERY = 29
    WRITE_ROWS = 30  # v2, MySQL 5.6+ and MariaDB 10.x with binlog_row_event_v2
    UPDATE_ROWS = 31
    DELETE_ROWS = 32
    MYSQL_GTID = 33
    ANONYMOUS_GTID = 34
    PREVIOUS_GTIDS = 35
    MARIADB_ANNOTATE_ROWS = 160
    MARIADB_BINLOG_CHECKPOINT = 161
    MARIADB_GTID = 162
    MARIADB_GTID_LIST = 163


# -- the common event header (binlog v4), all integers little-endian ----------------------
#
#   off size field
#   0   4    timestamp (seconds since the epoch)
#   4   1    type code
#   5   4    server id
#   9   4    event size (header + body + checksum)
#   13  4    log_pos: the position of the *end* of this event (the next one's start)
#   17  2    flags

EVENT_HEADER = struct.Struct("<IBIIIH")
HEADER_LEN = 19  # MySQL's LOG_EVENT_HEADER_LEN
assert EVENT_HEADER.size == HEADER_LEN
TYPE_OFFSET = 4
SERVER_ID_OFFSET = 5
LEN_OFFSET = 9
LOG_POS_OFFSET = 13
FLAGS_OFFSET = 17

CHECKSUM_LEN = 4  # binlog_checksum=CRC32: zlib.crc32 of the event before it
BINLOG_CHECKSUM_ALG_CRC32 = 1  # a Format_description's algorithm byte (before its CRC)
BINLOG_MAGIC = b"\xfebin"  # every binlog file's first bytes
BIN_LOG_HEADER_SIZE = len(BINLOG_MAGIC)  # where a file's first event starts

# header flags
LOG_EVENT_BINLOG_IN_USE_F = 0x0001  # Format_description: the file is still being written
LOG_EVENT_SUPPRESS_USE_F = 0x0008  # Query: no ``USE db`` needed to apply it
LOG_EVENT_ARTIFICIAL_F = 0x0020  # made up by the dump thread (its Rotate), not in a file
LOG_EVENT_IGNORABLE_F = 0x0080  # a reader that does not know the type may pass it over

# -- replication commands and their flags --------------------------------------------------

COM_CHANGE_USER = 0x11
COM_BINLOG_DUMP = 0x12
COM_REGISTER_SLAVE = 0x15
COM_BINLOG_DUMP_GTID = 0x1E
BINLOG_DUMP_NON_BLOCK = 0x01  # end the dump at the binlog's end instead of waiting
BINLOG_THROUGH_POSITION = 0x02
BINLOG_THROUGH_GTID = 0x04  # COM_BINLOG_DUMP_GTID: the GTID set is given as data
MAX_PACKET = 0xFFFFFF  # a MySQL packet's largest payload; a longer one continues

# -- column types of a Table_map (MySQL's enum_field_types) -------------------------------

T_DECIMAL, T_TINY, T_SHORT, T_LONG, T_FLOAT, T_DOUBLE, T_NULL, T_TIMESTAMP = 0, 1, 2, 3, 4, 5, 6, 7
T_LONGLONG, T_INT24, T_DATE, T_TIME, T_DATETIME, T_YEAR = 8, 9, 10, 11, 12, 13
T_VARCHAR, T_BIT, T_TIMESTAMP2, T_DATETIME2, T_TIME2 = 15, 16, 17, 18, 19
T_JSON, T_NEWDECIMAL, T_ENUM, T_SET = 245, 246, 247, 248
T_TINY_BLOB, T_MEDIUM_BLOB, T_LONG_BLOB, T_BLOB, T_VAR_STRING, T_STRING, T_GEOMETRY = (
    249, 250, 251, 252, 253, 254, 255)

BINARY_CHARSET = 63  # the character set id of binary strings
