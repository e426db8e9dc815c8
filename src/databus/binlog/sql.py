"""The SQL a replication client sends, answered as a MySQL 8 source would.

:class:`BinlogSession` is a ``mysql-mimic`` session (sqlglot parses every statement; the
session's middlewares intercept them). Answered:

* ``SELECT @@version``, ``VERSION()``, ``@@server_id``, ``@@server_uuid``, ``@@gtid_mode``,
  ``@@binlog_checksum``, ``@@global.binlog_row_metadata`` / ``binlog_row_image`` /
  ``binlog_format``, ``@@global.gtid_executed`` / ``gtid_purged`` (read from the store at
  each statement) and the other system variables of :func:`system_variables`; ``SHOW
  [GLOBAL|SESSION] VARIABLES [LIKE ...|WHERE ...]``;
* ``SET @var = value`` for user variables, among them the ones the dump reads:
  ``@master_binlog_checksum`` / ``@source_binlog_checksum`` (``NONE`` or ``CRC32``, or
  ``@@global.binlog_checksum``) and ``@master_heartbeat_period`` / ``@source_heartbeat_period``
  (nanoseconds); ``SET NAMES``, ``SET autocommit`` and other session settings;
* ``SHOW MASTER STATUS`` / ``SHOW BINARY LOG STATUS``, ``SHOW BINARY LOGS``, ``SHOW BINLOG
  EVENTS [IN 'file'] [FROM pos] [LIMIT [offset,] n]``, ``SHOW REPLICAS`` / ``SHOW SLAVE
  HOSTS``, ``SHOW GRANTS``;
* ``SELECT ... FROM information_schema.COLUMNS`` (and ``TABLES``, ``SCHEMATA``, ``SHOW
  DATABASES``, ``SHOW TABLES``, ``SHOW COLUMNS``) over the captured tables' columns, and
  ``SHOW CREATE TABLE`` for them, from the :data:`~databus.binlog.catalog.Catalog`
  (:class:`~databus.binlog.catalog.AnnouncedCatalog`: every table the binlog has defined
  up to its end);
* ``FLUSH TABLES WITH READ LOCK`` holds the binlog where it is (the converter's appends
  wait) until ``UNLOCK TABLES`` or the connection's end, as MySQL's global read lock
  holds commits: Debezium's schema snapshot reads the position and the catalog under it.
  ``START TRANSACTION [WITH CONSISTENT SNAPSHOT]``, ``BEGIN``, ``COMMIT``, ``ROLLBACK``
  are accepted and change nothing (the service has no table data to read: Debezium's
  ``snapshot.mode`` must be ``no_data`` or ``never``). ``SET SESSION lock_wait_timeout``
  and ``innodb_lock_wait_timeout`` are accepted.

Anything else is MySQL error 1235 (``ER_NOT_SUPPORTED_YET``) naming the statement; a
statement sqlglot cannot parse is error 1064. The connection stays usable either way.
"""

from __future__ import annotations

import asyncio
import re
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from mysql_mimic.errors import ErrorCode, MysqlError
from mysql_mimic.intercept import expression_to_value
from mysql_mimic.results import ResultColumn, ResultSet
from mysql_mimic.schema import InfoSchema, info_schema_tables
from mysql_mimic.session import Query, Session
from mysql_mimic.types import ColumnType
from mysql_mimic.variables import SYSTEM_VARIABLES, GlobalVariables, SessionVariables
from sqlglot import expressions as exp
from sqlglot.errors import ExecuteError, ParseError
from sqlglot.executor import execute
from sqlglot.executor.table import Table

from databus.binlog.binfile import SERVER_VERSION
from databus.binlog.catalog import Catalog
from databus.binlog.events import TYPE_NAMES, event_info
from databus.binlog.store import BinlogStore
from databus.core.mysqlwire import (
    BIN_LOG_HEADER_SIZE,
    HEADER_LEN,
    LEN_OFFSET,
    LOG_POS_OFFSET,
    SERVER_ID_OFFSET,
    TYPE_OFFSET,
)

ER_NO_SUCH_TABLE = 1146
ER_ERROR_WHEN_EXECUTING_COMMAND = 1220


@dataclass(frozen=True)
class ServiceFacts:
    """The service's values that SQL answers (and the handshake's version)."""

    server_id: int
    server_uuid: str
    version: str = SERVER_VERSION
    hostname: str = "databus"
    port: int = 3306
    log_bin_basename: str = "databus-bin"
    max_binlog_size: int = 1 << 30
    expire_logs_seconds: int = 0


