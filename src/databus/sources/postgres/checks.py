"""Start-up checks of a PostgreSQL server used as a logical decoding source.

Capture needs ``wal_level=logical``, a role with the REPLICATION attribute (or a
superuser), a publication covering every captured table, a replica identity on
each table that gives the rows of updates and deletes (DEFAULT with a primary
key, USING INDEX or FULL; NOTHING is refused), a free replication slot when the
slot has to be created, and the slot not held by another process. Each problem
is refused with one :class:`~databus.core.errors.ConfigError` of one line that
says what to run, before anything is captured. The facts come from
:class:`~databus.sources.postgres.connection.SqlSession`.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

from databus.core.errors import ConfigError
from databus.sources.postgres.connection import SqlSession, quote_ident


@dataclass(frozen=True)
class TableFacts:
    schema: str
    name: str
    replica_identity: str  # d, n, f, i
    has_pk: bool

    @property
    def full_name(self) -> str:
        return f"{self.schema}.{self.name}"

    @property
    def sql_name(self) -> str:
        return f"{quote_ident(self.schema)}.{quote_ident(self.name)}"


@dataclass(frozen=True)
class SlotFacts:
    plugin: str | None
    database: str | None
    active_pid: int | None
    confirmed_lsn: int | None


@dataclass(frozen=True)
class ServerFacts:
    version_num: int
    wal_level: str
    encoding: str
    max_slots: int
    used_slots: int
    user: str
    replication: bool  # REPLICATION attribute or superuser


def server_facts(session: SqlSession) -> ServerFacts:
    (row,) = session.query(
        "SELECT current_setting('server_version_num')::int, current_setting('wal_level'),"
        " current_setting('server_encoding'), current_setting('max_replication_slots')::int,"
        " (SELECT count(*) FROM pg_replication_slots)::int, current_user,"
        " (SELECT rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user)")
    return ServerFacts(int(row[0]), str(row[1]), str(row[2]), int(row[3]), int(row[4]),
                       str(row[5]), bool(row[6]))


def slot_facts(session: SqlSession, slot: str) -> SlotFacts | None:
    rows = session.query(
        "SELECT plugin, database, active_pid, (confirmed_flush_lsn - '0/0')::bigint"
        " FROM pg_replication_slots WHERE slot_name = %s", (slot,))
    if not rows:
        return None
    p, d, pid, lsn = rows[0]
    return SlotFacts(p, d, None if pid is None else int(pid), None if lsn is None else int(lsn))


def matching_tables(session: SqlSession, include: list[re.Pattern[str]],
                    exclude: list[re.Pattern[str]]) -> list[TableFacts]:
    """Ordinary and partitioned tables whose ``schema.table`` the regexes select."""
    rows = session.query(
        "SELECT n.nspname, c.relname, c.relreplident::text,"
        " EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary)"
        " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
        " WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition"
        " AND n.nspname NOT IN ('pg_catalog', 'information_schema')"
        " AND n.nspname NOT LIKE 'pg\\_toast%%' AND n.nspname NOT LIKE 'pg\\_temp\\_%%'"
        " ORDER BY 1, 2")
    out = []
    for schema, name, ident, pk in rows:
        full = f"{schema}.{name}"
        if any(p.fullmatch(full) for p in include) and not any(p.fullmatch(full)
                                                               for p in exclude):
            out.append(TableFacts(str(schema), str(name), str(ident), bool(pk)))
    return out


def check_server(facts: ServerFacts) -> None:
    """wal_level, encoding and the role's right to replicate."""
    if facts.wal_level != "logical":
        raise ConfigError(
            f"wal_level is {facts.wal_level}; logical decoding needs wal_level=logical:"
            " run ALTER SYSTEM SET wal_level = logical; and restart PostgreSQL")
    if facts.encoding.upper() not in ("UTF8", "SQL_ASCII"):
        raise ConfigError(f"the database encoding is {facts.encoding}; this source reads"
                          " UTF8 databases only")
    if not facts.replication:
        raise ConfigError(
            f"role {facts.user} may not replicate: run ALTER ROLE {quote_ident(facts.user)}"
            " REPLICATION; (and allow it replication connections in pg_hba.conf)")


def check_tables(tables: list[TableFacts], patterns: list[str]) -> None:
    """Some table is captured, and each has a replica identity that gives old rows."""
    if not tables:
        raise ConfigError(f"no table matches {patterns or ['.*']} (regexes on"
                          " 'schema.table', e.g. 'public\\..*')")
    for t in tables:
        if t.replica_identity == "n":
            raise ConfigError(
                f"table {t.full_name} has REPLICA IDENTITY NOTHING, so its updates and deletes"
                f" cannot be captured: run ALTER TABLE {t.sql_name} REPLICA IDENTITY DEFAULT;"
                " (with a primary key) or REPLICA IDENTITY FULL;")
        if t.replica_identity == "d" and not t.has_pk:
            raise ConfigError(
                f"table {t.full_name} has no primary key and REPLICA IDENTITY DEFAULT, so its"
                " updates and deletes cannot be captured: add a primary key or run ALTER TABLE"
                f" {t.sql_name} REPLICA IDENTITY FULL;")


