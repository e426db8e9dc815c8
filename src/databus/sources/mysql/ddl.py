"""DDL statements of the binlog: which tables a QUERY event changes, and how.

MariaDB/MySQL log DDL as statement text even in ROW format. :func:`parse_ddl`
recognises the statements that change a table's shape or contents (CREATE,
ALTER, DROP, RENAME, TRUNCATE, and CREATE/DROP INDEX, which ALTER the table)
and names the tables; anything else (GRANT, CREATE USER, views, routines...)
is not a table change and gives an empty list. Names are resolved against the
QUERY event's default database.

What the source sends for one (:func:`ddl_events`): an event of the logical source
:data:`~databus.core.schema.SCHEMA_CHANGES` per captured table the statement changes
(the statement, kind and table), and a truncate event (op ``t``) on the table itself
for TRUNCATE; :func:`touches` says whether a snapshot chunk read before the statement
must be read again.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass

from databus.core import event as ev
from databus.core.schema import (
    SCHEMA_CHANGES,
    ColumnSpec,
    SchemaRegistry,
    TableSchema,
    table_schema,
)
from databus.sources.common.names import source_id

CREATE, ALTER, DROP, RENAME, TRUNCATE = "CREATE", "ALTER", "DROP", "RENAME", "TRUNCATE"

_COMMENT = re.compile(r"/\*.*?\*/|--[^\n]*|#[^\n]*", re.S)
_NAME = r"(?:`(?:[^`]|``)+`|[A-Za-z0-9_$\u0080-\uffff]+)"
_QNAME = rf"{_NAME}(?:\s*\.\s*{_NAME})?"
_IF_EXISTS = r"(?:IF\s+(?:NOT\s+)?EXISTS\s+)?"

_PATTERNS = [
    (CREATE, re.compile(rf"CREATE\s+(?:OR\s+REPLACE\s+)?TABLE\s+{_IF_EXISTS}({_QNAME})", re.I)),
    (ALTER, re.compile(rf"ALTER\s+(?:ONLINE\s+)?(?:IGNORE\s+)?TABLE\s+{_IF_EXISTS}({_QNAME})",
                       re.I)),
    (DROP, re.compile(rf"DROP\s+TABLES?\s+{_IF_EXISTS}((?:{_QNAME}\s*,\s*)*{_QNAME})", re.I)),
    (RENAME, re.compile(rf"RENAME\s+TABLES?\s+{_IF_EXISTS}(.+)$", re.I | re.S)),
    (TRUNCATE, re.compile(rf"TRUNCATE\s+(?:TABLE\s+)?({_QNAME})", re.I)),
    (ALTER, re.compile(rf"(?:CREATE|DROP)\s+(?:OR\s+REPLACE\s+)?(?:ONLINE\s+|OFFLINE\s+)?"
                       rf"(?:UNIQUE\s+|FULLTEXT\s+|SPATIAL\s+)?INDEX\s+{_IF_EXISTS}{_NAME}"
                       rf"(?:\s+USING\s+\w+)?\s+ON\s+({_QNAME})", re.I)),
]
_ALTER_RENAME = re.compile(rf"\bRENAME\s+(?:TO\s+|AS\s+)?({_QNAME})\s*$", re.I)


@dataclass(frozen=True, slots=True)
class TableChange:
    """One table touched by a DDL statement. ``new_*`` are set by renames."""

    kind: str
    db: str
    table: str
    new_db: str | None = None
    new_table: str | None = None

    @property
    def name(self) -> str:
        return f"{self.db}.{self.table}"

    @property
    def new_name(self) -> str | None:
        return f"{self.new_db}.{self.new_table}" if self.new_table is not None else None


def _unquote(name: str) -> str:
    name = name.strip()
    if name.startswith("`") and name.endswith("`"):
        return name[1:-1].replace("``", "`")
    return name


def _split_name(qname: str, default_db: str) -> tuple[str, str]:
    parts = re.findall(_NAME, qname)
    if len(parts) == 2:
        return _unquote(parts[0]), _unquote(parts[1])
    return default_db, _unquote(parts[0])


def parse_ddl(default_db: str, sql: str) -> list[TableChange]:
    """The table changes of one statement (empty when it is not a table DDL)."""
    text = _COMMENT.sub(" ", sql).strip().rstrip(";")
    for kind, pattern in _PATTERNS:
        m = pattern.match(text)
        if m is None:
            continue
        if kind == DROP:
            names = [n for n in re.findall(_QNAME, m.group(1))]
            return [TableChange(DROP, *_split_name(n, default_db)) for n in names]
        if kind == RENAME:
            out = []
            for pair in re.split(r",(?=(?:[^`]|`[^`]*`)*$)", m.group(1)):
                sides = re.split(r"\s+TO\s+", pair.strip(), maxsplit=1, flags=re.I)
                if len(sides) != 2:
                    continue
                db, table = _split_name(sides[0], default_db)
                new_db, new_table = _split_name(sides[1].split()[0] if sides[1] else sides[1],
                                                default_db)
                out.append(TableChange(RENAME, db, table, new_db, new_table))
            return out
        db, table = _split_name(m.group(1), default_db)
        if kind == ALTER:
            r = _ALTER_RENAME.search(text)
            if r is not None:
                new_db, new_table = _split_name(r.group(1), default_db)
                return [TableChange(RENAME, db, table, new_db, new_table)]
        return [TableChange(kind, db, table)]
    return []


SCHEMA_CHANGE_SCHEMA = TableSchema(source_id(SCHEMA_CHANGES), SCHEMA_CHANGES, 1, table_schema(
    "databus", "schema_changes", [
        ColumnSpec("db", "string", nullable=False),
        ColumnSpec("table", "string", nullable=False),
        ColumnSpec("kind", "string", nullable=False), ColumnSpec("ddl", "string", nullable=False),
        ColumnSpec("new_db", "string"), ColumnSpec("new_table", "string")]), ("db", "table"))
"""The one version of :data:`~databus.core.schema.SCHEMA_CHANGES`, keyed by db and table."""


def ddl_events(db: str, sql: str, wanted: Callable[[str], bool], registry: SchemaRegistry,
               scn: int, ts_ns: int) -> list[bytes]:
    """The events of one DDL statement for the tables ``wanted`` (module docstring); none
    when it changes no captured table. ``registry``: the source's, for the latest
    version of a truncated table."""
    s = SCHEMA_CHANGE_SCHEMA
    events = []
    for c in parse_ddl(db, sql):
        if not (wanted(c.name) or (c.new_name and wanted(c.new_name))):
            continue
        row = {"db": c.db, "table": c.table, "kind": c.kind, "ddl": sql,
               "new_db": c.new_db, "new_table": c.new_table}
        key = json.dumps([c.db, c.table], ensure_ascii=False, separators=(",", ":")).encode()
        events.append(ev.encode(scn=scn, src_id=s.src_id, key=key, payload=s.encode(row),
                                schema_id=s.id, schema_version=s.version, op=ev.Op.INSERT,
                                timestamp_ns=ts_ns))
        src = source_id(c.name)
        if c.kind == TRUNCATE and src in registry.source_ids():
            latest = registry.latest(src)
            events.append(ev.encode(scn=scn, src_id=src, key=0, payload=b"",
                                    schema_id=latest.id, schema_version=latest.version,
                                    op=ev.Op.TRUNCATE, timestamp_ns=ts_ns))
    return events


def touched(db: str, sql: str) -> set[str] | None:
    """The ``db.table`` names a statement may change (renames: both names); None when it
    is no table change as :func:`parse_ddl` reads it (then any table may be)."""
    changes = parse_ddl(db, sql)
    if not changes:
        return None
    return {n for c in changes for n in (c.name, c.new_name) if n}


def touches(table: str, names: set[str] | None, sql: str) -> bool:
    """Whether a statement with :func:`touched` ``names`` may have changed ``table``:
    named, or (no table change as parsed) its bare name appears in the text."""
    if names is not None:
        return table in names
    bare = re.escape(table.partition(".")[2])
    return re.search(rf"(?<![\w$]){bare}(?![\w$])", sql, re.I) is not None
