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

    from databus.binlog.request import parse_binlog_dump_gtid

    sid = uuid.UUID("f60a579f-13b9-42d0-9b1e-367bf61ef047")
    blocks = struct.pack("<Q", 1) + sid.bytes + struct.pack("<QQQ", 1, 1, 15)
    packet = (struct.pack("<HII", 0, 5400, 0) + struct.pack("<Q", 4)
              + struct.pack("<I", len(blocks)) + blocks)
    req = parse_binlog_dump_gtid(packet)
    assert req.gtids == f"{sid}:1-14"
    bare = struct.pack("<HII", 0, 5400, 0) + struct.pack("<Q", 4)
    assert parse_binlog_dump_gtid(bare).gtids == ""


@pytest.mark.parametrize("sql", [
    "SET @master_binlog_checksum='NONE'",
    "SET @mariadb_slave_capability=4",
    "set @master_heartbeat_period= 30000001024",
    "SET @slave_uuid= 'f60a579f-13b9-42d0-9b1e-367bf61ef047', @a = 1.5 ,@b=NULL;",
    "SET @a := 'x, @b=1'",
    "SET @a = 7, @b = ''",
])
def test_user_variables_read_without_sqlglot_equal_sqlglots_reading(sql: str) -> None:
    """The statements replication clients send on connect skip sqlglot (a measured ~0.3 ms
    of each); what they set is what the general path (sqlglot's parse, mysql-mimic's
    values) sets."""
    from mysql_mimic.intercept import expression_to_value
    from sqlglot import expressions as exp
    from sqlglot.dialects.dialect import Dialect

    from databus.binlog.sql import _SET_USER_VARS, _set_items, _user_var

    assert _SET_USER_VARS.fullmatch(sql)
    (statement,) = Dialect.get_or_raise("mysql").parse(sql)
    assert isinstance(statement, exp.Set)
    general = {_user_var(item): expression_to_value(item.this.expression)
               for item in statement.expressions}
    fast = _set_items(sql)
    assert fast == general
    assert [type(v) for v in fast.values()] == [type(v) for v in general.values()]


def test_a_negative_number_is_read_as_mysql_reads_it() -> None:
    """(mysql-mimic's reading refuses it as a complex expression.)"""
    from databus.binlog.sql import _set_items

    assert _set_items("SET @a = -7, @b = -0.5") == {"a": -7, "b": -0.5}


@pytest.mark.parametrize("sql", [
    "SET @master_binlog_checksum= @@global.binlog_checksum",  # not a literal
    "SET @a='it''s'", "SET @a='back\\\\slash'",  # quotes and escapes inside
    "SET @@session.sql_mode=''", "SET NAMES utf8mb4", "SET @a=1, autocommit=1",
    "SET @a=1.", "SET @a=1 garbage",
])
def test_anything_else_goes_through_sqlglot(sql: str) -> None:
    from databus.binlog.sql import _SET_USER_VARS

    assert _SET_USER_VARS.fullmatch(sql) is None