# a MySQL 8 source's replication settings, read-only (the type is the value's)
_SOURCE_SETTINGS: dict[str, str | int] = {
    "version_comment": "Databus binlog service", "log_bin": "ON", "binlog_format": "ROW",
    "binlog_row_image": "FULL", "binlog_row_metadata": "FULL", "binlog_row_value_options": "",
    "binlog_checksum": "CRC32", "binlog_transaction_compression": "OFF", "gtid_mode": "ON",
    "enforce_gtid_consistency": "ON", "gtid_executed": "", "gtid_purged": "",
    "log_replica_updates": "ON", "log_slave_updates": "ON", "read_only": "ON",
    "character_set_system": "utf8mb3", "rpl_semi_sync_master_enabled": "OFF",
}
# what a session may change (clients set them; nothing here depends on them)
_SESSION_SETTINGS: dict[str, str | int] = {
    "sql_mode": "ONLY_FULL_GROUP_BY,STRICT_TRANS_TABLES,NO_ZERO_IN_DATE,NO_ZERO_DATE,"
                "ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION",
    "default_storage_engine": "InnoDB", "transaction_isolation": "REPEATABLE-READ",
    "tx_isolation": "REPEATABLE-READ", "collation_server": "utf8mb4_0900_ai_ci",
    "net_read_timeout": 30, "lock_wait_timeout": 31536000, "innodb_lock_wait_timeout": 50,
}


def system_variables(facts: ServiceFacts) -> dict[str, tuple[Any, Any, bool]]:
    """mysql-mimic's system variables plus a MySQL 8 source's replication settings
    (name -> (type, default, dynamic))."""
    fixed = {**_SOURCE_SETTINGS, "version": facts.version, "server_id": facts.server_id,
             "server_uuid": facts.server_uuid, "hostname": facts.hostname,
             "port": facts.port, "log_bin_basename": facts.log_bin_basename,
             "binlog_expire_logs_seconds": facts.expire_logs_seconds,
             "max_binlog_size": facts.max_binlog_size}
    out = dict(SYSTEM_VARIABLES)
    out.update({name: (type(value), value, False) for name, value in fixed.items()})
    out.update({name: (type(value), value, True) for name, value in _SESSION_SETTINGS.items()})
    return out


