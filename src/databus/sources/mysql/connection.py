"""The driver boundary of the MySQL source: the only module importing pymysql.

Driver errors are translated here: a server that cannot be reached is a
:class:`SourceUnavailableError` (transient), wrong credentials a
:class:`ConfigError`.
"""

from __future__ import annotations

from typing import Any

import pymysql

from databus.core.errors import ConfigError, SourceUnavailableError
from databus.sources.mysql.checks import MysqlUrl, ServerFacts

_ACCESS_DENIED = 1045


def connect(url: MysqlUrl, timeout: float = 10.0) -> Any:
    """A pymysql connection (autocommit)."""
    try:
        return pymysql.connect(host=url.host, port=url.port, user=url.user,
                               password=url.password, autocommit=True,
                               connect_timeout=int(max(1, timeout)))
    except pymysql.err.OperationalError as exc:
        if exc.args and exc.args[0] == _ACCESS_DENIED:
            raise ConfigError(f"access denied for {url.user}@{url.host}:{url.port}") from exc
        raise SourceUnavailableError(
            f"cannot reach MySQL/MariaDB at {url.host}:{url.port}: {exc}") from exc


def server_facts(url: MysqlUrl) -> ServerFacts:
    """Version, binlog-related global variables and the user's grants."""
    con = connect(url)
    try:
        with con.cursor() as cur:
            cur.execute("SELECT VERSION()")
            version = str(cur.fetchone()[0])
            cur.execute("SHOW GLOBAL VARIABLES WHERE Variable_name IN ('log_bin',"
                        " 'binlog_format', 'binlog_row_image', 'binlog_row_metadata',"
                        " 'server_id', 'binlog_checksum', 'gtid_mode')")
            variables = {str(k): str(v) for k, v in cur.fetchall()}
            cur.execute("SHOW GRANTS")
            grants = [str(r[0]) for r in cur.fetchall()]
    except pymysql.err.Error as exc:
        raise SourceUnavailableError(f"reading server settings failed: {exc}") from exc
    finally:
        con.close()
    return ServerFacts(version, variables, grants)
