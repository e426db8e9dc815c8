"""MySQL GTIDs (no MySQL server can be installed here: checked against the
documented layouts of the GTID event and COM_BINLOG_DUMP_GTID)."""

from __future__ import annotations

import struct

import pytest

from databus.core.errors import ConfigError
from databus.relay.config import parse_config
from databus.sources.mysql.connection import dump_gtid_packet
from databus.sources.mysql.events import mysql_gtid_set, parse_mysql_gtid

UUID = "3e11fa47-71ca-11e1-9e33-c80aa9429562"
RAW = bytes.fromhex(UUID.replace("-", ""))


def test_gtid_event_gives_uuid_and_number() -> None:
    body = bytes([1]) + RAW + struct.pack("<q", 23) + b"\x02" + b"\x00" * 16
    assert parse_mysql_gtid(memoryview(body)) == f"{UUID}:23"


def test_gtid_set_binary_form() -> None:
    other = "00000000-0000-0000-0000-000000000001"
    got = mysql_gtid_set(f"{UUID.upper()}:1-5:7,{other}:3")
    want = (struct.pack("<Q", 2)
            + RAW + struct.pack("<Q", 2) + struct.pack("<qq", 1, 6) + struct.pack("<qq", 7, 8)
            + bytes.fromhex(other.replace("-", "")) + struct.pack("<Q", 1)
            + struct.pack("<qq", 3, 4))
    assert got == want


@pytest.mark.parametrize("bad", ["nonsense", f"{UUID}", f"{UUID}:5-2", "abcd:1"])
def test_bad_gtid_sets(bad: str) -> None:
    with pytest.raises(ValueError):
        mysql_gtid_set(bad)
    with pytest.raises(ConfigError):
        dump_gtid_packet(1, bad)


def test_dump_gtid_request_layout() -> None:
    data = mysql_gtid_set(f"{UUID}:1-10")
    packet = dump_gtid_packet(77, f"{UUID}:1-10")
    command, flags, server_id, name_len, pos, size = struct.unpack_from("<BHIIQI", packet)
    assert (command, flags, server_id, name_len, pos, size) == (0x1E, 4, 77, 0, 4, len(data))
    assert packet[struct.calcsize("<BHIIQI"):] == data


@pytest.mark.parametrize(("gtid", "ok"), [("0-1-100", True), ("0-1-5,1-2-3", True),
                                          (f"{UUID}:1-100", True), (f"{UUID}:1:3-4", True),
                                          ("1-2", False), ("x", False)])
def test_config_accepts_both_flavours(gtid: str, ok: bool) -> None:
    raw = {"source": {"url": "mysql://root@db.example", "start_gtid": gtid}}
    if ok:
        assert parse_config(raw).source.start_gtid == gtid
    else:
        with pytest.raises(ConfigError):
            parse_config(raw)


def test_pymysql_errors_are_classified_by_named_numbers() -> None:
    """One classifier at the driver boundary: named error numbers decide the type."""
    import pymysql

    from databus.core.errors import (
        ConfigError,
        SourcePositionLostError,
        SourceUnavailableError,
        StatementError,
    )
    from databus.sources.mysql.checks import parse_mysql_url
    from databus.sources.mysql.connection import (
        CR_SERVER_LOST,
        ER_ACCESS_DENIED_ERROR,
        ER_MASTER_FATAL_ERROR_READING_BINLOG,
        ER_SERVER_SHUTDOWN,
        classify,
    )

    url = parse_mysql_url("mysql://u:secret@db.example:3307")
    err = classify(pymysql.err.OperationalError(ER_ACCESS_DENIED_ERROR, "denied"), "x", url)
    assert isinstance(err, ConfigError) and "secret" not in str(err)
    assert isinstance(classify(pymysql.err.OperationalError(
        ER_MASTER_FATAL_ERROR_READING_BINLOG, "purged"), "reading"), SourcePositionLostError)
    lost = classify(pymysql.err.OperationalError(CR_SERVER_LOST, "Lost connection"), "q", url)
    assert isinstance(lost, SourceUnavailableError) and "db.example:3307" in str(lost)
    refused = classify(pymysql.err.ProgrammingError(1146, "Table 'x.y' doesn't exist"),
                       "reading a chunk")
    assert isinstance(refused, StatementError) and "error 1146" in str(refused)
    assert "reading a chunk" in str(refused)
    assert isinstance(classify(OSError("reset"), "reading"), SourceUnavailableError)
    assert isinstance(classify(pymysql.err.OperationalError(ER_SERVER_SHUTDOWN, "bye"), "q"),
                      SourceUnavailableError)
