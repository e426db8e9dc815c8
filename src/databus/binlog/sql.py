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
  ``SHOW CREATE TABLE`` for them, from the :data:`Catalog` (:class:`AnnouncedCatalog`:
  every table the binlog has defined up to its end);
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

from databus.binlog.dump import (
    BIN_LOG_HEADER_SIZE,
    HEADER_LEN,
    LEN_OFFSET,
    LOG_POS_OFFSET,
    SERVER_ID_OFFSET,
    TYPE_OFFSET,
)
from databus.binlog.store import SERVER_VERSION, BinlogStore

ER_NO_SUCH_TABLE = 1146
ER_ERROR_WHEN_EXECUTING_COMMAND = 1220

EVENT_TYPE_NAMES = {
    2: "Query", 3: "Stop", 4: "Rotate", 15: "Format_desc", 16: "Xid", 19: "Table_map",
    27: "Heartbeat", 29: "Rows_query", 30: "Write_rows", 31: "Update_rows",
    32: "Delete_rows", 33: "Gtid", 34: "Anonymous_Gtid", 35: "Previous_gtids",
}


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


@dataclass(frozen=True)
class ColumnInfo:
    """One captured column as information_schema.COLUMNS shows it."""

    name: str
    data_type: str  # "bigint", "varchar", ...
    column_type: str  # "bigint", "varchar(255)", "decimal(10,2)", ...
    nullable: bool = True
    key: str = ""  # "PRI" for a primary-key column
    charset: str | None = None
    collation: str | None = None
    char_max_length: int | None = None
    numeric_precision: int | None = None
    numeric_scale: int | None = None


# (db, table) -> columns in order; a callable so that schema changes show at once
Catalog = Callable[[], dict[tuple[str, str], list[ColumnInfo]]]


def system_variables(facts: ServiceFacts) -> dict[str, tuple[Any, Any, bool]]:
    """mysql-mimic's system variables plus a MySQL 8 source's replication settings
    (name -> (type, default, dynamic))."""
    out = dict(SYSTEM_VARIABLES)
    out.update({
        "version": (str, facts.version, False),
        "version_comment": (str, "Databus binlog service", False),
        "server_id": (int, facts.server_id, False),
        "server_uuid": (str, facts.server_uuid, False),
        "hostname": (str, facts.hostname, False),
        "port": (int, facts.port, False),
        "log_bin": (str, "ON", False),
        "log_bin_basename": (str, facts.log_bin_basename, False),
        "binlog_format": (str, "ROW", False),
        "binlog_row_image": (str, "FULL", False),
        "binlog_row_metadata": (str, "FULL", False),
        "binlog_row_value_options": (str, "", False),
        "binlog_checksum": (str, "CRC32", False),
        "binlog_transaction_compression": (str, "OFF", False),
        "binlog_expire_logs_seconds": (int, facts.expire_logs_seconds, False),
        "max_binlog_size": (int, facts.max_binlog_size, False),
        "gtid_mode": (str, "ON", False),
        "enforce_gtid_consistency": (str, "ON", False),
        "gtid_executed": (str, "", False),
        "gtid_purged": (str, "", False),
        "log_replica_updates": (str, "ON", False),
        "log_slave_updates": (str, "ON", False),
        "read_only": (str, "ON", False),
        "sql_mode": (str, "ONLY_FULL_GROUP_BY,STRICT_TRANS_TABLES,NO_ZERO_IN_DATE,"
                     "NO_ZERO_DATE,ERROR_FOR_DIVISION_BY_ZERO,NO_ENGINE_SUBSTITUTION", True),
        "default_storage_engine": (str, "InnoDB", True),
        "transaction_isolation": (str, "REPEATABLE-READ", True),
        "tx_isolation": (str, "REPEATABLE-READ", True),
        "character_set_system": (str, "utf8mb3", False),
        "collation_server": (str, "utf8mb4_0900_ai_ci", True),
        "net_read_timeout": (int, 30, True),
        "lock_wait_timeout": (int, 31536000, True),
        "innodb_lock_wait_timeout": (int, 50, True),
        "rpl_semi_sync_master_enabled": (str, "OFF", False),
    })
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
                rows.append((name, pos, EVENT_TYPE_NAMES.get(etype, f"Unknown({etype})"), sid,
                             end_pos, _event_info(etype, data[pos:pos + length])))
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


