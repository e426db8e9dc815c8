"""Start-up checks of a MariaDB/MySQL server used as a binlog source.

Capture needs row-based binary logging with full row images and full row
metadata, a server id, and replication privileges. :func:`check_server` looks
at what the server reports and refuses with one :class:`ConfigError` that
names every missing setting and how to fix it, before anything is captured.
The facts are gathered by :mod:`databus.sources.mysql.connection` (the only
module that talks to the driver).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from databus.core.errors import ConfigError
from databus.sources.common.urls import ServerUrl, parse_server_url
from databus.sources.config import MysqlSourceConfig, SourceTlsConfig


@dataclass(frozen=True)
class ServerFacts:
    """What a server reports about itself: global variables and the user's grants."""

    version: str
    variables: dict[str, str]
    grants: list[str]

    @property
    def is_mariadb(self) -> bool:
        return "mariadb" in self.version.lower()


@dataclass(frozen=True)
class MysqlUrl(ServerUrl):
    """Where and how to connect: the URL's parts, TLS and ``timeout`` (seconds a
    connection waits to connect, for each answer and to send, before the server counts
    as lost); ``repr`` never shows the password."""

    tls: SourceTlsConfig | None = None
    timeout: float = 30.0


def parse_mysql_url(url: str, *, password: str | None = None,
                    tls: SourceTlsConfig | None = None, timeout: float = 30.0) -> MysqlUrl:
    """``mysql://USER:PASS@HOST:PORT`` (user and password URL-encoded); ``password``
    (from a file or the environment) replaces the URL's."""
    u = parse_server_url(url, kind="mysql", schemes=("mysql", "mariadb"), port=3306,
                         user="root", password=password)
    return MysqlUrl(u.host, u.port, u.user, u.password, tls=tls, timeout=timeout)


def mysql_url(config: MysqlSourceConfig) -> MysqlUrl:
    """The connection settings of a MySQL source config (password file, TLS)."""
    return parse_mysql_url(config.url, password=config.password(), tls=config.tls,
                           timeout=config.network_timeout)


# (variable, wanted value, fix); values compared case-insensitively
_REQUIRED = [
    ("log_bin", "ON", "start the server with binary logging: log_bin=<basename> (and a server_id)"),
    ("binlog_format", "ROW", "SET GLOBAL binlog_format='ROW' (and binlog_format=ROW in the "
                             "server config so it survives a restart)"),
    ("binlog_row_image", "FULL", "SET GLOBAL binlog_row_image='FULL' (and in the server config)"),
    ("binlog_row_metadata", "FULL", "SET GLOBAL binlog_row_metadata='FULL' (MariaDB >= 10.5, "
                                    "MySQL >= 8.0.1; and in the server config)"),
]
_ALL = re.compile(r"GRANT ALL PRIVILEGES ON \*\.\* ", re.I)


def _has_global(grants: list[str], privilege: str) -> bool:
    for g in grants:
        if _ALL.match(g):
            return True
        m = re.match(r"GRANT (.+?) ON \*\.\* TO", g, re.I)
        if m and privilege.upper() in [p.strip().upper() for p in m.group(1).split(",")]:
            return True
    return False


def describe(facts: ServerFacts) -> str:
    """One line: what the server has and what this source makes of it (logged at start)."""
    v = {k.lower(): val for k, val in facts.variables.items()}
    shown = ("binlog_format", "binlog_row_image", "binlog_row_metadata", "binlog_checksum",
             "log_bin_compress", "gtid_mode", "binlog_transaction_compression",
             "binlog_row_value_options", "encrypt_binlog")
    have = ", ".join(f"{k}={v[k]}" for k in shown if k in v)
    return (f"server {facts.version}: {have}; supported: ROW format, FULL row image,"
            " compressed events (log_bin_compress), CRC32 or no checksums; refused: MySQL"
            " transaction compression, partial JSON updates, encrypted binlogs")


def check_server(facts: ServerFacts) -> None:
    """Raise one :class:`ConfigError` naming every problem; return if capture can start."""
    problems: list[str] = []
    v = {k.lower(): val for k, val in facts.variables.items()}
    for name, wanted, fix in _REQUIRED:
        have = v.get(name)
        if have is None:
            problems.append(f"{name} is not supported by server {facts.version}: {fix}")
        elif have.upper() != wanted:
            problems.append(f"{name} is {have}, needs {wanted}: {fix}")
    if v.get("server_id", "0") == "0":
        problems.append("server_id is 0: set server_id to a unique non-zero value")
    needed = ["REPLICATION SLAVE", "BINLOG MONITOR" if facts.is_mariadb else "REPLICATION CLIENT"]
    if facts.is_mariadb and not _has_global(facts.grants, "BINLOG MONITOR"):
        # MariaDB < 10.5 named it REPLICATION CLIENT
        needed[1] = "REPLICATION CLIENT" if _has_global(facts.grants, "REPLICATION CLIENT") \
            else "BINLOG MONITOR"
    for priv in needed:
        if not _has_global(facts.grants, priv):
            problems.append(f"the user lacks {priv}: GRANT {priv} ON *.* TO <user>")
    # MySQL 8 settings whose events this source does not decode: refused here, by name,
    # rather than met mid-stream (UnsupportedEventError would stop capture there)
    if v.get("binlog_transaction_compression", "OFF").upper() in ("ON", "1"):
        problems.append("binlog_transaction_compression is ON (zstd transaction payload"
                        " events are not supported): SET GLOBAL binlog_transaction_compression"
                        " = OFF")
    if "PARTIAL_JSON" in v.get("binlog_row_value_options", "").upper():
        problems.append("binlog_row_value_options is PARTIAL_JSON (partial JSON updates are not"
                        " supported): SET GLOBAL binlog_row_value_options = ''")
    if v.get("encrypt_binlog", "OFF").upper() in ("ON", "1"):
        problems.append("encrypt_binlog is ON: the binlog stream cannot be read encrypted")
    if problems:
        raise ConfigError("the server cannot be captured:\n  - " + "\n  - ".join(problems))
