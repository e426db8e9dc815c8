"""The VERSION() each client is answered (databus.binlog.server.client_version)."""

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
