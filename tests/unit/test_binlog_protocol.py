"""What the server answers per client (VERSION()) and the dump requests it parses."""

from __future__ import annotations

import pytest

pytest.importorskip("mysql_mimic")

from databus.binlog.server import client_version

V = "8.0.36-databus"


@pytest.mark.parametrize("attrs", [
    {"_client_name": "libmariadb", "program_name": "mysqlbinlog"},
    {"_client_name": "libmariadb", "program_name": "mariadb-binlog"},
])
def test_mariadbs_binlog_tool_gets_the_5_5_5_prefix_mariadb_servers_use(
        attrs: dict[str, str]) -> None:
    assert client_version(V, attrs) == "5.5.5-" + V


@pytest.mark.parametrize("attrs", [
    None, {}, {"_client_name": "libmysql", "program_name": "mysqlbinlog"},
    {"_client_name": "pymysql"}, {"_client_name": "libmariadb", "program_name": "mariadb"},
])
def test_every_other_client_gets_mysql_8s_version(attrs: dict[str, str] | None) -> None:
    assert client_version(V, attrs) == V


def test_a_gtid_dump_without_the_through_gtid_flag_still_carries_its_set() -> None:
    """mysql-binlog-connector-java (Debezium) sends flags 0 and the set; MySQL reads it."""
    import struct
    import uuid

    from databus.binlog.dump import parse_binlog_dump_gtid

    sid = uuid.UUID("f60a579f-13b9-42d0-9b1e-367bf61ef047")
    blocks = struct.pack("<Q", 1) + sid.bytes + struct.pack("<QQQ", 1, 1, 15)
    packet = (struct.pack("<HII", 0, 5400, 0) + struct.pack("<Q", 4)
              + struct.pack("<I", len(blocks)) + blocks)
    req = parse_binlog_dump_gtid(packet)
    assert req.gtids == f"{sid}:1-14"
    bare = struct.pack("<HII", 0, 5400, 0) + struct.pack("<Q", 4)
    assert parse_binlog_dump_gtid(bare).gtids == ""
