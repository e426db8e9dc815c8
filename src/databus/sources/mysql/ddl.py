"""DDL statements of the binlog: which tables a QUERY event changes, and how.

MariaDB/MySQL log DDL as statement text even in ROW format. :func:`parse_ddl`
recognises the statements that change a table's shape or contents (CREATE,
ALTER, DROP, RENAME, TRUNCATE, and CREATE/DROP INDEX, which ALTER the table)
and names the tables; anything else (GRANT, CREATE USER, views, routines...)
is not a table change and gives an empty list. Names are resolved against the
QUERY event's default database.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

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