def _event_info(etype: int, ev: bytes) -> str:
    """The Info column of SHOW BINLOG EVENTS, MySQL's wording for the common events."""
    body = ev[HEADER_LEN:]
    try:
        if etype == 15:
            version = body[2:52].rstrip(b"\x00").decode()
            return f"Server ver: {version}, Binlog ver: {struct.unpack_from('<H', body)[0]}"
        if etype == 4:
            (pos,) = struct.unpack_from("<Q", body)
            return f"{body[8:-4].decode()};pos={pos}"
        if etype == 33:
            import uuid

            sid = uuid.UUID(bytes=bytes(body[1:17]))
            (gno,) = struct.unpack_from("<q", body, 17)
            return f"SET @@SESSION.GTID_NEXT= '{sid}:{gno}'"
        if etype == 16:
            return f"COMMIT /* xid={struct.unpack_from('<Q', body)[0]} */"
        if etype == 2:
            db_len, n_status = body[8], struct.unpack_from("<H", body, 11)[0]
            start = 13 + n_status
            db = body[start:start + db_len].decode("utf-8", "replace")
            sql = body[start + db_len + 1:-4].decode("utf-8", "replace")
            return f"use `{db}`; {sql}" if db and sql.upper() != "BEGIN" else sql
        if etype == 19:
            table_id = int.from_bytes(body[:6], "little")
            db_len = body[8]
            db = body[9:9 + db_len].decode("utf-8", "replace")
            t_len = body[10 + db_len]
            table = body[11 + db_len:11 + db_len + t_len].decode("utf-8", "replace")
            return f"table_id: {table_id} ({db}.{table})"
        if etype in (30, 31, 32):
            table_id = int.from_bytes(body[:6], "little")
            flags = struct.unpack_from("<H", body, 6)[0]
            return f"table_id: {table_id}" + (" flags: STMT_END_F" if flags & 1 else "")
    except (struct.error, IndexError, UnicodeDecodeError, ValueError):
        return ""
    return ""


# -- the catalog, read back from the binlog's own Table_map events -------------------------

_CHARSETS = {8: ("latin1", "latin1_swedish_ci", 1), 33: ("utf8mb3", "utf8mb3_general_ci", 3),
             45: ("utf8mb4", "utf8mb4_general_ci", 4), 46: ("utf8mb4", "utf8mb4_bin", 4),
             63: ("binary", "binary", 1), 255: ("utf8mb4", "utf8mb4_0900_ai_ci", 4)}
_INT_NAMES = {1: "tinyint", 2: "smallint", 9: "mediumint", 3: "int", 8: "bigint"}
_META_LEN = {4: 1, 5: 1, 252: 1, 255: 1, 245: 1, 15: 2, 253: 2, 246: 2, 16: 2, 254: 2,
             247: 2, 248: 2, 17: 1, 18: 1, 19: 1}


def _packed(data: bytes, off: int) -> tuple[int, int]:
    first = data[off]
    if first < 251:
        return first, off + 1
    size = {252: 2, 253: 3, 254: 8}[first]
    return int.from_bytes(data[off + 1:off + 1 + size], "little"), off + 1 + size


def _column_type(code: int, meta: bytes, unsigned: bool, charset: int | None) -> str:
    mbmax = _CHARSETS.get(charset or 63, ("", "", 1))[2]
    binary = charset in (None, 63)
    if code in _INT_NAMES:
        return _INT_NAMES[code] + (" unsigned" if unsigned else "")
    if code in (4, 5):
        return "float" if code == 4 else "double"
    if code == 246:
        return f"decimal({meta[0]},{meta[1]})"
    if code in (17, 18, 19):
        name = {17: "timestamp", 18: "datetime", 19: "time"}[code]
        return f"{name}({meta[0]})" if meta[0] else name
    if code in (15, 253):
        n = int.from_bytes(meta[:2], "little")
        return f"varbinary({n})" if binary else f"varchar({n // mbmax})"
    if code == 252:
        size = {1: "tiny", 2: "", 3: "medium", 4: "long"}.get(meta[0], "long")
        return size + ("blob" if binary else "text")
    if code == 254:
        real, n = meta[0], meta[1]
        if real == 247:
            return "enum"
        if real == 248:
            return "set"
        return f"binary({n})" if binary else f"char({n // mbmax})"
    if code == 16:
        return f"bit({meta[0] + meta[1] * 8})"
    return {10: "date", 13: "year", 245: "json", 7: "timestamp", 12: "datetime",
            11: "time"}.get(code, "blob")


