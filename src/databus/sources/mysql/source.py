"""MariaDB/MySQL binlog source: the relay's fetcher for a server read as a replica.

Guarantees (the :class:`~databus.sources.base.Source` contract, made concrete):

* **SCN** = ``(binlog file number << 32) | position after the transaction's
  commit event``. Restarting after an SCN resumes the dump at that file and
  position: the first event after that transaction. Nothing is replayed twice
  and nothing skipped; a purged position raises
  :class:`~databus.core.errors.SourcePositionLostError`.
* **Window** = one transaction (multi-table transactions stay one window); a
  DDL statement is a window of its own. Events carry the binlog timestamp.
* **Source ids** are stable: CRC-32 of ``db.table`` masked to 31 bits.
* **Schemas**: one Avro schema per table shape; its version number counts the
  shapes of that table. With ``state_dir`` the versions are kept in a schema
  history file (written atomically), so numbers and ids survive restarts and
  a restarted relay still serves the schemas of the events it holds.
* **DDL** (CREATE/ALTER/DROP/RENAME/TRUNCATE of a captured table) gives an
  event of the logical source :data:`SCHEMA_CHANGES` (the statement, kind and
  table); TRUNCATE also gives a truncate event (op ``t``) on the table itself.
  Rows before and after an ALTER decode with their own table version because
  every rows event is decoded with the table map logged right before it.
* **Filters**: tables by regexes on ``db.table`` (include, then exclude);
  columns by regexes on ``db.table.column`` (include, then exclude); key
  columns are always kept.
* ``after_scn = -1`` starts at the server's current binlog end, or right after
  ``start_gtid`` (MariaDB GTID state) when given; later restarts use the SCN.

Rows are encoded by a codec compiled per table shape (:mod:`.fastpath`) and,
where that codec does not apply, by the Python decoder (:mod:`.rows`); both
give the same bytes.
"""

from __future__ import annotations

import datetime as dt
import decimal
import json
import logging
import re
import threading
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from databus.core import event as ev
from databus.core.atomic import write_atomic
from databus.core.errors import (
    ConfigError,
    CorruptEventError,
    DatabusError,
    SchemaError,
    SourceUnavailableError,
)
from databus.core.schema import (
    SCHEMA_CHANGES,
    ColumnSpec,
    MetadataCodec,
    SchemaRegistry,
    TableSchema,
    table_schema,
)
from databus.sources.base import Source, SourceInfo, Window
from databus.sources.mysql import ddl as dd
from databus.sources.mysql import events as be
from databus.sources.mysql import fastpath
from databus.sources.mysql import rows as br
from databus.sources.mysql.checks import check_server, parse_mysql_url
from databus.sources.mysql.connection import BinlogStream, collations, master_status, server_facts

log = logging.getLogger("databus.sources.mysql")

_OPS = {30: ev.Op.INSERT, 23: ev.Op.INSERT, 31: ev.Op.UPDATE, 24: ev.Op.UPDATE,
        32: ev.Op.DELETE, 25: ev.Op.DELETE}

SCHEMA_CHANGE_AVRO = table_schema("databus", "schema_changes", [
    ColumnSpec("db", "string", nullable=False), ColumnSpec("table", "string", nullable=False),
    ColumnSpec("kind", "string", nullable=False), ColumnSpec("ddl", "string", nullable=False),
    ColumnSpec("new_db", "string"), ColumnSpec("new_table", "string")])


def _regexes(patterns: Sequence[str]) -> list[re.Pattern[str]]:
    try:
        return [re.compile(p) for p in patterns]
    except re.error as exc:
        raise ConfigError(f"bad table/column regex: {exc}") from exc


def source_id(name: str) -> int:
    return zlib.crc32(name.encode()) & 0x7FFFFFFF


