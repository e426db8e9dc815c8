"""Start-up checks of the binlog source against private MariaDB servers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from databus.core.errors import ConfigError, SourceUnavailableError
from databus.sources.mysql import check_server, parse_mysql_url
from databus.sources.mysql.connection import server_facts
from tests.support.mariadb import BINLOG_SETTINGS, MariaDB
from tests.support.procs import free_port
from tests.support.sources import mysql_source


def _server(tmp: Path, **changes: str | None) -> Iterator[MariaDB]:
    settings: dict[str, str | None] = {**BINLOG_SETTINGS, **changes}
    m = MariaDB(tmp / "db", {k: v for k, v in settings.items() if v != "<off>"})
    with m:
        yield m


@pytest.fixture
def good(tmp_path: Path) -> Iterator[MariaDB]:
    yield from _server(tmp_path)


def test_a_well_configured_server_passes(good: MariaDB) -> None:
    facts = server_facts(parse_mysql_url(good.url))
    assert facts.is_mariadb
    check_server(facts)


def test_each_missing_setting_is_named_with_its_fix(tmp_path: Path) -> None:
    for m in _server(tmp_path, **{"binlog-format": "STATEMENT", "binlog-row-image": "MINIMAL",
                                  "binlog-row-metadata": "MINIMAL"}):
        with pytest.raises(ConfigError) as err:
            check_server(server_facts(parse_mysql_url(m.url)))
    text = str(err.value)
    for name in ("binlog_format is STATEMENT", "binlog_row_image is MINIMAL",
                 "binlog_row_metadata is MINIMAL", "SET GLOBAL"):
        assert name in text
    assert "log_bin" not in text


def test_binlog_off_is_refused(tmp_path: Path) -> None:
    for m in _server(tmp_path, **{"log-bin": "<off>"}):
        with pytest.raises(ConfigError, match="log_bin is OFF"):
            check_server(server_facts(parse_mysql_url(m.url)))


def test_missing_privileges_are_named(good: MariaDB) -> None:
    good.execute("CREATE USER 'plain'@'127.0.0.1' IDENTIFIED BY 'pw'",
                 "GRANT SELECT ON *.* TO 'plain'@'127.0.0.1'")
    with pytest.raises(ConfigError) as err:
        check_server(server_facts(parse_mysql_url(f"mysql://plain:pw@127.0.0.1:{good.port}")))
    assert "REPLICATION SLAVE" in str(err.value) and "BINLOG MONITOR" in str(err.value)
    good.execute("GRANT REPLICATION SLAVE, BINLOG MONITOR ON *.* TO 'plain'@'127.0.0.1'")
    check_server(server_facts(parse_mysql_url(f"mysql://plain:pw@127.0.0.1:{good.port}")))


def test_unreachable_server_and_bad_credentials(good: MariaDB) -> None:
    with pytest.raises(SourceUnavailableError):
        server_facts(parse_mysql_url(f"mysql://root@127.0.0.1:{free_port()}"))
    with pytest.raises(ConfigError, match="access denied"):
        server_facts(parse_mysql_url(f"mysql://nobody:x@127.0.0.1:{good.port}"))
    with pytest.raises(ConfigError):
        parse_mysql_url("postgres://x")


def test_default_initial_snapshot_names_the_signal_table_grant(good: MariaDB) -> None:
    """The default mode (initial) needs the signal table; a replication-only user is
    told how to fix it, and streams fine with snapshot_mode no_data."""
    from databus.core.errors import StatementError

    good.execute("CREATE USER 'repl'@'127.0.0.1' IDENTIFIED BY 'pw'",
                 "GRANT SELECT, REPLICATION SLAVE, BINLOG MONITOR ON *.* TO 'repl'@'127.0.0.1'",
                 "CREATE DATABASE IF NOT EXISTS app",
                 "CREATE TABLE IF NOT EXISTS app.t (id INT PRIMARY KEY)")
    url = f"mysql://repl:pw@127.0.0.1:{good.port}"
    with pytest.raises(StatementError) as err:
        mysql_source(url, [r"app\..*"])
    assert "databus.signals" in str(err.value) and "snapshot_mode: no_data" in str(err.value)
    mysql_source(url, [r"app\..*"], snapshot_mode="no_data").close()
    good.execute("CREATE DATABASE databus", "GRANT CREATE, INSERT ON databus.* TO"
                 " 'repl'@'127.0.0.1'")
    mysql_source(url, [r"app\..*"]).close()