def parse_table_map(body: bytes) -> tuple[str, str, list[ColumnInfo]]:
    """(db, table, columns) of a Table_map event body (header and checksum removed),
    from its optional metadata (binlog_row_metadata=FULL: names, signedness, charsets,
    primary key)."""
    from databus.binlog.types import CHARACTER_TYPES, NUMERIC_TYPES

    off = 8
    db = body[off + 1:off + 1 + body[off]].decode("utf-8", "replace")
    off += 2 + body[off]
    table = body[off + 1:off + 1 + body[off]].decode("utf-8", "replace")
    off += 2 + body[off]
    n, off = _packed(body, off)
    types = list(body[off:off + n])
    off += n
    meta_len, off = _packed(body, off)
    meta_end = off + meta_len
    metas = []
    for t in types:
        k = _META_LEN.get(t, 0)
        metas.append(bytes(body[off:off + k]))
        off += k
    off = meta_end
    nulls = body[off:off + (n + 7) // 8]
    off += (n + 7) // 8
    names = [f"col{i + 1}" for i in range(n)]
    unsigned = [False] * n
    charsets: list[int | None] = [None] * n
    pk: set[int] = set()
    char_cols = [i for i, t in enumerate(types) if t in CHARACTER_TYPES]
    num_cols = [i for i, t in enumerate(types) if t in NUMERIC_TYPES]
    while off < len(body):
        kind = body[off]
        length, off = _packed(body, off + 1)
        value, off = body[off:off + length], off + length
        if kind == 1:  # SIGNEDNESS
            for j, i in enumerate(num_cols):
                unsigned[i] = bool(value[j // 8] & (0x80 >> (j % 8)))
        elif kind == 2:  # DEFAULT_CHARSET: default, then (column, charset) pairs
            default, p = _packed(value, 0)
            exceptions = {}
            while p < len(value):
                col, p = _packed(value, p)
                exceptions[col], p = _packed(value, p)
            for j, i in enumerate(char_cols):
                charsets[i] = exceptions.get(j, default)
        elif kind == 3:  # COLUMN_CHARSET
            p = 0
            for i in char_cols:
                charsets[i], p = _packed(value, p)
        elif kind == 4:  # COLUMN_NAME
            p = 0
            for i in range(n):
                size, p = _packed(value, p)
                names[i] = value[p:p + size].decode("utf-8", "replace")
                p += size
        elif kind in (8, 9):  # SIMPLE_PRIMARY_KEY, PRIMARY_KEY_WITH_PREFIX
            p = 0
            while p < len(value):
                col, p = _packed(value, p)
                pk.add(col)
                if kind == 9:
                    _, p = _packed(value, p)
    cols = []
    for i, t in enumerate(types):
        ctype = _column_type(t, metas[i], unsigned[i], charsets[i])
        cs_id = charsets[i]
        cs = _CHARSETS.get(cs_id) if cs_id is not None and cs_id != 63 else None
        cols.append(ColumnInfo(
            name=names[i], data_type=ctype.split("(")[0].split()[0], column_type=ctype,
            nullable=bool(nulls[i // 8] & (1 << (i % 8))), key="PRI" if i in pk else "",
            charset=cs[0] if cs else None, collation=cs[1] if cs else None))
    return db, table, cols


class AnnouncedCatalog:
    """The tables the binlog has defined up to its end (:data:`Catalog`): the definition
    the converter records with every batch in the position map (the Table_map of each
    table's current version, as its last CREATE/ALTER TABLE says), so the answer matches
    :meth:`BinlogStore.end` and a table whose events were all purged is still known, as
    in MySQL. Data directories written before definitions were recorded fall back to the
    Table_map events in the live files (:class:`TableMapCatalog`)."""

    def __init__(self, store: BinlogStore) -> None:
        self._store = store
        self._fallback = TableMapCatalog(store)

    def __call__(self) -> dict[tuple[str, str], list[ColumnInfo]]:
        defs = self._store.writer_meta().get("tables")
        if not isinstance(defs, dict):
            return self._fallback()
        out: dict[tuple[str, str], list[ColumnInfo]] = {}
        for body in defs.values():
            db, table, cols = parse_table_map(bytes.fromhex(body))
            out[(db, table)] = cols
        return out


class TableMapCatalog:
    """The captured tables' columns as the binlog's latest Table_map of each says
    (:data:`Catalog`). Reads only what was appended since the last call; a table shows
    once a row of it was written."""

    def __init__(self, store: BinlogStore) -> None:
        self._store = store
        self._tables: dict[tuple[str, str], list[ColumnInfo]] = {}
        self._file = ""
        self._pos = 0

    def __call__(self) -> dict[tuple[str, str], list[ColumnInfo]]:
        for name, size in self._store.files():
            if name < self._file:
                continue
            start = self._pos if name == self._file else BIN_LOG_HEADER_SIZE
            if size <= start:
                self._file, self._pos = name, max(start, size)
                continue
            try:
                with self._store.path(name).open("rb") as f:
                    f.seek(start)
                    data = f.read(size - start)
            except OSError:
                continue  # purged meanwhile
            off = 0
            while off + HEADER_LEN <= len(data):
                (length,) = struct.unpack_from("<I", data, off + LEN_OFFSET)
                if length < HEADER_LEN or off + length > len(data):
                    break
                if data[off + TYPE_OFFSET] == 19:
                    try:
                        db, table, cols = parse_table_map(data[off + HEADER_LEN:off + length - 4])
                        self._tables[(db, table)] = cols
                    except (IndexError, KeyError, UnicodeDecodeError):
                        pass  # not ours to judge: the dump sends it as it is
                off += length
            self._file, self._pos = name, start + off
        return dict(self._tables)