def ensure_publication(session: SqlSession, name: str, tables: list[TableFacts], *,
                       create: bool) -> None:
    """The publication exists, publishes every kind of change and covers ``tables``;
    with ``create`` it is created or extended, else the statement to run is named."""
    rows = session.query(
        "SELECT puballtables, pubinsert, pubupdate, pubdelete, pubtruncate"
        " FROM pg_publication WHERE pubname = %s", (name,))
    table_list = ", ".join(t.sql_name for t in tables)
    if not rows:
        statement = f"CREATE PUBLICATION {quote_ident(name)} FOR TABLE {table_list}"
        if not create:
            raise ConfigError(f"publication {name} does not exist: run {statement}; (or set"
                              " create_publication: true)")
        session.query(statement)
        return
    alltables, *kinds = rows[0]
    if not all(kinds):
        raise ConfigError(
            f"publication {name} does not publish every kind of change: run ALTER PUBLICATION"
            f" {quote_ident(name)} SET (publish = 'insert, update, delete, truncate');")
    if alltables:
        return
    have = {(str(s), str(t)) for s, t in session.query(
        "SELECT schemaname, tablename FROM pg_publication_tables WHERE pubname = %s", (name,))}
    missing = [t for t in tables if (t.schema, t.name) not in have]
    if not missing:
        return
    statement = (f"ALTER PUBLICATION {quote_ident(name)} ADD TABLE "
                 + ", ".join(t.sql_name for t in missing))
    if not create:
        raise ConfigError(f"publication {name} does not cover"
                          f" {', '.join(t.full_name for t in missing)}: run {statement};"
                          " (or set create_publication: true)")
    session.query(statement)


def slot_holder(session: SqlSession, pid: int) -> str:
    """Who holds a slot: the application name and client address of server process
    ``pid`` ("" when it is gone or not visible to this role)."""
    rows = session.query("SELECT application_name, client_addr::text FROM pg_stat_activity"
                         " WHERE pid = %s", (pid,))
    if not rows:
        return ""
    name, addr = rows[0]
    return f"{name or '(no name)'} from {addr or 'a local socket'}"


def check_slot(session: SqlSession, slot: str, database: str, facts: ServerFacts,
               *, wait: float = 10.0, label: str = "") -> SlotFacts | None:
    """The slot's facts (None: it does not exist and one is free to create). A slot held
    by another relay (a process whose application name is not ``label``, this relay's)
    is refused at once, naming both; one held under this relay's own name (its killed
    predecessor's server process, which may take a moment to go) is waited for up to
    ``wait`` seconds, then refused."""
    deadline = time.monotonic() + wait
    while True:
        found = slot_facts(session, slot)
        if found is None:
            if facts.used_slots >= facts.max_slots:
                raise ConfigError(
                    f"no free replication slot for {slot}: all {facts.max_slots} are used;"
                    " raise max_replication_slots (restart) or drop an unused slot with"
                    " SELECT pg_drop_replication_slot('NAME');")
            return None
        if found.plugin != "pgoutput" or found.database != database:
            raise ConfigError(
                f"replication slot {slot} exists but is not a pgoutput slot of database"
                f" {database} (plugin {found.plugin}, database {found.database}): choose"
                " another slot name")
        if found.active_pid is None:
            return found
        holder = slot_holder(session, found.active_pid)
        ours = bool(label) and holder.startswith(f"{label} from ")
        if not ours or time.monotonic() >= deadline:
            raise ConfigError(
                f"replication slot {slot} is in use by another process (pid"
                f" {found.active_pid}: {holder or 'not visible to this role'}); this relay"
                f" is {label or '(unnamed)'}: two relays cannot share a slot: give each its"
                " own name (--name, name:) or slot (slot:)")
        time.sleep(0.2)


def check_legacy_slot(session: SqlSession, slot: str, legacy: str, database: str) -> None:
    """A relay with a derived name and no slot of its own (``slot``) must not start
    while an idle slot ``legacy`` (``databus_relay``: every relay's before names were
    derived) of its database exists: it may be this relay's, with its position, and
    left alone it holds WAL for ever. Refused with one line naming ``--name relay``."""
    if slot == legacy or slot_facts(session, slot) is not None:
        return
    old = slot_facts(session, legacy)
    if old is None or old.database != database or old.active_pid is not None:
        return  # none, another database's, or in use by a running relay
    raise ConfigError(
        f"replication slot {legacy} of database {database} is from before relays had their"
        f" own names and this relay's slot {slot} does not exist: if {legacy} is this"
        " relay's, start it with --name relay (name: relay) to keep its position; if no"
        f" relay uses it, drop it (SELECT pg_drop_replication_slot('{legacy}')): it holds"
        " WAL for ever; to start beside it, give this relay a name")