def _avro_type(td: br.TableDef, i: int) -> Any:
    t, m = td.real_types[i], td.meta[i]
    if t in (br.T_TINY, br.T_SHORT, br.T_INT24, br.T_LONG, br.T_YEAR):
        return "long"
    if t == br.T_LONGLONG or (t == br.T_BIT and (m & 0xFF) >= 8):
        if td.unsigned[i] or t == br.T_BIT:  # 64-bit unsigned does not fit a long
            return {"type": "bytes", "logicalType": "decimal", "precision": 20, "scale": 0}
        return "long"
    if t == br.T_BIT:
        return "long"
    if t == br.T_FLOAT:
        return "float"
    if t == br.T_DOUBLE:
        return "double"
    if t == br.T_NEWDECIMAL:
        return {"type": "bytes", "logicalType": "decimal", "precision": m >> 8,
                "scale": m & 0xFF}
    if t == br.T_DATE:
        return {"type": "int", "logicalType": "date"}
    if t == br.T_TIME2:
        return "long"  # microseconds, may be negative or beyond 24 h
    if t == br.T_DATETIME2:
        return {"type": "long", "logicalType": "local-timestamp-micros"}
    if t == br.T_TIMESTAMP2:
        return {"type": "long", "logicalType": "timestamp-micros"}
    if t in (br.T_ENUM, br.T_SET, br.T_JSON):
        return "string"
    if t in (br.T_VARCHAR, br.T_VAR_STRING, br.T_STRING, br.T_BLOB):
        return "bytes" if td.codecs and td.codecs[i] == br.CODEC_BINARY else "string"
    return "bytes"


def _avro_value(v: Any, avro: Any) -> Any:
    if v is None:
        return None
    if isinstance(v, dt.timedelta):
        return v // dt.timedelta(microseconds=1)
    if isinstance(avro, dict) and avro.get("logicalType") == "decimal" and isinstance(v, int):
        return decimal.Decimal(v)
    if avro == "string" and isinstance(v, bytes):
        return v.decode("utf-8")
    if avro == "bytes" and isinstance(v, str):
        return v.encode("utf-8")
    return v


def _key_json(v: Any) -> Any:
    if v is None or isinstance(v, (int, str)):
        return v
    if isinstance(v, bytes):
        return {"hex": v.hex()}
    if isinstance(v, (dt.date, dt.datetime)):
        return v.isoformat()
    return str(v)


# --- hand-made Avro for the metadata part (both codecs share it) --------------

def _zz(n: int) -> bytes:
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _u_str(s: str | None) -> bytes:
    if s is None:
        return b"\x00"
    raw = s.encode("utf-8")
    return b"\x02" + _zz(len(raw)) + raw


def _u_long(v: int | None) -> bytes:
    return b"\x00" if v is None else b"\x02" + _zz(v)


def meta_middle(txid: str | None, file: str, pos: int, gtid: str | None, server_id: int) -> bytes:
    """Avro of the metadata fields between ``before`` and ``row`` (METADATA_SCHEMA order)."""
    return _u_str(txid) + _u_str(file) + _u_long(pos) + _u_str(gtid) + _u_long(server_id)


class _Version:
    """One Avro version of one table (what the events say)."""

    def __init__(self, schema: TableSchema) -> None:
        self.schema = schema
        self.types = [f["type"][1] for f in schema.avro["fields"]]
        self.fields = [f["name"] for f in schema.avro["fields"]]