class BinlogSession(Session):  # type: ignore[misc]
    """One client's session (see the module docstring). ``replicas`` lists the
    registered replicas of the server now."""

    def __init__(self, facts: ServiceFacts, store: BinlogStore, catalog: Catalog | None,
                 replicas: Callable[[], list[dict[str, object]]]) -> None:
        super().__init__(SessionVariables(GlobalVariables(system_variables(facts))))
        self.facts = facts
        self.store = store
        self.catalog = catalog
        self.replicas = replicas
        self.user_vars: dict[str, Any] = {}
        # after mysql-mimic's first middleware, which puts the values of @@variables and
        # VERSION() & co into the statement (so @@global.binlog_checksum is 'CRC32' here)
        self.middlewares.insert(1, self._replication_middleware)

    # -- what the dump reads ----------------------------------------------------------

    def checksum_choice(self) -> bool | None:
        """@master_binlog_checksum: True (CRC32), False (NONE), None (not set/unknown)."""
        value = self.user_vars.get("master_binlog_checksum",
                                   self.user_vars.get("source_binlog_checksum"))
        text = str(value).upper() if value is not None else ""
        return True if text == "CRC32" else False if text == "NONE" else None

    def heartbeat_period(self) -> float | None:
        """@master_heartbeat_period in seconds (0 = no heartbeats; None = not set)."""
        value = self.user_vars.get("master_heartbeat_period",
                                   self.user_vars.get("source_heartbeat_period"))
        if value is None:
            return None
        try:
            return max(0.0, float(value) / 1e9)
        except (TypeError, ValueError):
            return 0.0

    # -- statements -------------------------------------------------------------------

    async def handle_query(self, sql: str, attrs: dict[str, str]) -> Any:
        self.variables.set("gtid_executed", self.store.gtid_executed(), force=True)
        self.variables.set("gtid_purged", self.store.gtid_purged(), force=True)
        text = " ".join(sql.strip().rstrip(";").upper().split())
        if text.startswith("FLUSH TABLES") and text.endswith("WITH READ LOCK"):
            # the binlog stands still until UNLOCK TABLES or the connection ends, as
            # MySQL's global read lock holds commits (Debezium's schema snapshot reads
            # the position and the tables under it); sqlglot does not parse it
            await asyncio.to_thread(self.store.hold, self)
            return [], []
        if text in ("UNLOCK TABLES", "UNLOCK INSTANCE"):
            self.store.release(self)
            return [], []
        if text == "SELECT VERSION()":
            # every client's first statement (mariadb-binlog's check_master_version),
            # answered without sqlglot, whose parse and executor took ~2 ms of it (timed
            # in this method; a mariadb-binlog connection's whole setup is ~8-10 ms). A
            # typed column: mysql-mimic infers an untyped one's type through an async
            # generator it leaves unfinished, which the loop then closes in a task of its
            # own, woken through its self-pipe (~0.05 ms of every connection)
            return ResultSet([(self.variables.get("version"),)], _VERSION_COLUMNS)
        if _SET_USER_VARS.fullmatch(sql):
            # SET @master_binlog_checksum='NONE' & co, every replication client's set-up:
            # the literals read here (sqlglot's parse and mysql-mimic's middlewares took
            # ~0.3 ms of each, a tenth of a mariadb-binlog connection's set-up)
            self.user_vars.update(_set_items(sql))
            return [], []
        if text.startswith("START TRANSACTION") or text in ("BEGIN", "COMMIT", "ROLLBACK"):
            # nothing here changes; a transaction's consistent snapshot is the read lock
            return [], []
        try:
            return await super().handle_query(sql, attrs)
        except ParseError as exc:
            raise MysqlError(
                "You have an error in your SQL syntax; check the manual that corresponds"
                f" to your MySQL server version for the right syntax: {sql[:200]!r}",
                code=ErrorCode.PARSE_ERROR) from exc

    async def query(self, expression: exp.Expression, sql: str, attrs: dict[str, str]) -> Any:
        raise MysqlError(f"This statement is not supported by the databus binlog server:"
                         f" {sql[:200]}", code=ErrorCode.NOT_SUPPORTED_YET)

    async def _replication_middleware(self, q: Query) -> Any:
        e = q.expression
        if isinstance(e, exp.Set) and any(_user_var(i) for i in e.expressions):
            return self._set_user_vars(e)
        if isinstance(e, exp.Command):
            text = " ".join(f"{e.name} {e.text('expression')}".upper().split())
            if text in ("SHOW BINARY LOG STATUS", "SHOW MASTER STATUS"):
                return self._master_status()
            if text.startswith("SHOW GRANTS"):
                return self._grants()
            raise MysqlError(f"This statement is not supported by the databus binlog"
                             f" server: {q.sql[:200]}", code=ErrorCode.NOT_SUPPORTED_YET)
        if isinstance(e, exp.Show):
            kind = e.name.upper()
            if kind in ("MASTER STATUS", "BINARY LOG STATUS"):
                return self._master_status()
            if kind in ("BINARY LOGS", "MASTER LOGS"):
                return [(n, size, "No") for n, size in self.store.files()], [
                    "Log_name", "File_size", "Encrypted"]
            if kind == "BINLOG EVENTS":
                return self._binlog_events(e)
            if kind in ("REPLICAS", "SLAVE HOSTS"):
                return self._replicas(kind)
            if kind == "GRANTS":
                return self._grants()
            if kind == "VARIABLES":
                return self._show_variables_ci(e)
            if kind == "CREATE TABLE":
                return self._create_table(e.text("db") or self.database or "", e.text("target"))
        if isinstance(e, exp.Select) and any(
                isinstance(p, exp.Parameter) for p in e.find_all(exp.Parameter)):
            return self._select_user_vars(e, q.sql)
        return await q.next()

    def _set_user_vars(self, e: exp.Set) -> Any:
        values: dict[str, Any] = {}
        for item in e.expressions:
            name = _user_var(item)
            if name is None:
                raise MysqlError("Mixing user and system variables in one SET is not"
                                 " supported by the databus binlog server",
                                 code=ErrorCode.NOT_SUPPORTED_YET)
            values[name] = expression_to_value(item.this.expression)
        self.user_vars.update(values)
        return [], []

    def _select_user_vars(self, e: exp.Select, sql: str) -> Any:
        names, row = [], []
        for proj in e.expressions:
            inner = proj.this if isinstance(proj, exp.Alias) else proj
            if not isinstance(inner, exp.Parameter):
                raise MysqlError(f"This statement is not supported by the databus binlog"
                                 f" server: {sql[:200]}", code=ErrorCode.NOT_SUPPORTED_YET)
            var = inner.name.lower()
            names.append(proj.alias if isinstance(proj, exp.Alias) else f"@{inner.name}")
            value = self.user_vars.get(var)
            row.append(None if value is None else str(value))
        return [tuple(row)], names

    def _show_variables_ci(self, e: exp.Show) -> Any:
        """SHOW VARIABLES [LIKE|WHERE]: MySQL compares names case-insensitively
        (mysql-mimic's LIKE does not; clients ask for 'BINLOG_CHECKSUM')."""
        table = Table(("variable_name", "value"))
        for name, value in self.variables.list():
            table.append((name, _variable_text(value)))
        cond: exp.Expression | None = None
        like = e.args.get("like")
        if like is not None:
            cond = exp.Like(this=exp.column("variable_name"), expression=like.copy())
        elif e.args.get("where") is not None:
            cond = e.args["where"].this.copy()
        select = exp.select("variable_name", "value").from_("vars")
        if cond is not None:
            select = select.where(cond.transform(_case_insensitive))
        try:
            result = execute(select, tables={"vars": table})
        except ExecuteError as exc:
            raise MysqlError(f"Unsupported SHOW VARIABLES condition: {e.sql('mysql')}",
                             code=ErrorCode.NOT_SUPPORTED_YET) from exc
        return result.rows, ["Variable_name", "Value"]

    def _master_status(self) -> Any:
        end = self.store.end()
        return [(end.file, end.pos, "", "", self.store.gtid_executed())], [
            "File", "Position", "Binlog_Do_DB", "Binlog_Ignore_DB", "Executed_Gtid_Set"]

    def _grants(self) -> Any:
        user = self.username or ""
        return [(f"GRANT SELECT, RELOAD, SHOW DATABASES, REPLICATION SLAVE, REPLICATION"
                  f" CLIENT ON *.* TO `{user}`@`%`",)], [f"Grants for {user}@%"]

    def _replicas(self, kind: str) -> Any:
        rows = [(r["server_id"], r["host"], r["port"], self.facts.server_id, "")
                for r in self.replicas()]
        if kind == "REPLICAS":
            return rows, ["Server_Id", "Host", "Port", "Source_Id", "Replica_UUID"]
        return rows, ["Server_id", "Host", "Port", "Master_id", "Slave_UUID"]

    def _binlog_events(self, e: exp.Show) -> Any:
        files = [n for n, _ in self.store.files()]
        name = e.text("log") or (files[0] if files else "")
        if name not in files:
            raise MysqlError("Error when executing command SHOW BINLOG EVENTS: Could not"
                             " find target log", code=ER_ERROR_WHEN_EXECUTING_COMMAND)
        start = _int_arg(e, "position", BIN_LOG_HEADER_SIZE)
        offset, limit = _int_arg(e, "offset", 0), _int_arg(e, "limit", -1)
        end = self.store.committed_size(name)
        rows: list[tuple[Any, ...]] = []
        with self.store.path(name).open("rb") as f:
            data = f.read(end)
        pos = max(start, BIN_LOG_HEADER_SIZE)
        index = 0
        while pos + HEADER_LEN <= len(data) and (limit < 0 or len(rows) < limit):
            (length,) = struct.unpack_from("<I", data, pos + LEN_OFFSET)
            if length < HEADER_LEN or pos + length > len(data):
                raise MysqlError("Error when executing command SHOW BINLOG EVENTS: Wrong"
                                 " offset or I/O error", code=ER_ERROR_WHEN_EXECUTING_COMMAND)
            if index >= offset:
                etype = data[pos + TYPE_OFFSET]
                (sid,) = struct.unpack_from("<I", data, pos + SERVER_ID_OFFSET)
                (end_pos,) = struct.unpack_from("<I", data, pos + LOG_POS_OFFSET)
                rows.append((name, pos, TYPE_NAMES.get(etype, f"Unknown({etype})"), sid,
                             end_pos, event_info(etype, data[pos:pos + length])))
            index += 1
            pos += length
        return rows, ["Log_name", "Pos", "Event_type", "Server_id", "End_log_pos", "Info"]

    def _create_table(self, db: str, table: str) -> Any:
        cols = (self.catalog() if self.catalog else {}).get((db, table))
        if cols is None:
            raise MysqlError(f"Table '{db}.{table}' doesn't exist", code=ER_NO_SUCH_TABLE)
        lines = []
        for c in cols:
            text = f"  `{c.name}` {c.column_type}"
            if c.charset and c.collation:
                text += f" CHARACTER SET {c.charset} COLLATE {c.collation}"
            text += "" if c.nullable else " NOT NULL"
            lines.append(text + (" DEFAULT NULL" if c.nullable else ""))
        keys = [c.name for c in cols if c.key == "PRI"]
        if keys:
            lines.append("  PRIMARY KEY (" + ",".join(f"`{k}`" for k in keys) + ")")
        ddl = (f"CREATE TABLE `{table}` (\n" + ",\n".join(lines)
               + "\n) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_0900_ai_ci")
        return [(table, ddl)], ["Table", "Create Table"]

    # -- information_schema -----------------------------------------------------------

    async def schema(self) -> InfoSchema:
        tables = info_schema_tables([])
        info = tables["information_schema"]
        seen_dbs: set[str] = set()
        catalog = await asyncio.to_thread(self.catalog) if self.catalog else {}
        for (db, table), cols in sorted(catalog.items()):
            seen_dbs.add(db)
            for i, c in enumerate(cols, start=1):
                info["columns"].append((
                    "def", db, table, c.name, i, None, "YES" if c.nullable else "NO",
                    c.data_type, c.char_max_length,
                    c.char_max_length * 4 if c.char_max_length is not None else None,
                    c.numeric_precision, c.numeric_scale, None, c.charset, c.collation,
                    c.column_type, c.key, "", "select", "", "", None))
            info["tables"].append((
                "def", db, table, "BASE TABLE", "InnoDB", 10, "Dynamic", None, None, None,
                None, None, None, None, None, None, None, "utf8mb4_0900_ai_ci", None, "", ""))
        for db in sorted(seen_dbs):
            info["schemata"].append(("def", db, "utf8mb4", "utf8mb4_0900_ai_ci", None))
        return InfoSchema(tables)