class _Shape:
    """One table-map shape: how to decode its rows into one :class:`_Version`."""

    def __init__(self, td: br.TableDef, version: _Version, keep: list[bool], meta_id: bytes,
                 fast: bool) -> None:
        self.td = td
        self.version = version
        self.keep = keep
        self.name = f"{td.schema}.{td.table}"
        self.mode = br.key_mode(td)
        s = version.schema
        self.codec = fastpath.compile_codec(td, src_id=s.src_id, schema_id=s.id,
                                            schema_version=s.version, meta_id=meta_id,
                                            keep=keep) if fast else None

    def encode(self, etype: int, body: memoryview, scn: int, ts_ns: int, meta_mid: bytes,
               row_index: int) -> tuple[bytes, int]:
        if self.codec is not None:
            try:
                data, n = self.codec.encode(body, etype, scn, ts_ns, meta_mid, row_index,
                                            self.name)
            except ValueError as exc:
                raise CorruptEventError(f"cannot decode a rows event of {self.name}: {exc}"
                                        ) from exc
            return data, n
        return self._encode_py(etype, body, scn, ts_ns, meta_mid, row_index)

    def _row(self, values: list[Any]) -> dict[str, Any]:
        v = self.version
        kept = [x for x, k in zip(values, self.keep, strict=True) if k]
        return {f: _avro_value(x, a) for f, x, a in zip(v.fields, kept, v.types, strict=True)}

    def _key(self, values: list[Any], index: int) -> int | bytes:
        if self.mode == br.KEY_ROWINDEX:
            return index
        kv = [values[i] for i in self.td.primary_key]
        if self.mode == br.KEY_INT and isinstance(kv[0], int):
            return kv[0]
        return json.dumps([_key_json(x) for x in kv], ensure_ascii=False,
                          separators=(",", ":")).encode()

    def _encode_py(self, etype: int, body: memoryview, scn: int, ts_ns: int, meta_mid: bytes,
                   row_index: int) -> tuple[bytes, int]:
        s = self.version.schema
        out = []
        for n, (before, after) in enumerate(br.decode_rows(self.td, etype, body)):
            image = after if after is not None else before
            assert image is not None
            index = row_index + n
            meta = b"\x00"
            if before is not None and after is not None:
                raw = s.encode(self._row(before))
                meta = b"\x02" + _zz(len(raw)) + raw
            out.append(ev.encode(
                scn=scn, src_id=s.src_id, key=self._key(image, index),
                payload=s.encode(self._row(image)), schema_id=s.id, schema_version=s.version,
                op=_OPS[etype], timestamp_ns=ts_ns, metadata=meta + meta_mid + _u_long(index),
                metadata_schema_id=MetadataCodec.ID))
        return b"".join(out), len(out)


@dataclass
class _Pending:
    """A rows event waiting for its transaction's commit (encoded with the SCN)."""

    shape: _Shape
    etype: int
    body: memoryview
    meta_mid: bytes