# ``SET @name = literal[, ...]``: a quoted string without quotes or backslashes inside,
# an integer, a decimal or NULL (anything else goes through sqlglot)
_SET_ITEM = (r"@([A-Za-z0-9_$.]+)\s*:?=\s*('([^'\\]*)'|(-?\d*\.\d+(?:[eE][-+]?\d+)?)"
             r"|(-?\d+)|(NULL))")
# SELECT VERSION()'s column, typed as mysql-mimic would infer it (a string)
_VERSION_COLUMNS = [ResultColumn("VERSION()", ColumnType.STRING)]
_SET_USER_VARS = re.compile(rf"\s*SET\s+{_SET_ITEM}(?:\s*,\s*{_SET_ITEM})*\s*;?\s*",
                            re.IGNORECASE)
_SET_ITEM_RE = re.compile(_SET_ITEM, re.IGNORECASE)


def _set_items(sql: str) -> dict[str, Any]:
    """The user variables of a statement :data:`_SET_USER_VARS` matched, with their values
    as mysql-mimic gives them (str, int, float or None)."""
    out: dict[str, Any] = {}
    for m in _SET_ITEM_RE.finditer(sql):
        name, _, text, decimal, integer, _null = m.groups()
        out[name.lower()] = (text if text is not None else int(integer)
                             if integer is not None else float(decimal)
                             if decimal is not None else None)
    return out


def _user_var(item: exp.Expression) -> str | None:
    """The name of the user variable a SET item assigns (``@name = ...``), else None."""
    assign = item.this if isinstance(item, exp.SetItem) else None
    if isinstance(assign, exp.EQ) and isinstance(assign.this, exp.Parameter):
        return str(assign.this.name).lower()
    return None


def _variable_text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return "ON" if value else "OFF"
    return str(value)


def _case_insensitive(node: exp.Expression) -> exp.Expression:
    if isinstance(node, exp.Column):
        return exp.Lower(this=node.copy())
    if isinstance(node, exp.Literal) and node.is_string:
        return exp.Literal.string(str(node.this).lower())
    return node


def _int_arg(e: exp.Show, arg: str, default: int) -> int:
    node = e.args.get(arg)
    if node is None:
        return default
    try:
        return int(node.name)
    except ValueError as exc:
        raise MysqlError(f"Invalid {arg} in SHOW BINLOG EVENTS: {node.sql()}",
                         code=ErrorCode.PARSE_ERROR) from exc