class MysqlSource(Source):
    """Captures tables matching ``tables`` (regexes on ``db.table``); see the module doc."""

    def __init__(self, url: str, tables: Sequence[str], *,
                 exclude_tables: Sequence[str] = (), include_columns: Sequence[str] = (),
                 exclude_columns: Sequence[str] = (), server_id: int = 1_000_001,
                 heartbeat: float = 1.0, state_dir: Path | None = None,
                 name: str = "relay", compiled: bool = True,
                 start_gtid: str | None = None) -> None:
        self.url = parse_mysql_url(url)
        check_server(server_facts(self.url))
        self._include = _regexes(tables or [".*"])
        self._exclude = _regexes(exclude_tables)
        self._col_include = _regexes(include_columns)
        self._col_exclude = _regexes(exclude_columns)
        self.server_id = server_id
        self.heartbeat = heartbeat
        self.start_gtid = start_gtid
        self.compiled = compiled and fastpath.available()
        if compiled and not self.compiled:
            log.warning("the compiled row codec is not built; using the slower Python decoder")
        self._collations = collations(self.url)
        self._registry = SchemaRegistry()
        self._history = state_dir / f"{name}.mysql-schemas.json" if state_dir else None
        self._versions: dict[bytes, _Version] = {}  # by schema id
        self._shapes: dict[bytes, _Shape] = {}  # by table map body (without table id)
        self._by_src: dict[int, SourceInfo] = {}
        self._ddl_version = self._ddl_schema()
        self._load_history()
        self._stream: BinlogStream | None = None
        self._stream_scn = -2
        self._file = ""
        self._base = ""
        self._reset_txn()

    # -- schemas -----------------------------------------------------------------

    def _ddl_schema(self) -> _Version:
        schema = TableSchema(source_id(SCHEMA_CHANGES), SCHEMA_CHANGES, 1, SCHEMA_CHANGE_AVRO,
                             ("db", "table"))
        self._registry.add(schema)
        self._by_src[schema.src_id] = SourceInfo(schema.src_id, SCHEMA_CHANGES)
        return _Version(schema)

    def _load_history(self) -> None:
        if self._history is None or not self._history.exists():
            return
        try:
            saved = SchemaRegistry.from_json(self._history.read_bytes())
        except (OSError, SchemaError) as exc:
            raise SchemaError(f"schema history {self._history} is unreadable: {exc}") from exc
        for src in saved.source_ids():
            for s in saved.versions(src):
                self._add_version(s, save=False)

    def _add_version(self, schema: TableSchema, *, save: bool = True) -> _Version:
        version = _Version(schema)
        self._versions[schema.id] = version
        self._registry.add(schema)
        self._by_src[schema.src_id] = SourceInfo(schema.src_id, schema.name)
        if save and self._history is not None:
            write_atomic(self._history, self._registry.to_json().encode())
        return version

    def _keep(self, td: br.TableDef) -> list[bool]:
        names = td.names or [f"col{i}" for i in range(len(td.types))]
        out = []
        for i, n in enumerate(names):
            full = f"{td.schema}.{td.table}.{n}"
            keep = (not self._col_include or any(p.fullmatch(full) for p in self._col_include))
            keep = keep and not any(p.fullmatch(full) for p in self._col_exclude)
            out.append(keep or i in td.primary_key)
        return out

    def _shape(self, table_map: bytes, td: br.TableDef) -> _Shape:
        shape = self._shapes.get(table_map)
        if shape is not None:
            return shape
        name = f"{td.schema}.{td.table}"
        src = source_id(name)
        keep = self._keep(td)
        names = td.names or [f"col{i}" for i in range(len(td.types))]
        specs = [ColumnSpec(n, _avro_type(td, i), nullable=True)
                 for i, n in enumerate(names) if keep[i]]
        keys = tuple(names[i] for i in td.primary_key)
        avro = table_schema(td.schema, td.table, specs)
        known = self._registry.versions(src) if src in self._registry.source_ids() else []
        probe = TableSchema(src, name, 0, avro, keys)
        version = next((self._versions[s.id] for s in known
                        if s.id == probe.id and s.key_columns == keys), None)
        if version is None:
            number = max((s.version for s in known), default=0) + 1
            version = self._add_version(TableSchema(src, name, number, avro, keys))
        shape = _Shape(td, version, keep, MetadataCodec.ID, self.compiled)
        self._shapes[table_map] = shape
        return shape

    def _wanted(self, name: str) -> bool:
        return (any(p.fullmatch(name) for p in self._include)
                and not any(p.fullmatch(name) for p in self._exclude))

    def sources(self) -> list[SourceInfo]:
        return sorted(self._by_src.values(), key=lambda s: s.id)

    def registry(self) -> SchemaRegistry:
        return self._registry

    # -- the stream --------------------------------------------------------------

    def _reset_txn(self) -> None:
        self._maps: dict[int, tuple[bytes, br.TableDef]] = {}
        self._pending: list[_Pending] = []
        self._gtid: str | None = None

    def _open(self, after_scn: int) -> None:
        if self._stream is not None:
            self._stream.close()
        gtid = None
        if after_scn < 0:
            file, pos = master_status(self.url)
            gtid = self.start_gtid  # a new relay may start at a GTID instead of the end
        else:
            file, pos = self._file_name(after_scn >> 32), after_scn & 0xFFFFFFFF
        self._base = file.rsplit(".", 1)[0]
        self._file = file  # with a GTID start, the server's first ROTATE names the file
        self._stream = BinlogStream(self.url, server_id=self.server_id, file=file, pos=pos,
                                    heartbeat=self.heartbeat, read_timeout=self.heartbeat * 5,
                                    gtid=gtid)
        self._stream_scn = after_scn
        self._reset_txn()

    def _file_name(self, number: int) -> str:
        base = self._base or master_status(self.url)[0].rsplit(".", 1)[0]
        return f"{base}.{number:06d}"

    def _scn(self, pos: int) -> int:
        return (int(self._file.rsplit(".", 1)[1]) << 32) | pos

    def read(self, after_scn: int, stop: threading.Event, timeout: float) -> list[Window]:
        try:
            return self._read(after_scn, stop, timeout)
        except DatabusError:
            # the next read reopens the dump at the relay's position (a partly
            # read transaction is dropped and read again whole)
            self.close()
            raise

    def _read(self, after_scn: int, stop: threading.Event, timeout: float) -> list[Window]:
        if self._stream is None or after_scn != self._stream_scn:
            self._open(after_scn)
        assert self._stream is not None
        deadline = time.monotonic() + timeout
        out: list[Window] = []
        # a burst of small transactions goes to the buffer in one call; the
        # first window already waits for nothing more than what is there
        while not stop.is_set() and len(out) < 64:
            raw = self._stream.read()
            if raw is None:
                raise SourceUnavailableError("the server ended the binlog stream")
            window = self._event(raw)
            if window is not None:
                self._stream_scn = window.scn
                out.append(window)
                if not self._stream.pending():
                    break
            elif time.monotonic() >= deadline:
                break
        return out

    def _event(self, raw: bytes) -> Window | None:
        assert self._stream is not None
        h, body = be.parse_header(raw, self._stream.checksum)
        t = h.type
        if t in be.ROW_EVENTS:
            entry = self._maps.get(int.from_bytes(body[0:6], "little"))
            if entry is not None:
                shape = self._shape(*entry)
                self._pending.append(_Pending(
                    shape, t, body, meta_middle(self._gtid, self._file, h.next_pos, self._gtid,
                                                h.server_id)))
        elif t == be.EventType.TABLE_MAP:
            td = br.parse_table_def(body, self._collations)
            if self._wanted(f"{td.schema}.{td.table}"):
                self._maps[td.table_id] = (bytes(body[6:]), td)
        elif t == be.EventType.XID:
            return self._commit(h)
        elif t == be.EventType.MARIADB_GTID:
            self._reset_txn()
            self._gtid = be.parse_mariadb_gtid(body).text(h.server_id)
        elif t == be.EventType.QUERY:
            db, sql = be.parse_query(body)
            word = sql.lstrip()[:8].upper()
            if word.startswith("COMMIT"):
                return self._commit(h)
            if sql.strip().upper() == "ROLLBACK":  # non-transactional tables rolled back
                self._reset_txn()
            elif not word.startswith(("BEGIN", "SAVEPOIN", "ROLLBACK", "XA ")):
                return self._ddl(h, db, sql)
        elif t == be.EventType.ROTATE:
            self._file = be.parse_rotate(body).file
        return None

    def _commit(self, h: be.EventHeader) -> Window | None:
        pending = self._pending
        self._reset_txn()
        if not pending:
            return None
        scn = self._scn(h.next_pos)
        ts_ns = h.timestamp * 1_000_000_000
        parts = []
        rows = 0
        for p in pending:
            data, n = p.shape.encode(p.etype, p.body, scn, ts_ns, p.meta_mid, rows)
            parts.append(data)
            rows += n
        if not rows:
            return None
        return Window(scn, b"".join(parts), rows, ts_ns)

    def _ddl(self, h: be.EventHeader, db: str, sql: str) -> Window | None:
        """A DDL statement: schema change events (+ truncate events) as one window."""
        changes = [c for c in dd.parse_ddl(db, sql)
                   if self._wanted(c.name) or (c.new_name and self._wanted(c.new_name))]
        if not changes:
            return None
        self._reset_txn()
        scn = self._scn(h.next_pos)
        ts_ns = h.timestamp * 1_000_000_000
        s = self._ddl_version.schema
        events = []
        for c in changes:
            row = {"db": c.db, "table": c.table, "kind": c.kind, "ddl": sql,
                   "new_db": c.new_db, "new_table": c.new_table}
            key = json.dumps([c.db, c.table], ensure_ascii=False, separators=(",", ":")).encode()
            events.append(ev.encode(scn=scn, src_id=s.src_id, key=key, payload=s.encode(row),
                                    schema_id=s.id, schema_version=s.version, op=ev.Op.INSERT,
                                    timestamp_ns=ts_ns))
            src = source_id(c.name)
            if c.kind == dd.TRUNCATE and src in self._registry.source_ids():
                latest = self._registry.latest(src)
                events.append(ev.encode(scn=scn, src_id=src, key=0, payload=b"",
                                        schema_id=latest.id, schema_version=latest.version,
                                        op=ev.Op.TRUNCATE, timestamp_ns=ts_ns))
        return Window(scn, b"".join(events), len(events), ts_ns)

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None
